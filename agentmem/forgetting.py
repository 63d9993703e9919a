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

import json
import logging
import secrets
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
                 sessions: SessionHooks, journal: ErasureJournal | None = None) -> None:
        self._store, self._audit, self._erasures, self._sessions = store, audit, erasures, sessions
        self._catalog = store.catalog
        self._journal = journal  # None: no other process replays this store's erasures (the embedded catalog)

    def _told(self, erasure: Erasure, rows: Sequence[Any]) -> None:
        """This process's listeners told, and the erasure journalled for the other processes on the store."""
        self._erasures.notify(erasure)
        if self._journal is None:
            return
        try:
            self._journal.record(erasure, [(r.user_id, r.session_id) for r in rows if r.session_id])
        except Exception:  # the erase is done and durable: the other processes drop their copies on restart
            log.exception("the erasure could not be journalled for other processes (%s)", erasure.action)

    def replay(self) -> int:
        """Apply erasures journalled by other processes on this store since the last call: their sessions' working
        KV and this process's listeners (caches keyed by memory text, a server's request log) drop what they hold
        of the erased entries. Returns how many erasures were replayed.

        Example:
            >>> forgetting.replay()     # no other process has erased anything
            0
        """
        done = 0
        for erasure, sessions in self._journal.unseen() if self._journal is not None else ():
            for uid in erasure.user_ids:
                self._sessions.end_user(uid)
            for uid, session in sessions:
                self._sessions.end(session, uid)
            for session in erasure.session_ids - {s for _, s in sessions}:  # a session scope with no turns stored
                self._sessions.end(session, None)
            self._erasures.notify(erasure)
            done += 1
        return done

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
        self._told(Erasure.of_rows("forget", rows), rows)
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
        erasure = Erasure.of_rows(action, rows, whole_user=whole_user, session_id=session_id)
        self._told(erasure, rows)
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
            self._told(Erasure.of_rows("expire", rows), rows)
        return len(rows)

    def _end_sessions_of(self, rows: Sequence[Any]) -> None:
        # Sessions are keyed by (user, session): only the owners of the erased turns lose their working KV, never
        # another user whose session happens to carry the same id.
        for uid, session in {(r.user_id, r.session_id) for r in rows if r.session_id}:
            self._sessions.end(session, uid)


class ErasureJournal:
    """Erasures told to every process on a shared store: each one done here is kept in the catalog's facts as ids
    only (``erasure:<time ns>:<random>`` -> the action, users, ``(user, session)`` pairs and entry ids; never text),
    and :meth:`unseen` returns those other processes journalled since. Entries are pruned after ``KEEP_S`` (ten
    minutes: the other processes read every second), so erased ids stay in the store no longer than that (the
    audit log keeps them by design). Only a store other processes replay keeps a journal (``erasure_replay_s``).

    Reads look back ``LOOKBACK_S`` before the last read (an erasure committed late, or stamped by a host clock a
    little behind, is still found) and skip keys already seen.

    Example:
        >>> from agentmem.backends.memory_catalog import MemoryCatalog
        >>> catalog = MemoryCatalog()
        >>> here, there = ErasureJournal(catalog), ErasureJournal(catalog)
        >>> here.record(Erasure(action="forget", entry_ids=frozenset({"e1"})), [])
        >>> [(e.action, sorted(e.entry_ids)) for e, _ in there.unseen()], there.unseen(), here.unseen()
        ([('forget', ['e1'])], [], [])
    """

    PREFIX = "erasure:"
    LOOKBACK_S = 60.0
    KEEP_S = 600.0

    def __init__(self, catalog: Any) -> None:
        self._catalog = catalog
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}
        self._read_from = time.time()  # a process starts with empty caches: nothing earlier concerns it

    def record(self, erasure: Erasure, sessions: Sequence[tuple[str, str]]) -> None:
        """Journal an erasure done by this process (``sessions``: the (user, session) pairs of its erased turns)
        for the others, and prune what is older than ``KEEP_S``."""
        now = time.time()
        key = f"{self.PREFIX}{time.time_ns():020d}:{secrets.token_hex(6)}"
        with self._lock:
            self._seen[key] = now
        self._catalog.set_info(key, json.dumps({
            "action": erasure.action, "users": sorted(erasure.user_ids), "sessions": sorted(set(sessions)),
            "session_ids": sorted(erasure.session_ids), "entries": sorted(erasure.entry_ids)}))
        old = f"{self.PREFIX}{int((now - self.KEEP_S) * 1e9):020d}"
        self._catalog.delete_infos([k for k, _ in self._catalog.info_items(self.PREFIX) if k < old])

    def unseen(self) -> list[tuple[Erasure, list[tuple[str, str]]]]:
        """Erasures journalled by other processes since the last call, oldest first, with their (user, session)
        pairs."""
        with self._lock:
            start = time.time()
            after = f"{self.PREFIX}{max(0, int((self._read_from - self.LOOKBACK_S) * 1e9)):020d}"
            fresh = [(k, v) for k, v in self._catalog.info_items(self.PREFIX, after=after) if k not in self._seen]
            for key, _ in fresh:
                self._seen[key] = start
            self._read_from = start
            horizon = start - 4 * self.LOOKBACK_S
            self._seen = {k: t for k, t in self._seen.items() if t >= horizon}
        out = []
        for _, value in fresh:
            data = json.loads(value)
            out.append((Erasure(action=data["action"], user_ids=frozenset(data["users"]),
                                session_ids=frozenset(data["session_ids"]), entry_ids=frozenset(data["entries"])),
                        [(u, s) for u, s in data["sessions"]]))
        return out


__all__ = ["ErasureJournal", "Forgetting", "SessionHooks", "Sweeper"]


class Sweeper:
    """Calls ``sweep`` every ``interval`` seconds on a daemon thread until :meth:`stop`
    (``MemoryConfig.sweep_interval``: expired entries are erased even in a process that never calls ``sweep``).

    Example:
        >>> swept = threading.Event()
        >>> sweeper = Sweeper(lambda: swept.set() or 0, interval=0.01)
        >>> swept.wait(5), sweeper.stop()
        (True, None)
    """

    def __init__(self, sweep: Callable[[], int], interval: float, *, name: str = "agentmem-sweeper") -> None:
        self._sweep, self._interval = sweep, interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
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
