"""Optional abilities of a port implementation, each a small ``typing.Protocol``.

A part never probes a backend for an ability (no ``getattr`` / ``hasattr`` / ``isinstance`` on a port object
outside the factory, checked by tests/infra/test_architecture.py): :func:`agentmem.factory.build_store_parts` decides
once, when the store is opened, which abilities the parts it hands out have, and says so in plain fields
(:class:`agentmem.factory.StoreParts`). The conformance suites cover each ability on every backend that has it.

Example:
    >>> from agentmem.ports.abilities import JoinsCatalogTransaction
    >>> class Shared:                                  # structural: no inheritance needed
    ...     catalog = None
    ...     def add_in(self, transaction, user_ids, ids, vectors, metadatas, documents=None, *, space=""): ...
    >>> isinstance(Shared(), JoinsCatalogTransaction)
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class JoinsCatalogTransaction(Protocol):
    """A vector index kept in the catalog's own database (pgvector), which can write inside the catalog's insert
    transaction: row and vector then commit together, and nothing is ever in flight between them.

    ``catalog`` names the catalog whose transactions it joins; that catalog's ``insert`` takes ``extra=``, a
    callable given the open transaction.
    """

    catalog: Any

    def add_in(self, transaction: Any, user_ids: Sequence[str], ids: Sequence[str], vectors: np.ndarray,
               metadatas: Sequence[dict[str, Any]], documents: Sequence[str] | None = None, *,
               space: str = "") -> None:
        """:meth:`VectorIndex.add <agentmem.ports.vectors.VectorIndex.add>` inside ``transaction`` (the handle the
        catalog's ``insert(extra=...)`` passes)."""
        ...


__all__ = ["JoinsCatalogTransaction"]
