"""Brief holds of a session by the background worker, and how a turn that needs that session's room waits for one.

The worker (write-behind copies, idle offloads, lease renewals) only ever *tries* a session's lock, so it never makes
a ``send`` wait for the disk. But while it holds a session for a moment (a lease renewal, a snapshot, a publish),
that session cannot move down a tier; a turn making room used to skip it and push the tier over its budget, which
happened at random under load. Now the worker marks the sessions it holds, and :meth:`WorkerHolds.lock_victim` waits
for a marked one instead of skipping it. That cannot deadlock: the worker never waits for a session lock, so nothing
it holds is ever held while it waits on the waiter. Sessions held by another turn (``slot.busy``) are still skipped.

Example:
    >>> import threading
    >>> from types import SimpleNamespace
    >>> holds = WorkerHolds()
    >>> s = SimpleNamespace(key="k", lock=threading.RLock())   # a SessionSlot has both
    >>> with holds.hold(s) as held:
    ...     held
    True
    >>> holds.lock_victim(s)
    True
    >>> s.lock.release()
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["WorkerHolds"]

WAIT_S = 2.0  # longest a turn waits for the worker to let go of a session it must move down (a hold is milliseconds)


class WorkerHolds:
    """The keys of the sessions the background worker holds right now."""

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, s: Any) -> Iterator[bool]:
        """Try ``s``'s lock without waiting; yields whether it was taken (the lock is released on exit).

        ``s`` is a session's :class:`~agentmem.sessions.slot.SessionSlot` (anything with ``key`` and ``lock``).

        The mark is set before the lock is tried and cleared after it is released, so whenever the worker holds
        the lock, :meth:`lock_victim` sees the mark.

        Example:
            >>> # with holds.hold(session.slot) as held:
            >>> #     if held: ...renew its lease...
        """
        with self._lock:
            self._keys.add(s.key)
        try:
            held = s.lock.acquire(blocking=False)
            try:
                yield held
            finally:
                if held:
                    s.lock.release()
        finally:
            with self._lock:
                self._keys.discard(s.key)

    def lock_victim(self, s: Any, wait_s: float = WAIT_S) -> bool:
        """Take ``s``'s lock to move it down a tier: at once, or after the worker lets go of it; False otherwise.

        Example:
            >>> # if holds.lock_victim(victim.slot): ...move it, then victim.slot.lock.release()
        """
        if s.lock.acquire(blocking=False):
            return True
        with self._lock:
            worker_has_it = s.key in self._keys
        return worker_has_it and s.lock.acquire(timeout=wait_s)
