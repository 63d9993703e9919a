"""Port: the cold tier of session KV, shared by every worker that serves sessions, plus the lease on each session.

A key is ``"<user hash>/<session hash>"`` (one ``/``): the part before it is the user's folder, so every session of
one user can be listed and erased together. Values are opaque bytes (a serialised, possibly encrypted session).
Folders starting with ``_`` are reserved for what the workers share besides sessions (the invalidation epoch):
such keys are read and written like the others but never listed by ``keys()`` nor counted by ``nbytes()``.

Writes come in two steps so a worker can serialise and write without holding the session's lock: ``stage`` writes
the bytes where no reader looks, ``publish`` makes them the key's value atomically, ``discard`` drops them.
``delete`` is fast (it may only hide the value); ``purge`` finishes erasing what ``delete`` hid (overwriting it
where the medium allows), off the path of a turn.

A **lease** (owner + expiry, kept in the same shared backend) says which worker serves a session: only the holder
writes its value, and a session offloaded by one worker is continued by the next one that takes the lease.

Example:
    >>> import tempfile, pathlib
    >>> from agentmem.backends.file_sessions import FileSessionStore
    >>> store = FileSessionStore(pathlib.Path(tempfile.mkdtemp()))
    >>> store.publish(store.stage("u/s", b"kv", last_used=1.0)); bytes(store.get("u/s")), store.keys("u")
    (b'kv', ['u/s'])
    >>> store.acquire_lease("u/s", "worker-1", 30.0), store.acquire_lease("u/s", "worker-2", 30.0)
    (True, False)
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["SessionTierStore", "put"]


@runtime_checkable
class SessionTierStore(Protocol):
    """Serialised sessions by key, and a lease per key. Implementations: files under the store path, Redis."""

    name: str

    def stage(self, key: str, data: bytes, *, last_used: float) -> str:
        """Write ``data`` invisibly, stamped with ``last_used`` (epoch seconds); returns a token."""
        ...

    def publish(self, token: str) -> None:
        """Make a staged write the value of its key, atomically (replacing any previous value)."""
        ...

    def discard(self, token: str) -> None:
        """Drop a staged write (a no-op if it is gone)."""
        ...

    def get(self, key: str) -> bytes | bytearray | None:
        """The key's value, or None if it has none."""
        ...

    def last_used(self, key: str) -> float | None:
        """The ``last_used`` stamp of the key's value, or None if it has none (so this is also ``contains``)."""
        ...

    def delete(self, key: str) -> bool:
        """Remove the key's value now (its bytes may linger until :meth:`purge`); False if it had none."""
        ...

    def purge(self) -> int:
        """Finish erasing every value :meth:`delete` removed (overwritten where the medium allows); how many."""
        ...

    def keys(self, folder: str | None = None) -> list[str]:
        """Every session key (of one ``folder`` only, if given; never ``_`` folders). O(sessions): listing, sweeps."""
        ...

    def nbytes(self) -> int:
        """Bytes held by published session values (not ``_`` folders), for stats."""
        ...

    def acquire_lease(self, key: str, owner: str, ttl_s: float) -> bool:
        """Take or renew the lease on ``key`` for ``ttl_s`` seconds; False if another owner holds it unexpired."""
        ...

    def release_lease(self, key: str, owner: str) -> None:
        """Give the lease up if ``owner`` holds it (a no-op otherwise)."""
        ...


def put(store: SessionTierStore, key: str, data: bytes, *, last_used: float) -> None:
    """Stage and publish in one call (for callers that hold nothing while writing).

    Example:
        >>> # put(store, "u/s", b"kv", last_used=time.time())
    """
    store.publish(store.stage(key, data, last_used=last_used))
