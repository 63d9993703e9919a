"""The session manager's shared bookkeeping, the one object its parts (tier moves, leasing, the worker) are given.

Which sessions are open (by user and session id, and by cold-store key), the hot / warm / cold tiers, the counters,
the queue of clean disk copies to write ahead (write-behind), and the one lock guarding them. The lock only guards
this bookkeeping: it is never held across a model call or a disk write.

Example:
    >>> reg = Registry(hot, warm, cold, store)        # mem.sessions' tiers and cold store
    >>> reg.count("turns"); reg.counts["turns"], reg.open_sessions()
    (1, [])
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING

from agentmem.ports.sessions import SessionTierStore
from agentmem.sessions.holds import WorkerHolds
from agentmem.sessions.tiers import Tier

if TYPE_CHECKING:
    from agentmem.sessions.session import Session

__all__ = ["Registry"]


class Registry:
    """Open sessions, the tiers their KV sits in, counters, write-behind queue; guarded by ``lock``."""

    def __init__(self, hot: Tier, warm: Tier, cold: Tier, store: SessionTierStore) -> None:
        self.lock = threading.RLock()
        self.sessions: dict[tuple[str, str], Session] = {}  # (user_id, session_id): ids are per user
        self.by_key: dict[str, Session] = {}
        self.hot, self.warm, self.cold = hot, warm, cold
        self.store = store
        self.counts: Counter[str] = Counter()
        self.holds = WorkerHolds()  # sessions the worker holds right now: a turn making room waits for those
        self.write_behind: set[str] = set()  # keys of sessions the worker should write a clean disk copy of
        self.wake = threading.Event()  # wakes the worker early (write-behind queued, closing)

    def open_sessions(self) -> list[Session]:
        """A snapshot of every registered session."""
        with self.lock:
            return list(self.sessions.values())

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``name`` (``stats()``)."""
        with self.lock:
            self.counts[name] += n

    def bump(self, tier: Tier, field: str) -> None:
        """Add one to ``tier``'s counter ``field`` (hits, misses)."""
        with self.lock:
            setattr(tier.counters, field, getattr(tier.counters, field) + 1)

    def drop_kv(self, s: Session) -> bool:
        """Forget ``s``'s KV in memory (its transcript and validity key stay); True if there was any.

        Caller holds ``s.slot.lock``. A current disk copy of a hot or warm session is deleted too (a file exists
        only while it is current).
        """
        had = False
        for tier in (self.hot, self.warm):
            if tier.backend.pop(s.slot.key) is not None:
                had = True
            with self.lock:
                tier.policy.remove(s.slot.key)
        if s.slot.state is not None:
            s.slot.state.kv_len = 0
        if s.slot.tier in ("hot", "warm"):
            s.slot.tier = None
            if s.slot.disk_version is not None:
                self.store.delete(s.slot.key)
        s.slot.version += 1
        s.slot.disk_version = None
        return had
