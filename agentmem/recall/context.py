"""Contextual dense evidence for conversation turns: a turn scored together with its neighbours.

A reply ("Yeah, the one by the lake!") says little on its own; the turn before it carries the topic. Embedding
every turn together with its neighbours helped recall on LoCoMo (research/notes/retrieval-lab-notes.md), but a second embedding per
turn costs write time and must be redone when a neighbour is forgotten. The same context can be had at query
time from what the vector index already holds: the **mean cosine of a turn and its immediate session neighbours**
to the query. Only the head of the fused ranking is scored, so the cost is one vector search restricted to the
head's neighbours that the dense pool did not return (any backend: ``VectorIndex.query(..., ids=...)``).

Example:
    >>> class P:
    ...     def __init__(self, before, after): self.session_id, self.before, self.after = "s", before, after
    >>> context_cosines(["b"], {"b": P(["a"], ["c"])}, {"a": 0.9, "b": 0.3, "c": 0.6})
    {'b': 0.6}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agentmem.recall.retrieval import Placement


def neighbours(head: Sequence[str], places: Mapping[str, Placement]) -> set[str]:
    """The immediate session neighbours (one each side) of the ``head`` entries.

    Example:
        >>> class P:
        ...     def __init__(self, before, after): self.session_id, self.before, self.after = "s", before, after
        >>> sorted(neighbours(["b"], {"b": P(["a", "z"], ["c"])}))
        ['a', 'c']
    """
    out: set[str] = set()
    for entry_id in head:
        place = places.get(entry_id)
        if place is not None:
            out.update(place.before[:1])
            out.update(place.after[:1])
    return out


def context_cosines(head: Sequence[str], places: Mapping[str, Placement],
                    cosine: Mapping[str, float]) -> dict[str, float]:
    """For each ``head`` entry with a cosine: the mean cosine of it and its immediate neighbours that have one."""
    out: dict[str, float] = {}
    for entry_id in head:
        if entry_id not in cosine:
            continue
        place = places.get(entry_id)
        near = [*place.before[:1], *place.after[:1]] if place is not None else []
        values = [cosine[entry_id], *(cosine[n] for n in near if n in cosine)]
        out[entry_id] = sum(values) / len(values)
    return out


__all__ = ["context_cosines", "neighbours"]
