"""Port: the dense index, one namespace per user, keyed by entry id.

Vectors are derived data: the catalog is the source of truth, and a vector without a committed or pending row is
garbage. Every method is scoped by user so that no query can reach another user's vectors.

Example:
    >>> from agentmem.ports.vectors import VectorIndex
    >>> def nearest(index: VectorIndex, vec, user: str) -> list[str]:
    ...     return [i for i, _ in index.query(vec, user_id=user, n=3)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class VectorIndex(Protocol):
    """Add / delete / query / list ids, per user.

    ``metadatas`` carry only scoping fields (``kind``, ``session_id``); ``where`` filters on them with Chroma's
    operator dialect (``{"kind": {"$in": [...]}}``, ``{"$and": [...]}``), which every backend accepts.
    Visibility: a vector added by any process must be returned by a query issued after ``add`` returned there
    (each backend documents how; see docs/backends.md).
    """

    def add(self, user_ids: Sequence[str], ids: Sequence[str], vectors: np.ndarray,
            metadatas: Sequence[dict[str, Any]], documents: Sequence[str] | None = None) -> None:
        """Upsert one vector per id (``user_ids[i]`` owns ``ids[i]``); re-adding an id replaces it."""
        ...

    def delete(self, ids: Sequence[str], *, user_id: str | None = None) -> None:
        """Remove ids from ``user_id``'s namespace (``None``: from every namespace). Missing ids are ignored."""
        ...

    def query(self, vector: np.ndarray, *, user_id: str, n: int, where: dict[str, Any] | None = None,
              ids: Sequence[str] | None = None) -> list[tuple[str, float]]:
        """The ``n`` nearest of ``user_id``'s vectors as ``[(id, cosine similarity)]``, best first.

        ``ids`` restricts the search to those ids.
        """
        ...

    def erase_residue(self, user_ids: Sequence[str]) -> None:
        """After deletes: make erased vectors leave the backend's files where it keeps them (drop an emptied
        user's namespace, compact what still holds deleted rows)."""
        ...

    def user_ids(self, user_id: str) -> list[str]:
        """Every id stored for ``user_id`` (for checks and erasure)."""
        ...

    def all_ids(self) -> list[str]:
        """Every id of every user (``verify()`` only: O(store))."""
        ...

    def count(self) -> int:
        """How many vectors the index holds in all."""
        ...

    def close(self) -> None:
        """Release clients and handles (the data stays)."""
        ...


__all__ = ["VectorIndex"]
