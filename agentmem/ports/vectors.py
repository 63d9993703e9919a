"""Port: the dense index, one namespace per user, keyed by entry id.

Vectors are derived data: the catalog is the source of truth, and a vector without a committed or pending row is
garbage. Every method is scoped by user so that no query can reach another user's vectors.

An entry may have a vector in more than one *space*: ``""`` holds the entries' own vectors (the embedded memory
line), :data:`CONTEXT_SPACE` a conversation turn's context vector (its own vector plus its predecessor's,
normalised: :mod:`agentmem.entries.context_vectors`). Spaces are separate namespaces (a collection or table each);
``delete`` removes an id from every space, so erasing an entry erases all of its vectors.

Example:
    >>> from agentmem.ports.vectors import VectorIndex
    >>> def nearest(index: VectorIndex, vec, user: str) -> list[str]:
    ...     return [i for i, _ in index.query(vec, user_id=user, n=3)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from agentmem.errors import InvalidInputError

CONTEXT_SPACE = "context"  # turn context vectors (agentmem.entries.context_vectors)
SPACES = ("", CONTEXT_SPACE)  # every space an index keeps: "" (the entries' own vectors) first


def check_space(space: str) -> str:
    """``space`` if it is one of :data:`SPACES`, else :class:`InvalidInputError` (backends put it in names).

    Example:
        >>> check_space("context")
        'context'
    """
    if space not in SPACES:
        raise InvalidInputError(f"space: expected one of {SPACES}, got {space!r}")
    return space


@runtime_checkable
class VectorIndex(Protocol):
    """Add / delete / query / list ids, per user.

    ``metadatas`` carry only scoping fields (``kind``, ``session_id``); ``where`` filters on them with Chroma's
    operator dialect (``{"kind": {"$in": [...]}}``, ``{"$and": [...]}``), which every backend accepts.
    Visibility: a vector added by any process must be returned by a query issued after ``add`` returned there
    (each backend documents how; see docs/backends.md).
    """

    def add(self, user_ids: Sequence[str], ids: Sequence[str], vectors: np.ndarray,
            metadatas: Sequence[dict[str, Any]], documents: Sequence[str] | None = None, *, space: str = "") -> None:
        """Upsert one vector per id (``user_ids[i]`` owns ``ids[i]``) into ``space``; re-adding an id replaces it."""
        ...

    def get(self, user_id: str, ids: Sequence[str], *, space: str = "") -> dict[str, np.ndarray]:
        """The stored vectors of ``ids`` in ``user_id``'s ``space`` (missing ids are left out)."""
        ...

    def delete(self, ids: Sequence[str], *, user_id: str | None = None) -> None:
        """Remove ids from ``user_id``'s namespace in every space (``None``: from every namespace). Missing ids
        are ignored."""
        ...

    def query(self, vector: np.ndarray, *, user_id: str, n: int, where: dict[str, Any] | None = None,
              ids: Sequence[str] | None = None, space: str = "") -> list[tuple[str, float]]:
        """The ``n`` nearest of ``user_id``'s vectors in ``space`` as ``[(id, cosine similarity)]``, best first.

        ``ids`` restricts the search to those ids.
        """
        ...

    def query_spaces(self, vector: np.ndarray, *, user_id: str, n: int | Sequence[int], spaces: Sequence[str],
                     where: dict[str, Any] | None = None,
                     ids: Sequence[str] | None = None) -> list[list[tuple[str, float]]]:
        """:meth:`query` in each of ``spaces``, one result list per space in their order: for every space the
        same hits as ``query(vector, ..., space=s)``. ``n``: one count for every space, or one per space (recall
        can ask the context space for fewer, ``RetrievalParams.context_pool``; :func:`per_space` spells it out).
        Recall searches the entries' own space and :data:`CONTEXT_SPACE` with one query vector; a backend may run
        the searches side by side (embedded Chroma) or one after the other (:func:`query_each_space`). A space the
        user holds nothing in gives ``[]``.
        """
        ...

    def erase_residue(self, user_ids: Sequence[str]) -> None:
        """After deletes: make erased vectors leave the backend's files where it keeps them (drop an emptied
        user's namespace, compact what still holds deleted rows)."""
        ...

    def user_ids(self, user_id: str, *, space: str = "") -> list[str]:
        """Every id stored for ``user_id`` in ``space`` (for checks and erasure)."""
        ...

    def has_any(self, user_id: str, *, space: str = "") -> bool:
        """Whether ``user_id`` holds at least one vector in ``space``: O(1), not O(user's store) like
        ``user_ids`` (a write's check whether a user's context vectors need back-filling)."""
        ...

    def all_ids(self) -> list[str]:
        """Every id of every user, in every space (``verify()`` only: O(store))."""
        ...

    def count(self) -> int:
        """How many vectors the index holds in all (every space)."""
        ...

    def close(self) -> None:
        """Release clients and handles (the data stays)."""
        ...


def per_space(n: int | Sequence[int], spaces: Sequence[str]) -> list[int]:
    """:meth:`VectorIndex.query_spaces`'s ``n`` as one count per space.

    Example:
        >>> per_space(100, ("", CONTEXT_SPACE)), per_space((100, 50), ("", CONTEXT_SPACE))
        ([100, 100], [100, 50])
    """
    counts = [n] * len(spaces) if isinstance(n, int) else list(n)
    if len(counts) != len(spaces):
        raise ValueError(f"{len(counts)} counts for {len(spaces)} spaces")
    return counts


def query_each_space(index: VectorIndex, vector: np.ndarray, *, user_id: str, n: int | Sequence[int],
                     spaces: Sequence[str],
                     where: dict[str, Any] | None = None,
                     ids: Sequence[str] | None = None) -> list[list[tuple[str, float]]]:
    """:meth:`VectorIndex.query_spaces` by one :meth:`~VectorIndex.query` per space in turn: the implementation
    of a backend that cannot search its spaces side by side.

    Example:
        >>> class One:  # any index with query(); here each space holds one id named after it
        ...     def query(self, vector, *, user_id, n, where=None, ids=None, space=""):
        ...         return [(space or "own", 1.0)]
        >>> query_each_space(One(), np.ones(2), user_id="u", n=1, spaces=("", CONTEXT_SPACE))
        [[('own', 1.0)], [('context', 1.0)]]
    """
    return [index.query(vector, user_id=user_id, n=c, where=where, ids=ids, space=s)
            for s, c in zip(spaces, per_space(n, spaces))]


def where_clause(**fields: Any) -> dict[str, Any] | None:
    """A ``where`` in the port's operator dialect from the non-None scoping fields (lists become ``$in``).

    Example:
        >>> where_clause(session_id=None, kind=["turn", "fact"])
        {'kind': {'$in': ['turn', 'fact']}}
        >>> where_clause(session_id="s1", kind="turn")
        {'$and': [{'session_id': 's1'}, {'kind': 'turn'}]}
    """
    clauses = []
    for key, value in fields.items():
        if value is None:
            continue
        clauses.append({key: {"$in": list(value)}} if isinstance(value, (list, tuple)) else {key: value})
    if not clauses:
        return None
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


__all__ = ["CONTEXT_SPACE", "SPACES", "VectorIndex", "check_space", "per_space", "query_each_space", "where_clause"]
