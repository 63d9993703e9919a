"""The order recall gives one query's candidates: the pure ranking steps, shared by ``EntryStore._ranked`` and the
LoCoMo benchmarks (``benchmarks/locomo.py``'s ``ranking``), so a change to the ranking is made in one place.

The query is parsed once (:func:`agentmem.recall.query.parse_query`) and the :class:`~agentmem.recall.query.QueryInfo`
passed to every step. The steps: the query's own parameters (:func:`agentmem.recall.multihop.for_query`), fusion, spillover and the
session boost (:func:`agentmem.recall.retrieval.rank_parts`), best first, the head widened by the pools' best
(:func:`agentmem.recall.head_cues.widen`, with ``head_reserve`` and the learned order), the head's rows read by the
caller (``load``: the store pages its rows in, filters them by scope and follows versions; a benchmark reads them
from a dict), the hand-set re-ranking (:func:`agentmem.recall.rerank.rerank`) and the learned re-ordering
(:func:`agentmem.recall.learned_rank.reorder`, by default with the shipped weights), then the tail the caller kept
after the head. The steps before the learned order are :func:`head_of`, which the LoCoMo ablations also call with
other head depths and widenings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from agentmem.recall.head_cues import widen
from agentmem.recall.learned_rank import HeadModel, reorder
from agentmem.recall.multihop import for_query
from agentmem.recall.query import QueryInfo, as_query
from agentmem.recall.rerank import HeadEntry, rerank
from agentmem.recall.retrieval import Candidates, RetrievalParams, best_first, rank_parts

Ranked = list[tuple[str, float]]
# (the ranked candidates, best first, and the head's depth) -> (the head's entries, the ranked rest after them)
HeadLoader = Callable[[Ranked, int], tuple[list[HeadEntry], Ranked]]


class Head(NamedTuple):
    """One query's head before the learned order, and what the learned order reads besides it."""

    params: RetrievalParams  # the query's own parameters (multihop.for_query)
    entries: list[HeadEntry]  # the head's rows, with the scores before re-ranking
    order: Ranked  # the head re-ranked by the hand-set boosts (rerank.rerank), best first
    fused: dict[str, float]  # the scores before spillover (retrieval.rank_parts)
    spilled: dict[str, float]  # the scores after spillover, before the session boost
    tail: Ranked  # the ranked candidates the loader kept after the head


def head_of(query: str | QueryInfo, cands: Candidates, params: RetrievalParams, depth: int, reserve: int,
            load: HeadLoader) -> Head:
    """The head of ``depth`` candidates (widened by the best ``reserve`` of the dense and turn-context pools when
    ``reserve`` > 0) in the hand-set order: the steps of :func:`rank_candidates` before the learned order, which
    the LoCoMo ablations also take with other depths and widenings (their ``load`` may widen further).

    Example:
        >>> rows = {"a": ("Ann", "[1 May 2023] Ann: I went hiking"), "b": ("Bob", "[1 May 2023] Bob: where to?")}
        >>> def load(ranked, depth):
        ...     return [HeadEntry(i, s, *rows[i]) for i, s in ranked[:depth]], ranked[depth:]
        >>> h = head_of("Where did Bob go?", Candidates({"a": 0.6, "b": 0.5}, {}), RetrievalParams(), 1, 0, load)
        >>> [e.id for e in h.entries], [i for i, _ in h.tail]
        (['a'], ['b'])
    """
    query = as_query(query)  # parsed once for every step below
    params = for_query(params, query)  # a list question: a weaker session boost (store.multihop)
    scores, fused, spilled = rank_parts(cands, params)
    ranked = best_first(scores)
    if reserve:  # the pools' best join the head the learned order sees
        ranked, depth = widen(ranked, cands, depth, reserve)
    entries, tail = load(ranked, depth)
    # the head is re-ranked with what only rows tell (speaker, time expressions); boosts are >= 1, so the head never
    # falls below the rows not loaded
    return Head(params, entries, rerank(query, entries, params), fused, spilled, tail)


def rank_candidates(query: str | QueryInfo, cands: Candidates, params: RetrievalParams, k: int, load: HeadLoader,
                    model: HeadModel = HeadModel(), head_k: int | None = None) -> Ranked:
    """The best ``k`` of ``cands`` as (id, score), best first: the order ``recall`` returns.

    ``load(ranked, depth)`` gets every scored candidate best first and the head's depth (``max(2k, rerank_depth)``,
    plus the pools' best the widening moved up); it returns the head's entries (at most ``depth``, the rows'
    speaker and memory line with the ranked score) and the ranked candidates after them. The store drops there the
    rows its scope rejects and swaps in current versions; with every row admitted it is the plain split below.
    ``model``: the learned order's weights (:class:`agentmem.recall.learned_rank.HeadModel`, default the shipped
    ones; a benchmark passes refitted ones). ``head_k``: the k the head is sized for (default ``k``): recall asks
    for a few hits more than it returns (its conflict check's look-ahead) and sizes the head for what it returns,
    so its top k is the order the learned head was fitted on, whatever the look-ahead.

    Example:
        >>> rows = {"a": ("Ann", "[1 May 2023] Ann: I went hiking"), "b": ("Bob", "[1 May 2023] Bob: where to?")}
        >>> def load(ranked, depth):
        ...     return [HeadEntry(i, s, *rows[i]) for i, s in ranked[:depth]], ranked[depth:]
        >>> cands = Candidates({"a": 0.6, "b": 0.5}, {"a": 2.0, "b": 3.0})
        >>> [i for i, _ in rank_candidates("Where did Ann go?", cands, RetrievalParams(), 5, load)]
        ['a', 'b']
    """
    query = as_query(query)  # the query parsed once: every step reads this QueryInfo
    reserve = params.head_reserve if params.learned_head else 0  # widened only for the learned order
    head = head_of(query, cands, params, max(2 * (k if head_k is None else head_k), params.rerank_depth), reserve,
                   load)
    order = head.order
    if params.learned_head:  # agentmem.recall.learned_rank: the head re-ordered, its scores kept in order
        order = reorder(query, head.entries, order, cands, head.fused, head.spilled, head.params, model)
    return (order + list(head.tail))[:k]


__all__ = ["Head", "HeadLoader", "Ranked", "head_of", "rank_candidates"]
