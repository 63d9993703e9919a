"""The cold tier of session KV in Redis, shared by every worker (``session_store_url="redis://host:port/db"``).

Each session is one hash ``<prefix>v:<key>`` holding ``data`` and ``last_used``; a write is staged under a temp key
(which Redis expires on its own if the writer dies) and published with one ``RENAME``, so readers see the old value
or the new one, never half. A lease is ``<prefix>lease:<key>`` = owner, with Redis's own expiry, set and released
by compare-and-set scripts. ``delete`` is ``UNLINK``: Redis keeps nothing on disk here unless persistence is
configured, so ``purge`` has nothing left to overwrite.

Example:
    >>> import time
    >>> store = RedisSessionStore(redis_url)  # redis_url: redis://127.0.0.1:6379/0, say
    >>> store.get("u/s")
    >>> store.publish(store.stage("u/s", b"kv", last_used=time.time())); store.get("u/s")
    b'kv'
"""

from __future__ import annotations

import uuid
from typing import Any

from agentmem.backends.redis_common import LEASE_ACQUIRE, LEASE_RELEASE, connect, escape_glob
from agentmem.errors import InvalidInputError

__all__ = ["RedisSessionStore"]

_STAGE_TTL_MS = 3_600_000  # a staged write nobody published (its writer died) disappears after an hour


class RedisSessionStore:
    """Sessions as Redis hashes; implements :class:`~agentmem.ports.SessionTierStore`.

    Args:
        url: ``redis://host:port/db`` (``?prefix=`` overrides the key prefix), or give ``client`` instead.
        prefix: prepended to every key, so several stores can share one database.
    """

    def __init__(self, url: str | None = None, *, client: Any = None, prefix: str = "agentmem:sessions:",
                 name: str = "cold") -> None:
        self.name = name
        self.client, self.prefix = connect(url, client, prefix, "RedisSessionStore")
        self._acquire = self.client.register_script(LEASE_ACQUIRE)
        self._release = self.client.register_script(LEASE_RELEASE)

    def _value(self, key: str) -> str:
        folder, sep, name = key.partition("/")
        if not sep or not folder or not name or "/" in name:
            raise InvalidInputError(f"a session key is '<folder>/<name>', got {key!r}")
        return f"{self.prefix}v:{key}"

    # -- values ---------------------------------------------------------------------------------------
    def stage(self, key: str, data: bytes, *, last_used: float) -> str:
        self._value(key)  # validates the key
        token = f"{self.prefix}tmp:{uuid.uuid4().hex}:{key}"
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(token, mapping={"data": bytes(data), "last_used": repr(float(last_used))})
        pipe.pexpire(token, _STAGE_TTL_MS)
        pipe.execute()
        return token

    def publish(self, token: str) -> None:
        head = f"{self.prefix}tmp:"
        if not token.startswith(head) or token[len(head) + 32 : len(head) + 33] != ":":
            raise InvalidInputError("not a staged-write token of this store")
        target = self._value(token[len(head) + 33 :])
        pipe = self.client.pipeline(transaction=True)
        pipe.rename(token, target)  # atomic replace; raises if the staged write expired
        pipe.persist(target)
        pipe.execute()

    def discard(self, token: str) -> None:
        self.client.unlink(token)

    def get(self, key: str) -> bytes | None:
        return self.client.hget(self._value(key), "data")

    def last_used(self, key: str) -> float | None:
        raw = self.client.hget(self._value(key), "last_used")
        return None if raw is None else float(raw)

    def delete(self, key: str) -> bool:
        return bool(self.client.unlink(self._value(key)))

    def purge(self) -> int:
        return 0  # UNLINK already released the memory; nothing was written to disk by this store

    def keys(self, folder: str | None = None) -> list[str]:
        base = f"{self.prefix}v:"
        pattern = escape_glob(base) + ("*" if folder is None else escape_glob(folder) + "/*")
        found = (k.decode()[len(base):] for k in self.client.scan_iter(match=pattern, count=1000))
        return [k for k in found if not k.startswith("_")]  # "_" folders: shared metadata, not sessions

    def nbytes(self) -> int:
        keys = self.keys()
        if not keys:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hstrlen(self._value(key), "data")
        return int(sum(pipe.execute()))

    # -- leases ---------------------------------------------------------------------------------------
    def acquire_lease(self, key: str, owner: str, ttl_s: float) -> bool:
        self._value(key)  # validates the key
        ms = max(1, int(ttl_s * 1000))
        return bool(self._acquire(keys=[f"{self.prefix}lease:{key}"], args=[owner, ms]))

    def release_lease(self, key: str, owner: str) -> None:
        self._release(keys=[f"{self.prefix}lease:{key}"], args=[owner])
