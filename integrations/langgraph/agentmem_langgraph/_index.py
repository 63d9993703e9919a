"""LangGraph's store-wide ``index={"dims", "embed", "fields"}`` config for :class:`AgentMemStore`.

LangGraph's own stores embed the named fields of each value with the configured embeddings (one vector per
field text, ``"$"`` = the whole value) and score a search by the best cosine similarity among an item's vectors.
``StoreIndex`` does the same: the vectors travel in the agentmem entry's metadata (``lg:vec``, float32, base64),
agentmem's hybrid recall supplies the candidates, and the configured embeddings decide the score and the order.

Example:
    >>> ix = StoreIndex({"dims": 2, "embed": lambda texts: [[1.0, 0.0] for _ in texts], "fields": ["a"]})
    >>> packed = ix.pack([({"a": "x", "b": "y"}, None)])[0]
    >>> ix.score(ix.embed_query("anything"), packed)
    1.0
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from langgraph.store.base import IndexConfig, ensure_embeddings, get_text_at_path, tokenize_path

__all__ = ["StoreIndex", "field_texts"]


def field_texts(value: Mapping[str, Any], paths: Sequence[str]) -> list[str]:
    """The texts LangGraph embeds for ``value`` under ``paths`` (missing fields are skipped).

    Example:
        >>> field_texts({"a": "x", "b": {"c": "y"}}, ["a", "b.c", "nope"])
        ['x', 'y']
    """
    out: list[str] = []
    for path in paths:
        out += [t for t in get_text_at_path(value, path if path == "$" else tokenize_path(path)) if t]
    return out


class StoreIndex:
    """Embeds item fields at put time and scores search hits by cosine similarity (max over the item's fields)."""

    def __init__(self, config: IndexConfig) -> None:
        self.config: dict[str, Any] = dict(config)
        self.embeddings = ensure_embeddings(config.get("embed"))
        self.fields: list[str] = list(config.get("fields") or ["$"])

    def paths(self, op_index: Any) -> list[str] | None:
        """The fields an item is embedded by: the put's own ``index=[...]``, else the store's; None = not indexed."""
        if op_index is False:
            return None
        return list(op_index) if isinstance(op_index, list) else self.fields

    def pack(self, items: Sequence[tuple[Mapping[str, Any], Any]]) -> list[list[str] | None]:
        """For each (value, put index) the item's vectors, encoded for the entry's metadata (one batch call)."""
        texts_of = []
        for value, op_index in items:
            paths = self.paths(op_index)
            texts_of.append(None if paths is None else field_texts(value, paths))
        flat = [t for texts in texts_of if texts for t in texts]
        vectors = iter(self.embeddings.embed_documents(flat) if flat else [])
        out: list[list[str] | None] = []
        for texts in texts_of:
            if texts is None:
                out.append(None)
            else:
                out.append([base64.b64encode(np.asarray(next(vectors), dtype=np.float32).tobytes()).decode()
                            for _ in texts])
        return out

    def embed_query(self, query: str) -> np.ndarray:
        return np.asarray(self.embeddings.embed_query(query), dtype=np.float32)

    def score(self, query_vector: np.ndarray, packed: Sequence[str] | None) -> float | None:
        """Best cosine similarity between the query and the item's vectors; None for an item not indexed."""
        if not packed:
            return None
        q = query_vector.astype(np.float64)
        qn = float(np.linalg.norm(q)) or 1.0
        best = -1.0
        for blob in packed:
            v = np.frombuffer(base64.b64decode(blob), dtype=np.float32).astype(np.float64)
            best = max(best, float(v @ q) / ((float(np.linalg.norm(v)) or 1.0) * qn))
        return best
