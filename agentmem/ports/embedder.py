"""Port: text → L2-normalised float32 vectors.

Example:
    >>> import numpy as np
    >>> class Ones:                          # structural: no inheritance needed
    ...     dim = 3
    ...     def encode(self, texts, *, batch_size=64):
    ...         return np.ones((len(texts), 3), np.float32) / np.sqrt(3)
    >>> isinstance(Ones(), Embedder)
    True
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


__all__ = ["Embedder"]
