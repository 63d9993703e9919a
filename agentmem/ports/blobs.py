"""Port: KV blob storage, written in two steps so a crash never publishes half a blob.

``stage`` writes the bytes where no reader looks; ``publish`` makes them the blob of ``key`` atomically (a rename, a
Redis ``RENAME``); ``discard`` drops a staged write. ``list_pending`` returns staged writes older than a given age
(a crashed writer's leftovers), so recovery never walks the published blobs. Keys are entry ids.

Example:
    >>> import tempfile, pathlib
    >>> from agentmem.backends.files import FileBlobStore
    >>> blobs = FileBlobStore(pathlib.Path(tempfile.mkdtemp()))
    >>> blobs.publish(blobs.stage("e1", b"kv"))
    >>> bytes(blobs.read("e1"))
    b'kv'
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable


@runtime_checkable
class BlobStore(Protocol):
    """Opaque bytes per key. Implementations: files under the store path, Redis."""

    def stage(self, key: str, data: bytes) -> str:
        """Write ``data`` invisibly; returns a token for :meth:`publish` / :meth:`discard`."""
        ...

    def publish(self, token: str) -> None:
        """Make a staged write the blob of its key, atomically (replacing any previous blob)."""
        ...

    def discard(self, token: str) -> None:
        """Drop a staged write (a no-op if it is gone)."""
        ...

    def read(self, key: str) -> bytes:
        """The blob's bytes; raises :class:`~agentmem.errors.BlobCorruptedError` if it is missing or unreadable."""
        ...

    def view(self, key: str) -> bytes | memoryview:
        """The blob without a copy where the backend can (a memory map for files); else as :meth:`read`."""
        ...

    def delete(self, key: str) -> bool:
        """Erase the blob (overwritten first where the medium allows); False if there was none."""
        ...

    def exists(self, key: str) -> bool:
        """Whether ``key`` has a published blob."""
        ...

    def list_pending(self, older_than_s: float = 0.0) -> list[str]:
        """Tokens of staged writes at least ``older_than_s`` seconds old (a crashed writer's leftovers)."""
        ...

    def keys(self) -> Iterator[str]:
        """Every published key (``verify()`` only: O(store))."""
        ...

    def location(self, key: str) -> str:
        """What the catalog's ``kv_path`` records for ``key`` (a relative path for files, ``redis:<key>`` ...)."""
        ...

    def close(self) -> None:
        """Release connections (the data stays)."""
        ...


__all__ = ["BlobStore"]
