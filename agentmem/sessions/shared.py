"""What the workers serving sessions share through the cold store: a lease per session, and the invalidation epoch.

* :class:`Leases`: one worker serves a session at a time. A worker takes the session's lease (owner + expiry, kept
  in the shared :class:`~agentmem.ports.sessions.SessionTierStore`) before a turn, keeps renewing it while the
  session's KV stays in its memory, and gives it up when the session goes to the cold tier. Another worker's turn
  waits for the lease (then continues from the cold copy, token for token) or raises
  :class:`~agentmem.errors.SessionBusyError`. A crashed worker's leases expire on their own.
* :func:`load_epoch` / :func:`new_epoch`: the epoch that tags every session's KV lives in the store too, so a
  session written by one worker is valid on another (a per-process epoch would force a rebuild on every move).

Example:
    >>> import tempfile, pathlib
    >>> from agentmem.backends.file_sessions import FileSessionStore
    >>> leases = Leases(FileSessionStore(pathlib.Path(tempfile.mkdtemp())), "w1", ttl_s=30, wait_s=0)
    >>> leases.take("u/s") is not None
    True
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path

from agentmem.errors import SessionBusyError
from agentmem.ports.sessions import SessionTierStore, put

__all__ = ["META_FOLDER", "Leases", "load_epoch", "new_epoch", "worker_id"]

META_FOLDER = "_agentmem"  # a store key folder no user hash can take (hashes are hex)
_EPOCH_KEY = f"{META_FOLDER}/epoch"
_POLL_S = 0.05


def worker_id() -> str:
    """A lease owner id unique to this manager: host, pid and a random part.

    Example:
        >>> len(worker_id().split(":"))
        3
    """
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class Leases:
    """Take, renew and release session leases for one owner (see the module docstring)."""

    def __init__(self, store: SessionTierStore, owner: str, *, ttl_s: float, wait_s: float) -> None:
        self.store = store
        self.owner = owner
        self.ttl_s = ttl_s
        self.wait_s = wait_s

    def take(self, key: str, wait_s: float | None = None) -> float:
        """Take or renew the lease on ``key``, waiting up to ``wait_s`` for another owner; returns until when
        (``time.monotonic()``) it is held for sure. Raises :class:`SessionBusyError` if it stays taken.

        Example:
            >>> # until = leases.take(session_key)
        """
        wait = self.wait_s if wait_s is None else wait_s
        deadline = time.monotonic() + wait
        while True:
            start = time.monotonic()  # before the call: the store's expiry is at least this far away
            if self.store.acquire_lease(key, self.owner, self.ttl_s):
                return start + self.ttl_s
            if start >= deadline:
                raise SessionBusyError(
                    "another worker is serving this session (it holds the session's lease); retry when it "
                    "has offloaded the session, or route the session's turns to that worker"
                )
            time.sleep(min(_POLL_S, max(0.0, deadline - start)))

    def renew(self, key: str) -> float | None:
        """Renew without waiting; None if another owner has it now (ours expired meanwhile)."""
        start = time.monotonic()
        return start + self.ttl_s if self.store.acquire_lease(key, self.owner, self.ttl_s) else None

    def release(self, key: str) -> None:
        self.store.release_lease(key, self.owner)


def load_epoch(store: SessionTierStore, legacy_file: Path | None = None) -> str:
    """The shared epoch (created if the store has none; a store's old ``epoch`` file is adopted once).

    Example:
        >>> # epoch = load_epoch(store, root / "epoch")
    """
    raw = store.get(_EPOCH_KEY)
    if raw:
        return bytes(raw).decode()
    value = ""
    if legacy_file is not None:
        try:
            value = legacy_file.read_text().strip()
        except FileNotFoundError:
            pass
    put(store, _EPOCH_KEY, (value or uuid.uuid4().hex).encode(), last_used=time.time())
    raw = store.get(_EPOCH_KEY)  # two workers racing to create it: both adopt the one that stuck
    return bytes(raw).decode() if raw else value


def new_epoch(store: SessionTierStore) -> str:
    """Start a new epoch for every worker: KV tagged with an older one is never mounted again."""
    value = uuid.uuid4().hex
    put(store, _EPOCH_KEY, value.encode(), last_used=time.time())
    return value
