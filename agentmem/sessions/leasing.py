"""Serving a session under its lease, and the shared invalidation epoch, as the session manager uses them.

A part the :class:`~agentmem.sessions.manager.SessionManager` holds, over :class:`~agentmem.sessions.shared.Leases`:
take the lease before a turn (a newer cold copy written by another worker meanwhile wins over ours), renew it
while the KV stays in memory, drop this worker's copy if the lease went elsewhere, release it when cold.

Example:
    >>> from agentmem.sessions.shared import worker_id     # registry, store: mem.sessions' registry and cold store
    >>> chat = mem.session("s1", user_id="u1")
    >>> _ = chat.send("Hello.", max_new_tokens=1)           # mem's worker holds chat's lease while its KV is hot
    >>> other = Leasing(registry, Leases(store, worker_id(), ttl_s=30, wait_s=0.1))   # a second worker's
    >>> with chat.slot.lock:                                # serve's caller holds the session's lock
    ...     other.serve(chat)
    Traceback (most recent call last):
    agentmem.errors.SessionBusyError: ...
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from agentmem.sessions.registry import Registry
from agentmem.sessions.shared import Leases, load_epoch

if TYPE_CHECKING:
    from agentmem.sessions.session import Session

__all__ = ["Leasing"]

log = logging.getLogger(__name__)


class Leasing:
    """Lease handling per session (caller holds the session's lock)."""

    def __init__(self, registry: Registry, leases: Leases) -> None:
        self._reg = registry
        self.store = registry.store
        self.leases = leases

    @property
    def epoch(self) -> str:
        """The current epoch, read from the store each time: another worker's invalidation counts here too."""
        return load_epoch(self.store)

    def serve(self, s: Session) -> None:
        """Hold ``s``'s lease before serving it (waits, or raises SessionBusyError); caller holds ``s.slot.lock``.

        If the lease had lapsed, another worker may have served the session meanwhile: a newer cold copy than
        the one in memory wins (ours is dropped, and restored from the store by the turn).
        """
        held = s.slot.lease_until > time.monotonic()
        until = self.leases.take(s.slot.key)
        if not held:
            stamp = self.store.last_used(s.slot.key)
            mine = s.slot.state.last_used if s.slot.state is not None else None
            if stamp is not None and (mine is None or stamp > mine + 1e-3):
                self._forget_copy(s)
                s.slot.tier, s.slot.last_used = "cold", stamp
        s.slot.lease_until = until

    def keep(self, s: Session, *, early: bool = False) -> bool:
        """Renew ``s``'s lease if it is in this worker's memory; False (and our copy dropped) if it was lost.

        ``early`` (the sweep): skip the store while more than two thirds of the lease are left.
        """
        if s.slot.lease_until <= 0:
            return True  # nothing in memory here that needs it
        if early and s.slot.lease_until - time.monotonic() > self.leases.ttl_s * 2 / 3:
            return True
        until = self.leases.renew(s.slot.key)
        if until is not None:
            s.slot.lease_until = until
            return True
        log.warning("session %s: its lease went to another worker; dropping this worker's copy", s.slot.key)
        self._forget_copy(s)
        s.slot.tier = "cold" if self.store.last_used(s.slot.key) is not None else None
        return False

    def _forget_copy(self, s: Session) -> None:
        """Drop this worker's in-memory copy of ``s``, leaving the store's copy alone."""
        s.slot.disk_version = None  # so drop_kv does not delete the store's (another worker's) copy
        self._reg.drop_kv(s)
        s.slot.state, s.slot.tier, s.slot.lease_until = None, None, 0.0

    def release(self, s: Session) -> None:
        """Give up ``s``'s lease (its KV left this worker's memory)."""
        if s.slot.lease_until > 0:
            s.slot.lease_until = 0.0
            self.leases.release(s.slot.key)
