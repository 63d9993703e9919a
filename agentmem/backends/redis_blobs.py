"""KV blobs in Redis (``blob_url="redis://host:port/db"``): the remote tier LMCache uses, shared by every worker.

A published blob is the string ``<prefix>b:<entry id>``. A write is staged under ``<prefix>s:<token>`` and noted in
the sorted set ``<prefix>pending`` (score = when it was staged), then published with one ``RENAME`` in a
transaction, so a reader sees the old blob or the new one, never half; ``list_pending`` reads only that set, never
the blobs. ``view`` is ``read``: bytes come over the network, there is nothing to map.

Example:
    >>> blobs = RedisBlobStore(redis_url)  # redis_url: redis://127.0.0.1:6379/0, say
    >>> token = blobs.stage("e1", b"kv"); blobs.exists("e1"), blobs.list_pending() == [token]
    (False, True)
    >>> blobs.publish(token); blobs.read("e1"), blobs.location("e1"), blobs.list_pending()
    (b'kv', 'redis:e1', [])
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from agentmem.backends.redis_common import connect, escape_glob
from agentmem.errors import BlobCorruptedError, InvalidInputError

__all__ = ["RedisBlobStore", "build"]


class RedisBlobStore:
    """Blobs as Redis strings; implements :class:`~agentmem.ports.BlobStore`.

    Args:
        url: ``redis://host:port/db`` (``?prefix=`` overrides the key prefix), or give ``client`` instead.
        prefix: prepended to every key, so several stores can share one database.
    """

    def __init__(self, url: str | None = None, *, client: Any = None, prefix: str = "agentmem:blobs:") -> None:
        self.client, self.prefix = connect(url, client, prefix, "RedisBlobStore")
        self._pending = f"{prefix}pending"

    def _blob(self, key: str) -> str:
        return f"{self.prefix}b:{key}"

    def _staged(self, token: str) -> str:
        return f"{self.prefix}s:{token}"

    def stage(self, key: str, data: bytes) -> str:
        token = f"{key}.{uuid.uuid4().hex}"
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self._staged(token), bytes(data))
        pipe.zadd(self._pending, {token: time.time()})
        pipe.execute()
        return token

    def publish(self, token: str) -> None:
        key = token.rsplit(".", 1)[0]
        pipe = self.client.pipeline(transaction=True)
        pipe.rename(self._staged(token), self._blob(key))  # atomic replace; raises if the staged write is gone
        pipe.zrem(self._pending, token)
        pipe.execute()

    def discard(self, token: str) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.unlink(self._staged(token))
        pipe.zrem(self._pending, token)
        pipe.execute()

    def read(self, key: str) -> bytes:
        data = self.client.get(self._blob(key))
        if data is None:
            raise BlobCorruptedError(f"KV blob of entry {key} is missing from Redis")
        return data

    def view(self, key: str) -> bytes:
        return self.read(key)  # nothing to map: the bytes arrive over the socket

    def delete(self, key: str) -> bool:
        # Redis holds the bytes in memory only (no persistence is configured by agentmem): UNLINK frees them.
        return bool(self.client.unlink(self._blob(key)))

    def exists(self, key: str) -> bool:
        return bool(self.client.exists(self._blob(key)))

    def list_pending(self, older_than_s: float = 0.0) -> list[str]:
        cutoff = time.time() - older_than_s
        return [t.decode() for t in self.client.zrangebyscore(self._pending, "-inf", cutoff)]

    def keys(self) -> Iterator[str]:
        base = f"{self.prefix}b:"
        for k in self.client.scan_iter(match=escape_glob(base) + "*", count=1000):
            yield k.decode()[len(base):]

    def location(self, key: str) -> str:
        return f"redis:{key}"

    def close(self) -> None:
        self.client.close()


def build(url: str | None, ctx: Any) -> RedisBlobStore:
    """Factory builder for ``blob_url="redis://…"``.

    Example:
        >>> from pathlib import Path
        >>> from agentmem import factory
        >>> from agentmem.config import MemoryConfig
        >>> ctx = factory.BuildContext(root=Path("."), config=MemoryConfig())
        >>> type(factory.build("blobs", redis_url, ctx)).__name__
        'RedisBlobStore'
        >>> build(None, ctx)
        Traceback (most recent call last):
        agentmem.errors.InvalidInputError: blob_url: a redis URL is required
    """
    if url is None:
        raise InvalidInputError("blob_url: a redis URL is required")
    return RedisBlobStore(url)
