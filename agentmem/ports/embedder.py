"""Port: text → L2-normalised float32 vectors.

``Embedder`` is what every embedder implements: ``dim`` and ``encode`` (the stored side, and the query side too
unless the embedder says otherwise). An embedder whose queries take another path — an asymmetric model's query
prompt, or MiniLM's int8 query graph — also implements ``encode_query`` and so is a ``QueryEmbedder``;
:func:`embed_query` is how the store embeds a search query through either. This follows LangChain's
``Embeddings.embed_query`` / ``embed_documents`` split, with the query side optional so an ``encode``-only
embedder keeps working.

Example:
    >>> import numpy as np
    >>> class Ones:                          # structural: no inheritance needed
    ...     dim = 3
    ...     def encode(self, texts, *, batch_size=64):
    ...         return np.ones((len(texts), 3), np.float32) / np.sqrt(3)
    >>> isinstance(Ones(), Embedder), isinstance(Ones(), QueryEmbedder)
    (True, False)
    >>> embed_query(Ones(), "anything").shape
    (3,)
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


def embed_query(embedder: Embedder, text: str) -> np.ndarray:
    """``text``'s vector as a search query: ``encode_query`` where the embedder has one, else ``encode``'s row.

    Example:
        >>> import numpy as np
        >>> class Twos:
        ...     dim = 2
        ...     def encode(self, texts, *, batch_size=64):
        ...         return np.full((len(texts), 2), np.sqrt(0.5), np.float32)
        >>> embed_query(Twos(), "hi").tolist() == Twos().encode(["hi"])[0].tolist()
        True
    """
    # the structural test isinstance(embedder, QueryEmbedder) would make, without its cost: on a runtime Protocol
    # isinstance evaluates every member, ``dim`` included (~1 ms for MiniLM), and this runs once per recall
    encode_query = getattr(embedder, "encode_query", None)
    return encode_query(text) if callable(encode_query) else embedder.encode([text])[0]


__all__ = ["Embedder", "QueryEmbedder", "embed_query"]
