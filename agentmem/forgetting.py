"""Forgetting: entries erased from every copy (row, vectors, KV blob, the conversations' working KV), the erasure
audited, and the in-process listeners told (:mod:`agentmem.erasure`). The facade checks the arguments first.

Example:
    >>> from agentmem.security import AuditLog    # store: an AgentMemory's EntryStore holding two entries of u1
    >>> forgetting = Forgetting(store, audit=AuditLog(mem.path / "audit.jsonl"), erasures=ErasureListeners(),
    ...                         sessions=SessionHooks(end=lambda s, u: None, end_user=lambda u: None,
    ...                                               sweep=lambda: None))
    >>> forgetting.scope(user_id="u1", session_id=None, tags=[]), mem.list(user_id="u1")
    (2, [])
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentmem.erasure import Erasure, ErasureListeners
from agentmem.ports.catalog import CatalogScope

if TYPE_CHECKING:
    from agentmem.entries.store import EntryStore
    from agentmem.security import AuditLog

log = logging.getLogger("agentmem")


@dataclass(frozen=True)
class SessionHooks:
    """What an erasure does to the conversations' working KV (the facade's session manager, opened only if the
    store has sessions): ``end(session_id, user_id)`` drops one conversation's cache, ``end_user(user_id)`` all of a
    user's, ``sweep()`` expires the sessions past their TTL."""

    end: Callable[[str, str | None], None]
    end_user: Callable[[str], None]
    sweep: Callable[[], None]


class Forgetting:
    """Erase entries of one store by id, by scope or by expiry; each returns how many entries went."""

    def __init__(self, store: EntryStore, *, audit: AuditLog, erasures: ErasureListeners,
                 sessions: SessionHooks) -> None:
        self._store, self._audit, self._erasures, self._sessions = store, audit, erasures, sessions
        self._catalog = store.catalog

    def entry(self, entry_id: str, *, user_id: str | None) -> int:
        """Erase ``entry_id`` if it exists and (with ``user_id``) belongs to that user.

        Example:
            >>> forgetting.entry(rec.id, user_id="someone-else"), forgetting.entry(rec.id, user_id="u1")
            (0, 1)
        """
        owned = [r.id for r in self._catalog.get([entry_id]) if user_id is None or r.user_id == user_id]
        rows = self._store.delete(owned)
        self._end_sessions_of(rows)  # a forgotten turn may sit in its conversation's working KV: drop that cache too
        self._audit.record("forget", user_id=user_id, count=len(rows))
        self._erasures.notify(Erasure.of_rows("forget", rows))
        return len(rows)

    def scope(self, *, user_id: str | None, session_id: str | None, tags: Sequence[str]) -> int:
        """Erase every entry of a user / session / tag set (all of them: scoped erasure pages, there is no cap).

        Example:
            >>> forgetting.scope(user_id=None, session_id="s1", tags=[])
            2
        """
        rows = self._store.delete(self._store.scope_ids(user_id=user_id, session_id=session_id, tags=tags))
        if user_id is not None:
            self._sessions.end_user(user_id)
        self._end_sessions_of(rows)
        if session_id is not None:
            self._sessions.end(session_id, user_id)
        action = "forget_user" if user_id is not None else "forget_session" if session_id is not None else "forget_tags"
        self._audit.record(action, user_id=user_id, session_id=session_id, count=len(rows))
        whole_user = user_id if session_id is None and not tags else None
        self._erasures.notify(Erasure.of_rows(action, rows, whole_user=whole_user, session_id=session_id))
        return len(rows)

    def expired(self) -> int:
        """Erase every entry past its expiry, and expire the sessions past theirs.

        Example:
            >>> brief = mem.remember("The door code is 4711 today.", user_id="u1", ttl=0.01)
            >>> time.sleep(0.05); forgetting.expired()
            1
        """
        rows = self._store.delete(self._store.ids_in(CatalogScope(expired_by=time.time())))
        self._sessions.sweep()
        if rows:
            self._audit.record("expire", count=len(rows))
            self._erasures.notify(Erasure.of_rows("expire", rows))
        return len(rows)

    def _end_sessions_of(self, rows: Sequence[Any]) -> None:
        # Sessions are keyed by (user, session): only the owners of the erased turns lose their working KV, never
        # another user whose session happens to carry the same id.
        for uid, session in {(r.user_id, r.session_id) for r in rows if r.session_id}:
            self._sessions.end(session, uid)


__all__ = ["Forgetting", "SessionHooks", "Sweeper"]


class Sweeper:
    """Calls ``sweep`` every ``interval`` seconds on a daemon thread until :meth:`stop`
    (``MemoryConfig.sweep_interval``: expired entries are erased even in a process that never calls ``sweep``).

    Example:
        >>> swept = threading.Event()
        >>> sweeper = Sweeper(lambda: swept.set() or 0, interval=0.01)
        >>> swept.wait(5), sweeper.stop()
        (True, None)
    """

    def __init__(self, sweep: Callable[[], int], interval: float) -> None:
        self._sweep, self._interval = sweep, interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="agentmem-sweeper", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the timer and wait (up to ``timeout`` seconds) for a sweep under way to end."""
        self._stopped.set()
        self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                self._sweep()
            except Exception:  # a failed sweep must not kill the timer; the next one retries
                log.exception("background sweep failed")
