"""In-process vector index and blob store: plain dicts and numpy, written only against the ports.

``vector_url="memory"`` / ``blob_url="memory"`` (:mod:`agentmem.factory`). Nothing is persisted and nothing leaves
the process: for tests, notebooks and short-lived agents, and the proof that :class:`~agentmem.ports.VectorIndex`
and :class:`~agentmem.ports.BlobStore` say everything the store needs (they pass the same conformance suites as the
embedded and server backends, tests/conformance/). Searches are exact (a matrix product over the user's vectors).

Example:
    >>> import numpy as np
    >>> index = MemoryVectorIndex()
    >>> index.add(["u"], ["e1"], np.array([[1.0, 0.0]], np.float32), [{"kind": "turn"}])
    >>> index.query(np.array([1.0, 0.0], np.float32), user_id="u", n=1)
    [('e1', 1.0)]
    >>> blobs = MemoryBlobStore()
    >>> blobs.publish(blobs.stage("e1", b"kv")); bytes(blobs.read("e1"))
    b'kv'
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from agentmem.errors import BlobCorruptedError, InvalidInputError
from agentmem.ports.vectors import check_space, query_each_space

_Stored = tuple[np.ndarray, dict[str, Any]]  # unit vector, scoping metadata


def matches(meta: dict[str, Any], where: dict[str, Any] | None) -> bool:
    """Whether scoping ``meta`` passes ``where`` (the port's operator dialect: ``$and``, ``$or``, ``$eq``, ``$ne``,
    ``$in``, ``$nin``; a bare value means ``$eq``).

    Example:
        >>> matches({"kind": "turn"}, {"$and": [{"kind": {"$in": ["turn"]}}, {"session_id": {"$ne": "s1"}}]})
        True
    """
    if not where:
        return True
    for key, cond in where.items():
        if key in ("$and", "$or"):
            results = (matches(meta, c) for c in cond)
            if not (all(results) if key == "$and" else any(results)):
                return False
            continue
        have = meta.get(key)
        op, want = next(iter(cond.items())) if isinstance(cond, dict) else ("$eq", cond)
        ok = {"$eq": lambda: have == want, "$ne": lambda: have != want,
              "$in": lambda: have in want, "$nin": lambda: have not in want}.get(op)
        if ok is None:
            raise InvalidInputError(f"where: unknown operator {op!r}")
        if not ok():
            return False
    return True


class MemoryVectorIndex:
    """A :class:`~agentmem.ports.VectorIndex` in a dict: ``(user, space) -> {id: (unit vector, metadata)}``."""

    def __init__(self) -> None:  # noqa: D107 - see the class docstring
        self._spaces: dict[tuple[str, str], dict[str, _Stored]] = {}
        self._lock = threading.Lock()

    def add(self, user_ids: Sequence[str], ids: Sequence[str], vectors: np.ndarray,
            metadatas: Sequence[dict[str, Any]], documents: Sequence[str] | None = None, *, space: str = "") -> None:
        """Upsert one vector per id into ``user_ids[i]``'s ``space`` (documents are not kept: no text here)."""
        check_space(space)
        rows = np.asarray(vectors, dtype=np.float32).reshape(len(ids), -1)
        norms = np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        with self._lock:
            for user, entry_id, vec, meta in zip(user_ids, ids, rows / norms, metadatas):
                self._spaces.setdefault((user, space), {})[entry_id] = (vec.copy(), dict(meta))

    def get(self, user_id: str, ids: Sequence[str], *, space: str = "") -> dict[str, np.ndarray]:
        """The stored vectors of ``ids`` (missing ones left out)."""
        held = self._spaces.get((user_id, check_space(space)), {})
        with self._lock:
            return {i: held[i][0].copy() for i in ids if i in held}

    def delete(self, ids: Sequence[str], *, user_id: str | None = None) -> None:
        """Remove ``ids`` from every space of ``user_id`` (None: of every user)."""
        gone = set(ids)
        with self._lock:
            for (user, _), held in self._spaces.items():
                if user_id is None or user == user_id:
                    for entry_id in gone & held.keys():
                        del held[entry_id]

    def query(self, vector: np.ndarray, *, user_id: str, n: int, where: dict[str, Any] | None = None,
              ids: Sequence[str] | None = None, space: str = "") -> list[tuple[str, float]]:
        """The ``n`` nearest of the user's vectors in ``space`` (exact cosine), best first."""
        held = self._spaces.get((user_id, check_space(space)), {})
        with self._lock:
            wanted = held.keys() if ids is None else [i for i in dict.fromkeys(ids) if i in held]
            found = [(i, held[i][0]) for i in wanted if matches(held[i][1], where)]
        if not found or n <= 0:
            return []
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        sims = np.stack([v for _, v in found]) @ (query / max(float(np.linalg.norm(query)), 1e-12))
        order = np.argsort(-sims, kind="stable")[:n]
        return [(found[k][0], float(sims[k])) for k in order]

    def query_spaces(self, vector: np.ndarray, *, user_id: str, n: int | Sequence[int], spaces: Sequence[str],
                     where: dict[str, Any] | None = None,
                     ids: Sequence[str] | None = None) -> list[list[tuple[str, float]]]:
        """:meth:`query` in each space in turn."""
        return query_each_space(self, vector, user_id=user_id, n=n, spaces=spaces, where=where, ids=ids)

    def erase_residue(self, user_ids: Sequence[str]) -> None:
        """Drop the emptied namespaces (deleted vectors are gone already: nothing is kept anywhere else)."""
        with self._lock:
            for key in [k for k, held in self._spaces.items() if k[0] in set(user_ids) and not held]:
                del self._spaces[key]

    def user_ids(self, user_id: str, *, space: str = "") -> list[str]:
        """Every id ``user_id`` holds in ``space``."""
        with self._lock:
            return list(self._spaces.get((user_id, check_space(space)), {}))

    def has_any(self, user_id: str, *, space: str = "") -> bool:
        """Whether ``user_id`` holds a vector in ``space``."""
        return bool(self._spaces.get((user_id, check_space(space))))

    def all_ids(self) -> list[str]:
        """Every id of every user in every space."""
        with self._lock:
            return [i for held in self._spaces.values() for i in held]

    def count(self) -> int:
        """How many vectors are held, all spaces together."""
        with self._lock:
            return sum(len(held) for held in self._spaces.values())

    def close(self) -> None:
        """Nothing to release (the vectors live as long as the object)."""


class MemoryBlobStore:
    """A :class:`~agentmem.ports.BlobStore` in dicts: published blobs by key, staged writes by token."""

    def __init__(self) -> None:  # noqa: D107 - see the class docstring
        self._blobs: dict[str, bytes] = {}
        self._staged: dict[str, tuple[str, bytes, float]] = {}  # token -> (key, bytes, staged at)
        self._tokens = itertools.count()
        self._lock = threading.Lock()

    def stage(self, key: str, data: bytes) -> str:
        """Keep ``data`` where no reader looks; the token publishes or discards it."""
        with self._lock:
            token = f"{key}.{next(self._tokens)}.staged"
            self._staged[token] = (key, bytes(data), time.monotonic())
            return token

    def publish(self, token: str) -> None:
        """Make a staged write its key's blob (a dict assignment: atomic for readers)."""
        with self._lock:
            key, data, _ = self._staged.pop(token)
            self._blobs[key] = data

    def discard(self, token: str) -> None:
        """Drop a staged write (no-op if it is gone)."""
        with self._lock:
            self._staged.pop(token, None)

    def read(self, key: str) -> bytes:
        """The blob's bytes; :class:`~agentmem.errors.BlobCorruptedError` if there is none."""
        with self._lock:
            data = self._blobs.get(key)
        if data is None:
            raise BlobCorruptedError(f"no KV blob for entry {key}")
        return data

    def view(self, key: str) -> bytes | memoryview:
        """As :meth:`read` (bytes are immutable: no copy is made)."""
        return self.read(key)

    def delete(self, key: str) -> bool:
        """Erase the blob; False if there was none."""
        with self._lock:
            return self._blobs.pop(key, None) is not None

    def exists(self, key: str) -> bool:
        """Whether ``key`` has a published blob."""
        return key in self._blobs

    def list_pending(self, older_than_s: float = 0.0) -> list[str]:
        """Tokens of staged writes at least ``older_than_s`` seconds old."""
        cutoff = time.monotonic() - older_than_s
        with self._lock:
            return [token for token, (_, _, at) in self._staged.items() if at <= cutoff]

    def keys(self) -> Iterator[str]:
        """Every published key."""
        with self._lock:
            return iter(list(self._blobs))

    def location(self, key: str) -> str:
        """``memory:<key>`` (what the catalog's ``kv_path`` records)."""
        return f"memory:{key}"

    def close(self) -> None:
        """Nothing to release (the blobs live as long as the object)."""


def build_vectors(url: str | None, ctx: Any) -> MemoryVectorIndex:
    """Factory builder for ``vector_url="memory"``."""
    return MemoryVectorIndex()


def build_blobs(url: str | None, ctx: Any) -> MemoryBlobStore:
    """Factory builder for ``blob_url="memory"``."""
    return MemoryBlobStore()


__all__ = ["MemoryBlobStore", "MemoryVectorIndex", "build_blobs", "build_vectors", "matches"]
