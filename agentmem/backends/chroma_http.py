"""Chroma server as the vector index (``vector_url="chroma+http://127.0.0.1:8000"``, ``chroma run``).

The same collections as the embedded index (one per user, named by a digest of the user id, cosine space), reached
through ``chromadb.HttpClient``. The server holds the only HNSW index, so every process and host sees a write as
soon as ``add`` returns: nothing to refresh, no file lock.

Example:
    >>> import numpy as np
    >>> index = ChromaHttpIndex(chroma_http_url)  # chroma+http://127.0.0.1:8000, say
    >>> probe = np.ones(4, np.float32)
    >>> index.add(["u"], ["e1"], probe[None], [{"kind": "turn"}])
    >>> [i for i, _ in index.query(probe, user_id="u", n=5)], index.query(probe, user_id="v", n=5)
    (['e1'], [])
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from agentmem.errors import InvalidInputError
from agentmem.ports.vectors import SPACES
from agentmem.backends.chroma.sync import Overlay
from agentmem.backends.chroma.index import ChromaVectorIndex


class _ServerHandle:
    """What :class:`ChromaVectorIndex` needs from its client holder, for a server: always fresh, no cross-process lock."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.lock = threading.RLock()
        self.collections: dict[str, Any] = {}

    def fresh(self) -> Any:
        return self.client

    @contextlib.contextmanager
    def writing(self, names: Any = None, *, everyone_reopens: bool = False) -> Iterator[Any]:
        with self.lock:
            yield self.client

    @contextlib.contextmanager
    def reading(self) -> Iterator[Any]:
        with self.lock:
            yield self.client

    def overlay(self, name: str) -> Overlay:
        return Overlay()  # the server's index is every process's: nothing another process wrote is missing

    def mark_loaded(self, name: str) -> None:
        pass

    def retry_stale(self, read: Any) -> Any:
        return read()  # the server's index is never stale

    def record(self, op: str, name: str | None, ids: list[str], vectors: Any = None) -> None:
        pass  # no journal: nothing to keep current

    def release(self) -> None:
        self.collections = {}


class ChromaHttpIndex(ChromaVectorIndex):
    """Vectors in a Chroma server, one collection per user."""

    def __init__(self, url: str, *, keep_documents: bool = False) -> None:  # noqa: D107 - see class docstring
        import chromadb
        from chromadb.config import Settings

        parts = urlsplit(url)
        if parts.scheme not in ("chroma+http", "chroma+https", "http", "https") or not parts.hostname:
            raise InvalidInputError(f"vector_url: expected chroma+http://host:port, got {url!r}")
        client = chromadb.HttpClient(host=parts.hostname, port=parts.port or 8000, ssl=parts.scheme.endswith("s"),
                                     settings=Settings(anonymized_telemetry=False))
        self._handle = _ServerHandle(client)  # type: ignore[assignment]
        self.keep_documents = keep_documents
        self._closed = False


    def erase_residue(self, user_ids: Sequence[str]) -> None:
        """Drop each user's collections (every space) once empty (the server's files are the server's to compact)."""
        with self._handle.lock:
            for user in dict.fromkeys(user_ids):
                for space in SPACES:
                    name = self.collection_name(user, space)
                    col = self._collection(self._handle.client, user, create=False, space=space)
                    if col is not None and col.count() == 0:
                        self._handle.collections.pop(name, None)
                        self._handle.client.delete_collection(name)


def build_vectors(url: str | None, ctx: Any) -> ChromaHttpIndex:
    """Factory builder for ``chroma+http://`` vector URLs."""
    return ChromaHttpIndex(url or "", keep_documents=ctx.config.keep_text_in_index and ctx.cipher is None)


__all__ = ["ChromaHttpIndex", "build_vectors"]
