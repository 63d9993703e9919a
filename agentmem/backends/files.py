"""KV blobs as files under the store directory (the embedded default :class:`~agentmem.ports.BlobStore`).

Layout: ``kv/<first two chars>/<key>.kv`` for published blobs (the path the catalog's ``kv_path`` records, as it
always has) and ``kv/.staging/<key>.<random>.tmp`` for writes in flight. ``publish`` is one rename, so readers see
the old blob or the new one, never half of one; ``list_pending`` reads only the staging folder, never the blobs.
Several processes may share the folder: staging names are unique and renames are atomic.

Example:
    >>> import tempfile
    >>> blobs = FileBlobStore(Path(tempfile.mkdtemp()))
    >>> token = blobs.stage("e1", b"kv")
    >>> blobs.exists("e1"), len(blobs.list_pending())
    (False, 1)
    >>> blobs.publish(token)
    >>> bytes(blobs.view("e1")), blobs.location("e1")
    (b'kv', 'kv/e1/e1.kv')
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from agentmem._fs import fsync_dir, map_readonly, write_synced
from agentmem.errors import BlobCorruptedError
from agentmem.security.erase import secure_unlink

_SUFFIX = ".kv"


class FileBlobStore:
    """Blobs as files under ``root`` (the store directory; blobs go in ``root/kv``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.kv_dir = self.root / "kv"
        self.staging = self.kv_dir / ".staging"
        self.staging.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        """Where ``key``'s published blob lives."""
        return self.kv_dir / key[:2] / f"{key}{_SUFFIX}"

    def location(self, key: str) -> str:
        return str(self.path(key).relative_to(self.root))

    def stage(self, key: str, data: bytes) -> str:
        token = f"{key}.{uuid.uuid4().hex}.tmp"
        write_synced(self.staging / token, data)
        return token

    def publish(self, token: str) -> None:
        final = self.path(_key_of(token))
        final.parent.mkdir(exist_ok=True)
        os.replace(self.staging / token, final)
        fsync_dir(final.parent)  # the rename itself must survive a crash once the catalog says "committed"

    def discard(self, token: str) -> None:
        (self.staging / token).unlink(missing_ok=True)

    def read(self, key: str) -> bytes:
        try:
            return self.path(key).read_bytes()
        except OSError as exc:
            raise BlobCorruptedError(f"KV blob of entry {key} is unreadable: {exc.strerror}") from exc

    def view(self, key: str) -> bytes | memoryview:
        """A memory map of the blob: safe against a concurrent ``delete``, which overwrites without truncating."""
        try:
            return map_readonly(self.path(key))
        except (OSError, ValueError) as exc:
            raise BlobCorruptedError(f"KV blob of entry {key} is unreadable: {exc}") from exc

    def delete(self, key: str) -> bool:
        path = self.path(key)
        existed = path.exists()
        secure_unlink(path, missing_ok=True)
        return existed

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def list_pending(self, older_than_s: float = 0.0) -> list[str]:
        cutoff = time.time() - older_than_s
        out = []
        with os.scandir(self.staging) as it:
            for e in it:
                try:
                    if e.name.endswith(".tmp") and e.stat().st_mtime <= cutoff:
                        out.append(e.name)
                except FileNotFoundError:  # published or discarded meanwhile
                    continue
        return out

    def keys(self) -> Iterator[str]:
        for sub in self.kv_dir.iterdir():
            if sub.is_dir() and sub != self.staging:
                for f in sub.glob(f"*{_SUFFIX}"):
                    yield f.name[: -len(_SUFFIX)]

    def close(self) -> None:
        """Nothing to release (files are opened per call)."""


def _key_of(token: str) -> str:
    return token.rsplit(".", 2)[0]


__all__ = ["FileBlobStore"]
