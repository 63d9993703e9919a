"""Hybrid scoring: dense (cosine) and lexical (BM25) evidence fused into one score, then spread along the
conversation it came from.

Why this fusion: on conversational memory BM25 alone beats MiniLM alone, and rank fusion (RRF) throws away
how *much* better the top lexical match is. We keep the scores: dense cosine is min-max scaled over the
candidate pool, BM25 is divided by the best BM25 of the query (so an absent lexical match is 0, not the
pool minimum), and the two are averaged with equal weight.

Then the conversation's structure: an answer often sits in the reply to the turn that matched the question, or
a turn or two further on ("context spillover": a turn passes ``SPILLOVER ** d`` of its score to the turns at
distance d ≤ 2 in its session), and the turns that answer one question tend to share a session (each candidate
gains ``SESSION_WEIGHT`` times the best score in its session: a session that matched well lifts its other turns).

Measured on the LoCoMo dev half (docs/retrieval.md). The constants are round values, not fitted: spillover 0.1 /
0.25 / 0.5 gave recall@5 within 0.01 of each other; the session weight's optimum is flat between 0.4 and 0.75,
and 0.5 says "a turn's session counts half as much as the turn".

Example:
    >>> scores = fuse({"a": 0.9, "b": 0.85, "c": 0.5}, {"b": 12.0})   # b: nearly the best cosine and a BM25 hit
    >>> sorted(scores, key=scores.get, reverse=True)
    ['b', 'a', 'c']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

DENSE_WEIGHT = 0.5  # equal weight: no retriever is favoured a priori
SPILLOVER = 0.25  # share of a turn's score passed to its neighbours (squared for the turns two away)
SESSION_WEIGHT = 0.5  # how much the best score of a candidate's session adds to its own


class Placement(Protocol):
    """Where an entry sits in its conversation (see :class:`agentmem.store.catalog.TurnContext`)."""

    session_id: str | None
    before: Sequence[str]  # nearest first
    after: Sequence[str]


def fuse(dense: Mapping[str, float], lexical: Mapping[str, float], *, dense_weight: float = DENSE_WEIGHT) -> dict[str, float]:
    """Combine cosine similarities and BM25 scores (higher is better) into one score in [0, 1]."""
    scaled_dense: dict[str, float] = {}
    if dense:
        lo, hi = min(dense.values()), max(dense.values())
        span = hi - lo
        scaled_dense = {i: ((s - lo) / span if span > 0 else 1.0) for i, s in dense.items()}
    scaled_lex: dict[str, float] = {}
    if lexical:
        best = max(lexical.values())
        scaled_lex = {i: (s / best if best > 0 else 0.0) for i, s in lexical.items()}
    return {
        i: dense_weight * scaled_dense.get(i, 0.0) + (1 - dense_weight) * scaled_lex.get(i, 0.0)
        for i in scaled_dense.keys() | scaled_lex.keys()
    }


def spill_over(scores: Mapping[str, float], places: Mapping[str, Placement], *, share: float = SPILLOVER) -> dict[str, float]:
    """Add ``share ** d`` of each entry's score to the turns ``d`` steps before and after it (which may be new
    candidates).

    >>> class P:  # b sits between a and c
    ...     def __init__(self, before, after): self.session_id, self.before, self.after = "s", before, after
    >>> spill_over({"b": 1.0}, {"b": P(["a"], ["c", "d"])})
    {'b': 1.0, 'a': 0.25, 'c': 0.25, 'd': 0.0625}
    """
    out = dict(scores)
    for entry_id, score in scores.items():
        place = places.get(entry_id)
        if place is None:
            continue
        for side in (place.before, place.after):
            for distance, neighbour in enumerate(side, start=1):
                out[neighbour] = out.get(neighbour, 0.0) + share**distance * score
    return out


def session_boost(scores: Mapping[str, float], session_of: Mapping[str, str | None], *,
                  weight: float = SESSION_WEIGHT) -> dict[str, float]:
    """Add ``weight`` × the best score in each entry's session (entries without a session are unchanged).

    >>> session_boost({"a": 1.0, "b": 0.2, "c": 0.4}, {"a": "s1", "b": "s1", "c": None})
    {'a': 1.5, 'b': 0.7, 'c': 0.4}
    """
    best: dict[str, float] = {}
    for entry_id, score in scores.items():
        session = session_of.get(entry_id)
        if session is not None:
            best[session] = max(best.get(session, 0.0), score)
    out = dict(scores)
    for entry_id, score in scores.items():
        session = session_of.get(entry_id)
        if session is not None:
            out[entry_id] = score + weight * best[session]
    return out


__all__ = ["DENSE_WEIGHT", "SESSION_WEIGHT", "SPILLOVER", "Placement", "fuse", "session_boost", "spill_over"]
