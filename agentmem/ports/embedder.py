"""Port: text → L2-normalised float32 vectors.

``Embedder`` is what every embedder implements: ``dim`` and ``encode`` (the stored side, and the query side too
unless the embedder says otherwise). An embedder whose queries take another path — an asymmetric model's query
prompt, or MiniLM's int8 query graph — also implements ``encode_query`` and so is a ``QueryEmbedder``. Which path
a store's queries take is decided once, when the store is built (:func:`agentmem.factory.query_encoder`), not per
query. This follows LangChain's ``Embeddings.embed_query`` / ``embed_documents`` split, with the query side
optional so an ``encode``-only embedder keeps working.

Example:
    >>> import numpy as np
    >>> class Ones:                          # structural: no inheritance needed
    ...     dim = 3
    ...     def encode(self, texts, *, batch_size=64):
    ...         return np.ones((len(texts), 3), np.float32) / np.sqrt(3)
    >>> isinstance(Ones(), Embedder), isinstance(Ones(), QueryEmbedder)
    (True, False)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Embedder(Protocol):
    """Sentence embeddings. Rows of the result are unit-length float32, one per text, ``dim`` columns."""

    @property
    def dim(self) -> int:
        """Width of every vector this embedder returns."""
        ...

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        """Embed ``texts``: an array of shape ``(len(texts), dim)`` (``(0, dim)`` for no texts)."""
        ...


@runtime_checkable
class QueryEmbedder(Embedder, Protocol):
    """An :class:`Embedder` with its own path for search queries (the stored side still goes through ``encode``)."""

    def encode_query(self, text: str) -> np.ndarray:
        """One search query's unit-length float32 vector, shape ``(dim,)``, comparable with ``encode``'s rows."""
        ...


__all__ = ["Embedder", "QueryEmbedder"]
