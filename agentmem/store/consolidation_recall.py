"""Recall-time consolidation (``consolidation="local"`` or ``"llm"``): what recall does with versions and conflicts.

Two steps between the store's ranking and the ``k`` hits returned:

* **versions stand for their successor** — a superseded entry that the query finds (its wording often matches the
  question better than the replacement's: "My favorite food is sushi" vs "risotto is my favourite food now") hands
  its place in the ranking to the active entry at the end of its ``superseded_by`` chain. The old text stays hidden;
  the current value takes the rank the old statement earned. Where nothing is superseded (most conversation
  transcripts) nothing changes.
* **newer ranks first** — of two recalled memories of one speaker that the pairwise model scores as conflicting
  (:meth:`agentmem.store.consolidation.LocalConsolidator.conflicts`; never two turns of one conversation session),
  the newer moves before the older and the older a few places down
  (:func:`agentmem.store.consolidation.demote_older`); recall fetches ``DEMOTE`` extra candidates for it.

Both can be switched off (``MemoryConfig.recall_follows_versions``, ``MemoryConfig.recall_conflict_demotion``): the
ablations of ``benchmarks/knowledge_update.py`` go through these switches.

Example:
    >>> class R:
    ...     def __init__(self, id, status="active", superseded_by=None):
    ...         self.id, self.status, self.superseded_by = id, status, superseded_by
    >>> class S:
    ...     def __init__(self, row, score=0.5, scores=None): self.row, self.score, self.scores = row, score, scores or {}
    >>> found = [S(R("old", "superseded", "new")), S(R("x")), S(R("new"))]
    >>> rows = {"new": R("new")}
    >>> [s.row.id for s in follow_versions(found, lambda ids: [rows[i] for i in ids if i in rows], lambda r: True)]
    ['new', 'x']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from agentmem.store.lifecycle import ACTIVE, SUPERSEDED

CHAIN = 8  # longest superseded_by chain followed (a longer one is cut: the hit is dropped)


class _Row(Protocol):
    id: str
    status: str
    superseded_by: str | None


class _Scored(Protocol):
    row: Any
    score: float
    scores: dict[str, float]


def follow_versions(found: Sequence[_Scored], rows_of: Callable[[list[str]], Sequence[Any]],
                    admits: Callable[[Any], bool]) -> list[Any]:
    """Replace each superseded hit by the active entry that superseded it (following the chain), at the superseded
    hit's place, each entry once (at its best place); hits that are neither active nor superseded (retracted) and
    successors the recall scope does not admit are dropped. ``found`` holds active and superseded rows, best first;
    ``rows_of(ids)`` loads catalog rows, ``admits(row)`` is the recall scope's test.

    Example:
        >>> follow_versions([], lambda ids: [], lambda r: True)
        []
    """
    current: dict[str, Any] = {s.row.id: s.row for s in found}
    pending = {s.row.superseded_by for s in found if s.row.status == SUPERSEDED and s.row.superseded_by}
    for _ in range(CHAIN):  # load successors level by level (a chain of updates: A -> B -> C)
        pending -= current.keys()
        if not pending:
            break
        loaded = list(rows_of(sorted(pending)))
        current.update((r.id, r) for r in loaded)
        pending = {r.superseded_by for r in loaded if r.status == SUPERSEDED and r.superseded_by}
    out: list[Any] = []
    seen: set[str] = set()
    for hit in found:
        row = hit.row
        for _ in range(CHAIN):
            if row is None or row.status != SUPERSEDED:
                break
            row = current.get(row.superseded_by or "")
        if row is None or row.status != ACTIVE or row.id in seen or not admits(row):
            continue
        seen.add(row.id)
        # the successor takes the old hit's place and rank score; the old text's cosine / BM25 are not its own
        out.append(hit if row is hit.row else type(hit)(row, hit.score, {"rank": hit.scores.get("rank", hit.score)}))
    return out


__all__ = ["CHAIN", "follow_versions"]
