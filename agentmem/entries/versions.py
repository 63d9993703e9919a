"""Recall-time consolidation (``consolidation="local"`` or ``"llm"``): what recall does with versions and conflicts.

Two steps between the store's ranking and the ``k`` hits returned:

* **versions stand for their successor** — a superseded entry that the query finds (its wording often matches the
  question better than the replacement's: "My favorite food is sushi" vs "risotto is my favourite food now") hands
  its place in the ranking to the active entry at the end of its ``superseded_by`` chain. The old text stays hidden;
  the current value takes the rank the old statement earned. Where nothing is superseded (most conversation
  transcripts) nothing changes.
* **newer ranks first** — of two recalled memories of one speaker that the pairwise model scores as conflicting
  (:meth:`agentmem.consolidate.local.LocalConsolidator.conflicts`; never two turns of one conversation session),
  the newer moves before the older and the older a few places down
  (:func:`agentmem.consolidate.local.demote_older`); recall looks at
  :func:`~agentmem.consolidate.local.demotion_pool` candidates for it (``DEMOTE`` more than asked, at least 11)
  and checks the first ``CHECKED`` (11) of them for conflicts whatever ``k``.

Both can be switched off (``MemoryConfig.recall_follows_versions``, ``MemoryConfig.recall_conflict_demotion``): the
ablations of ``benchmarks/knowledge_update.py`` go through these switches.

Example:
    >>> class R:
    ...     def __init__(self, id, status="active", superseded_by=None):
    ...         self.id, self.status, self.superseded_by = id, status, superseded_by
    >>> rows = {"old": R("old", "superseded", "mid"), "x": R("x"), "new": R("new")}
    >>> now = current_versions([rows["old"], rows["x"]], {"old": "new"}, rows)
    >>> {k: v.id for k, v in now.items()}
    {'old': 'new', 'x': 'x'}
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from agentmem.entries.lifecycle import ACTIVE, SUPERSEDED

# longest superseded_by chain followed (a longer one is cut: the hit is dropped). One recursive query follows a
# chain of any length, so the cap only guards against a cycle; 8 dropped the current value of a fact updated 9+
# times (a third of recall_latency.py's 10,000-entry store)
CHAIN = 64


class _Row(Protocol):
    id: str
    status: str
    superseded_by: str | None


def current_versions(found: Sequence[_Row], ends: Mapping[str, str], rows: Mapping[str, Any]) -> dict[str, Any]:
    """Each found row's current version, by the found row's id: an active row stands for itself, a superseded one
    for the active entry at the end of its ``superseded_by`` chain; rows that are neither (retracted), and chains
    that end on anything but an active entry (cut after :data:`CHAIN` links, retracted, or not loaded), are left
    out.

    ``ends`` maps superseded ids to their chain's last id (:meth:`agentmem.entries.lifecycle.Lifecycle.chain_ends`,
    one query for a whole candidate pool); ``rows`` holds the loaded catalog rows, chain ends included.

    Example:
        >>> current_versions([], {}, {})
        {}
    """
    out: dict[str, Any] = {}
    for row in found:
        current = row if row.status != SUPERSEDED else rows.get(ends.get(row.id, ""))
        if current is not None and current.status == ACTIVE:
            out[row.id] = current
    return out


def pages(ranked: Sequence[tuple[str, float]], size: int, ends: dict[str, str],
          ends_of: Callable[[list[str]], Mapping[str, str]] | None = None) -> Iterator[list[tuple[str, float]]]:
    """``ranked`` cut into consecutive pages that each bring ``size`` entries not seen on an earlier page, counting
    a superseded candidate as its chain's end (``ends``): where superseded candidates share a successor, a page
    reaches further down the ranking, so one page of rows usually fills the re-ranking head.

    With ``ends_of`` (:meth:`agentmem.entries.lifecycle.Lifecycle.chain_ends`), ``ends`` is filled as the walk goes:
    the chains of the next ``2 * size`` candidates in one query when the walk reaches them (most recalls need one
    query; the whole pool at once would cost five times as much). A page's ends are known when it is yielded.

    Example:
        >>> [[i for i, _ in p] for p in pages([("a", 3.0), ("b", 2.0), ("c", 1.0)], 1, {"a": "c"})]
        [['a'], ['b', 'c']]
        >>> [[i for i, _ in p] for p in pages([("a", 3.0), ("c", 2.0), ("b", 1.0)], 1, {"a": "c"})]
        [['a', 'c'], ['b']]
    """
    seen: set[str] = set()
    page: list[tuple[str, float]] = []
    fresh, known = 0, 0 if ends_of is not None else len(ranked)
    for n, item in enumerate(ranked):
        if n >= known and ends_of is not None:
            chunk = [i for i, _ in ranked[n : n + 2 * size]]
            ends.update(ends_of(chunk))
            known = n + len(chunk)
        current = ends.get(item[0], item[0])
        if current not in seen:
            if fresh == size:
                yield page
                page, fresh = [], 0
            seen.add(current)
            fresh += 1
        page.append(item)
    if page:
        yield page


__all__ = ["CHAIN", "current_versions", "pages"]
