"""Embedded Chroma as the vector index: one collection per user (and space), safe for several processes on one
directory (:mod:`agentmem.backends.chroma.sync`), erasure that leaves no residue (:mod:`agentmem.backends.chroma.erase`).

Chroma is always given our own embeddings (``embedding_function=None``), so it never fetches its
default ONNX model.

Example (a new index is empty; :class:`ChromaVectorIndex` shows a write and a query):
    >>> import tempfile
    >>> ChromaVectorIndex(Path(tempfile.mkdtemp())).count()
    0
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent import futures
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentmem.ports.vectors import SPACES, check_space, per_space
from agentmem.backends.chroma.erase import (
    erase_collection_residue, has_rebuilds, recover_rebuilds, scrub_freed_memory,
)
from agentmem.backends.chroma.sync import ChromaHandle

# ef_search: the HNSW beam width at query time (Chroma's default is 100, the size of recall's candidate pool, so
# the walk missed ~1 of the exact 100 nearest per LoCoMo query, and which one depended on how the index was loaded:
# reopening a store re-ranked ~10 % of questions). At 400 the 100 nearest are exact up to a few thousand vectors
# per user, so a store ranks the same in every process; +0.6-0.8 ms per search at 10,000 (docs/lifecycle.md).
# Chroma 1.5 fixes it when a collection is made (`modify` does not reach an existing index): older stores keep 100.
SEARCH_EF = 400
_CONFIG: dict[str, Any] = {"hnsw": {"space": "cosine", "ef_search": SEARCH_EF}}
_EXACT_IDS = 512  # a query restricted to at most this many ids is scored exactly instead of through HNSW


class ChromaVectorIndex:
    """Embedded Chroma (``PersistentClient``), one collection per user, keyed by entry id; safe for several
    processes on one directory (see :mod:`agentmem.backends.chroma.sync`).

    Why per user: Chroma's metadata-filtered search was ~40x slower than an unfiltered one at 10k entries
    (180 ms vs 4 ms here), and a user's memories are never searched together with another's, so separate
    collections give isolation and speed at once. Chroma metadata carries the remaining scoping fields
    (session, kind); everything else is filtered against the catalog.

    Example:
        >>> import tempfile, numpy as np
        >>> index = ChromaVectorIndex(Path(tempfile.mkdtemp()))
        >>> index.add(["u"], ["e1"], np.ones((1, 4), np.float32), [{"kind": "turn"}])
        >>> [i for i, _ in index.query(np.ones(4, np.float32), user_id="u", n=1)]
        ['e1']
    """

    def __init__(self, path: Path, *, keep_documents: bool = True) -> None:
        # resolved: Chroma shares one client per path *string*, so "./x" from two directories would collide
        scrub_freed_memory()  # Chroma persists uninitialised buffers: they must not hold freed (erased) bytes
        self._handle = ChromaHandle.acquire(str(Path(path).resolve()))
        self.keep_documents = keep_documents
        self._closed = False
        with self._handle.lock:
            interrupted = has_rebuilds(self._handle.fresh())
        if interrupted:  # a crash during an erasure's rebuild (backends/chroma/erase.py)
            with self._handle.writing(everyone_reopens=True) as client:
                recover_rebuilds(client)
                self._handle.collections.clear()

    @staticmethod
    def collection_name(user_id: str, space: str = "") -> str:
        """The user's collection in ``space`` ("": the entries' own vectors; ``"context"``: turn context vectors)."""
        # Chroma names allow [a-zA-Z0-9._-], 3-63 chars: hash the user id (which is not stored in the name)
        return "u-" + hashlib.sha256(user_id.encode()).hexdigest()[:40] + (f"-{check_space(space)}" if space else "")

    def _names(self, user_id: str) -> list[str]:
        """The user's collections in every space (an entry's vectors are erased from all of them)."""
        return [self.collection_name(user_id, s) for s in SPACES]

    def _collection(self, client: Any, user_id: str, *, create: bool, space: str = "") -> Any:
        name = self.collection_name(user_id, space)
        cols = self._handle.collections
        col = cols.get(name)
        if col is None:
            if create:
                col = client.get_or_create_collection(name, embedding_function=None, configuration=_CONFIG)
            else:
                try:
                    col = client.get_collection(name, embedding_function=None)
                except Exception:  # chromadb raises NotFoundError (a ValueError subclass in some versions)
                    return None
            cols[name] = col
            self._handle.mark_loaded(name)
        return col

    def _all_collections(self, client: Any) -> list[Any]:
        cols = [client.get_collection(c.name if hasattr(c, "name") else c, embedding_function=None)
                for c in client.list_collections()]
        for col in cols:
            self._handle.mark_loaded(col.name)
        return cols

    def add(self, user_ids: Sequence[str], ids: Sequence[str], vectors: np.ndarray,
            metadatas: Sequence[dict[str, Any]], documents: Sequence[str] | None = None, *, space: str = "") -> None:
        """Upsert vectors, each into its user's collection of ``space``."""
        users = list(dict.fromkeys(user_ids))
        with self._handle.writing([self.collection_name(u, space) for u in users]) as client:
            for user in users:
                rows = [i for i, u in enumerate(user_ids) if u == user]
                self._collection(client, user, create=True, space=space).upsert(
                    ids=[ids[i] for i in rows], embeddings=vectors[rows], metadatas=[metadatas[i] for i in rows],
                    documents=[documents[i] for i in rows] if (documents is not None and self.keep_documents) else None,
                )
                self._handle.record("a", self.collection_name(user, space), [ids[i] for i in rows], vectors[rows])

    def get(self, user_id: str, ids: Sequence[str], *, space: str = "") -> dict[str, np.ndarray]:
        """Stored vectors of ``ids`` in ``user_id``'s collection of ``space`` (missing ids are left out)."""
        return self._handle.retry_stale(lambda: self._get_once(user_id, ids, space))

    def _get_once(self, user_id: str, ids: Sequence[str], space: str) -> dict[str, np.ndarray]:
        with self._handle.reading() as client:
            col = self._collection(client, user_id, create=False, space=space)
            if col is None or not ids:
                return {}
            ov = self._handle.overlay(col.name)
            # others' new vectors are not in this client's index (Chroma fails a get of those): the journal has them
            added = [i for i in ids if i in ov.added]
            theirs = col.get(ids=added, include=[])["ids"] if added else []  # Chroma refuses an empty id list
            mine = [i for i in ids if i not in ov.added and i not in ov.deleted]
            res = col.get(ids=mine, include=["embeddings"]) if mine else {"ids": [], "embeddings": []}
        out = {i: np.asarray(v, dtype=np.float32) for i, v in zip(res["ids"], res["embeddings"])}
        out.update({i: ov.added[i] for i in theirs})
        return out

    def delete(self, ids: Sequence[str], *, user_id: str | None = None) -> None:
        """Delete ids from one user's collections (every space), or (``user_id=None``, for recovery) from every
        collection."""
        if not ids:
            return
        names = self._names(user_id) if user_id is not None else None
        with self._handle.writing(names) as client:
            cols = [self._collection(client, user_id, create=False, space=s) for s in SPACES] \
                if user_id is not None else self._all_collections(client)
            for col in cols:
                if col is None:
                    continue
                for i in range(0, len(ids), 1000):
                    col.delete(ids=list(ids[i : i + 1000]))
            for name in names or [None]:
                self._handle.record("d", name, list(ids))

    def erase_residue(self, user_ids: Sequence[str]) -> None:
        """After a delete, make the erased vectors leave Chroma's files: a user's emptied collection is dropped,
        a collection with live vectors left is rebuilt, the old segment files are wiped and chroma.sqlite3 is
        vacuumed (:mod:`agentmem.backends.chroma.erase`). Other processes re-open on the generation bump."""
        names = [n for u in dict.fromkeys(user_ids) for n in self._names(u)]
        # the journal holds the erased vectors and ids: it is overwritten, and every other process re-opens
        with self._handle.writing(names, everyone_reopens=True) as client:
            cols = self._handle.collections
            for name in names:
                cols.pop(name, None)
                col = erase_collection_residue(client, name, Path(self._handle.path), _CONFIG)
                if col is not None:
                    cols[name] = col

    def query(self, vector: np.ndarray, *, user_id: str, n: int, where: dict[str, Any] | None = None,
              ids: Sequence[str] | None = None, space: str = "") -> list[tuple[str, float]]:
        """Nearest entries of ``user_id`` in ``space`` as [(id, cosine similarity)], best first."""
        return self._handle.retry_stale(lambda: self._query_once(vector, user_id, n, where, ids, space))

    def query_spaces(self, vector: np.ndarray, *, user_id: str, n: int | Sequence[int], spaces: Sequence[str],
                     where: dict[str, Any] | None = None,
                     ids: Sequence[str] | None = None) -> list[list[tuple[str, float]]]:
        """:meth:`query` in each of ``spaces`` (results in their order), the searches side by side under one read.

        Why: Chroma's search releases the GIL, and recall searches two spaces (entries, turn context vectors)
        with one query vector. Measured at 10,000 entries: 2.9 ms for both together, 5.9 ms one after the other.

        Example:
            >>> index = ChromaVectorIndex(Path("spaces"))
            >>> index.add(["u1", "u1"], ["e1", "e2"], np.eye(2, 4, dtype=np.float32), [{"kind": "turn"}] * 2)
            >>> index.add(["u1"], ["e2"], np.eye(1, 4, dtype=np.float32), [{"kind": "turn"}], space="context")
            >>> dense, context = index.query_spaces(np.eye(4, dtype=np.float32)[0], user_id="u1", n=(2, 5),
            ...                                     spaces=("", "context"))
            >>> [i for i, _ in dense], [(i, round(c, 3)) for i, c in context]
            (['e1', 'e2'], [('e2', 1.0)])
        """
        counts = per_space(n, spaces)
        return self._handle.retry_stale(lambda: self._query_spaces_once(vector, user_id, counts, where, ids, spaces))

    def _query_once(self, vector: np.ndarray, user_id: str, n: int, where: dict[str, Any] | None,
                    ids: Sequence[str] | None, space: str = "") -> list[tuple[str, float]]:
        with self._handle.reading() as client:
            col = self._collection(client, user_id, create=False, space=space)
            return [] if col is None else self._search(col, vector, n, where, ids)

    def _query_spaces_once(self, vector: np.ndarray, user_id: str, n: list[int], where: dict[str, Any] | None,
                           ids: Sequence[str] | None, spaces: Sequence[str]) -> list[list[tuple[str, float]]]:
        with self._handle.reading() as client:
            # collections resolved here, on this thread (it may open one); the side threads only search
            cols = [self._collection(client, user_id, create=False, space=s) for s in spaces]
            pool = _side_searches()
            jobs = [pool.submit(self._search, col, vector, c, where, ids)
                    for col, c in zip(cols[1:], n[1:]) if col is not None]
            try:
                first = [] if not cols or cols[0] is None else self._search(cols[0], vector, n[0], where, ids)
            finally:
                futures.wait(jobs)  # never leave the read (its lock) while a side search still runs
            found = iter([j.result() for j in jobs])
            return [first, *([] if col is None else next(found) for col in cols[1:])]

    def _search(self, col: Any, vector: np.ndarray, n: int, where: dict[str, Any] | None,
                ids: Sequence[str] | None) -> list[tuple[str, float]]:
        """One collection's nearest (caller holds the handle's read)."""
        ov = self._handle.overlay(col.name)
        if ids is not None and len(ids) > _EXACT_IDS:
            # Chroma fails the whole query on an id it does not hold: keep those it does (a few ids are read,
            # not searched, below, and a read skips missing ids: no look-up first, one read fewer per recall)
            ids = col.get(ids=list(ids), include=[])["ids"]
            if not ids:
                return []
        exact = _score_overlay(col, ov, vector, where, ids)
        shadowed = ov.deleted | ov.added.keys()
        if where is not None and ov:  # Chroma would resolve ``where`` to ids its stale index lacks, and fail
            ids = col.get(ids=list(ids) if ids is not None else None, where=where, include=[])["ids"]
            where = None
        in_index = None if ids is None else [i for i in ids if i not in shadowed]
        found: list[tuple[str, float]] = []
        if in_index and len(in_index) <= _EXACT_IDS:
            # a search restricted to a few ids: an HNSW walk that may visit only those costs ~100 ms at 100,000
            # vectors (profiled); reading their vectors and scoring them exactly costs ~1 ms
            got = col.get(ids=in_index, where=where, include=["embeddings"])
            found = _cosines(vector, got["ids"], got["embeddings"])
        elif in_index is None or in_index:
            # no count() first: it costs as much as the search, and Chroma returns fewer than n when it has fewer
            res = col.query(
                query_embeddings=vector.reshape(1, -1), n_results=n + len(shadowed), where=where,
                ids=in_index, include=["distances"],
            )
            found = [(i, 1.0 - float(d)) for i, d in zip(res["ids"][0], res["distances"][0]) if i not in shadowed]
        if exact:
            found = sorted(found + exact, key=lambda x: -x[1])
        return found[:n]

    @staticmethod
    def _ids_of(col: Any) -> list[str]:
        out: list[str] = []
        offset = 0
        while True:
            page = col.get(include=[], limit=5000, offset=offset)["ids"]
            if not page:
                return out
            out.extend(page)
            offset += len(page)

    def user_ids(self, user_id: str, *, space: str = "") -> list[str]:
        """Every id in ``user_id``'s collection of ``space``."""
        with self._handle.reading() as client:
            col = self._collection(client, user_id, create=False, space=space)
            return [] if col is None else self._ids_of(col)

    def has_any(self, user_id: str, *, space: str = "") -> bool:
        """Whether ``user_id``'s collection of ``space`` holds a vector (one id read, whatever its size).

        Example:
            >>> index = ChromaVectorIndex(Path("has-any"))
            >>> index.add(["u1"], ["e1"], np.ones((1, 4), np.float32), [{"kind": "turn"}])
            >>> index.has_any("u1"), index.has_any("u1", space="context"), index.has_any("u2")
            (True, False, False)
        """
        with self._handle.reading() as client:
            col = self._collection(client, user_id, create=False, space=space)
            return col is not None and bool(col.get(include=[], limit=1)["ids"])

    def all_ids(self) -> list[str]:
        """Every id of every collection, every space (checks only: O(store))."""
        with self._handle.reading() as client:
            return [i for col in self._all_collections(client) for i in self._ids_of(col)]

    def count(self) -> int:
        with self._handle.reading() as client:
            return sum(col.count() for col in self._all_collections(client))

    def close(self) -> None:
        """Release this index's share of the process's client (closed with the last one)."""
        if not self._closed:
            self._closed = True
            self._handle.release()


def _cosines(vector: np.ndarray, ids: Sequence[str], vectors: Any) -> list[tuple[str, float]]:
    """[(id, cosine similarity to ``vector``)], best first (Chroma's cosine space: 1 - its distance)."""
    if not len(ids):
        return []
    mat = np.asarray(vectors, dtype=np.float32).reshape(len(ids), -1)
    q = np.asarray(vector, dtype=np.float32).reshape(-1)
    sims = mat @ q / np.maximum(np.linalg.norm(mat, axis=1) * np.linalg.norm(q), 1e-12)
    return sorted(zip(ids, map(float, sims)), key=lambda x: -x[1])


_SIDE: tuple[int, futures.ThreadPoolExecutor] | None = None
_SIDE_LOCK = threading.Lock()


def _side_searches() -> futures.ThreadPoolExecutor:
    """The process's threads for :meth:`VectorIndex.query_spaces`'s extra searches (a new pool after a fork: the
    parent's threads do not exist in the child, and work given to them would never run)."""
    global _SIDE
    with _SIDE_LOCK:
        if _SIDE is None or _SIDE[0] != os.getpid():
            _SIDE = (os.getpid(), futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="agentmem-vectors"))
        return _SIDE[1]


def _score_overlay(col: Any, ov: Any, vector: np.ndarray, where: dict[str, Any] | None,
                   ids: Sequence[str] | None) -> list[tuple[str, float]]:
    """Cosine similarity of ``vector`` to the vectors other processes added since this client loaded ``col``
    (exact: they are few), keeping those that still exist and match ``where`` / ``ids`` (Chroma's SQLite is
    current in every process; only its in-memory index is not)."""
    cand = [i for i in ov.added if ids is None or i in set(ids)]
    if not cand:
        return []
    alive = col.get(ids=cand, where=where, include=[])["ids"]
    if not alive:
        return []
    return _cosines(vector, alive, np.stack([ov.added[i] for i in alive]))


__all__ = ["SEARCH_EF", "ChromaVectorIndex"]
