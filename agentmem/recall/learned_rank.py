"""The head of the ranking re-ordered by a small learned model over the evidence recall already has.

After fusion, spillover, the session boost and the hand-set re-ranking (:mod:`agentmem.recall.rerank`), the head
(the best ``rerank_depth`` candidates, whose rows are loaded anyway) is re-ordered by a logistic model
P(evidence | features): how the entry scored in each pool (scaled cosine, BM25, context cosine, and its rank in
each), what the conversation added (spillover, its session's best), who spoke and whether the question names them,
whether it dates an event on a "when" question, whether it is itself a question, its length, and the list-question
flag, and four question-text cues (:mod:`agentmem.recall.head_cues`: the question words a turn repeats, plain and
rarity-weighted, the share of the head from its session, and a list question's first turn of each session). With
``RetrievalParams.head_reserve`` (20) the head also holds the best 20 of the dense and turn-context pools, so a turn
the fused order buried but one pool tops can be lifted. No extra search: ~19 more rows read (LoCoMo), ~24
multiply-adds per head entry.

The weights were trained on LoCoMo dev questions (``research/learned_ablation.py --signals ltr --reserve 20
--monotone dense``: fitted on 4 conversations, scored on the 5th; the constants are the median of the five fold
fits), with the weights of the dense and context features held >= 0: more similar never
ranks lower (an unconstrained fit gave the cosine a negative weight "given the rest", and put a BM25 top over the
cosine top in small stores). Held-out recall@5 / @10 0.7205 / 0.8024 (hand-set order) → 0.748 / 0.817
(research/notes/retrieval-lab-notes.md, session 10). The entries keep the head's scores in
their sorted order (the n-th entry gets the n-th best score), so ``Hit.scores["rank"]`` still falls down the list
(``Hit.score`` is read from each hit alone: :mod:`agentmem.recall.calibration`). ``RetrievalParams(learned_head=False)``
switches it off.

Example:
    >>> from agentmem.recall.rerank import HeadEntry
    >>> from agentmem.recall.retrieval import Candidates
    >>> head = [HeadEntry("q", 1.0, "Ann", "[1 May 2023] Ann: where did you go?"),
    ...         HeadEntry("a", 0.9, "Bob", "[1 May 2023] Bob: I went hiking in the Alps with my brother last week")]
    >>> cands = Candidates({"q": 0.6, "a": 0.5}, {"q": 3.0, "a": 2.5})
    >>> [i for i, _ in reorder("Where did Bob go?", head, [("q", 1.0), ("a", 0.9)], cands, {}, {}, RetrievalParams())]
    ['a', 'q']
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from agentmem.recall.head_cues import CUES, cue_columns
from agentmem.recall.query import QueryInfo, as_query
from agentmem.recall.rerank import HeadEntry
from agentmem.recall.retrieval import Candidates, RetrievalParams, best_first
from agentmem.recall.temporal import mentions_time
from agentmem.recall.weights_file import bundled

FEATURES = ("share", "score", "dense", "in_dense", "lexical", "in_lexical", "context", "spill", "session_best",
            "speaker_match", "speaker_other", "time", "list_share", "list_session", "length", "dense_rank",
            "lexical_rank", "context_rank", "head_rank", "is_question")

# the question-text cues the model also reads (agentmem.recall.head_cues; "session_first" left out: it learnt to push
# down the first turn of a one-session head, the "sister's name" recall of tests/unit/test_memory_store.py)
HEAD_CUES = ("overlap", "rare_overlap", "session_mass", "list_first")

# the bundled weights file's "head_model" group (agentmem/recall/weights/ranking.json, with its provenance): the
# median of the five fold fits (each on 4 LoCoMo dev conversations), in FEATURES + HEAD_CUES order, per unit of each
# raw feature (research/notes/retrieval-lab-notes.md, session 10)
_DEFAULTS = bundled("head_model")
WEIGHTS: tuple[float, ...] = tuple(_DEFAULTS["weights"])
BIAS: float = _DEFAULTS["bias"]
BLEND: float = _DEFAULTS["blend"]  # the order follows BLEND × the logit + (1 - BLEND) × 10 × the entry's top share


_CUE_COLUMNS = [CUES.index(c) for c in HEAD_CUES]


@dataclass(frozen=True)
class HeadModel:
    """The logistic model's weights (``FEATURES`` order, then :data:`HEAD_CUES`' when there are that many), its
    bias, and the blend with the hand-set order.

    Example:
        >>> len(HeadModel().weights) == len(FEATURES) + len(HEAD_CUES)
        True
    """

    weights: tuple[float, ...] = WEIGHTS
    bias: float = BIAS
    blend: float = BLEND

    @property
    def cues(self) -> bool:
        """Whether the weights also cover the question-text cues (:data:`HEAD_CUES`), after ``FEATURES``'.

        Example:
            >>> HeadModel().cues, HeadModel(weights=(0.0,) * len(FEATURES)).cues
            (True, False)
        """
        return len(self.weights) == len(FEATURES) + len(HEAD_CUES)


def _scaled(scores: Mapping[str, float], wanted: set[str]) -> dict[str, float]:
    """Min-max scaled over the whole pool, kept for the ``wanted`` ids only (the head)."""
    if not scores:
        return {}
    lo, hi = min(scores.values()), max(scores.values())
    return {i: (scores[i] - lo) / (hi - lo) if hi > lo else 1.0 for i in wanted if i in scores}


def _ranks(scores: Mapping[str, float], wanted: set[str]) -> dict[str, float]:
    """1 / (1 + rank in the pool) of the ``wanted`` ids (0 when absent from the pool)."""
    # equal scores by id (best_first): a pool's dict order differs between processes (ties in a pool are common
    # for repeated texts), and the rank must not
    return {i: 1.0 / (1 + r) for r, (i, _) in enumerate(best_first(scores)) if i in wanted}


def features(query: str | QueryInfo, head: Sequence[HeadEntry], order: Sequence[tuple[str, float]], cands: Candidates,
             fused: Mapping[str, float], spilled: Mapping[str, float], params: RetrievalParams) -> np.ndarray:
    """One row of ``FEATURES`` per entry of ``order`` (the re-ranked head), from what the ranking computed.

    ``head`` holds the rows' fields and the scores before re-ranking (the session-boosted scores), ``fused`` /
    ``spilled`` the scores before / after spillover (:func:`agentmem.recall.retrieval.rank_parts`), ``params``
    the query's own parameters (a list question's session weight).

    Example:
        >>> from agentmem.recall.retrieval import Candidates
        >>> h = [HeadEntry("a", 1.0, "Ann", "Ann: hi")]
        >>> features("hi?", h, [("a", 1.0)], Candidates({"a": 0.5}, {}), {"a": 1.0}, {"a": 1.0},
        ...          RetrievalParams()).shape
        (1, 20)
    """
    by_id = {h.id: h for h in head}
    wanted = set(by_id)
    dense, lexical = _scaled(cands.dense, wanted), {}
    best_lexical = max(cands.lexical.values(), default=0.0)
    if best_lexical > 0:
        lexical = {i: s / best_lexical for i, s in cands.lexical.items() if i in wanted}
    context = _scaled(cands.turn_context, wanted)
    ranks = [_ranks(pool, wanted) for pool in (cands.dense, cands.lexical, cands.turn_context)]
    query = as_query(query)
    speaker = query.the_named_speaker(h.speaker for h in head)
    timely, listed = query.asks_time, float(query.is_list)
    top = max((s for _, s in order), default=1.0) or 1.0
    weight = params.session_weight or 1.0
    rows = []
    for position, (entry_id, score) in enumerate(order):
        h = by_id[entry_id]
        body = h.body
        spill = spilled.get(entry_id, 0.0)
        session_best = (h.score - spill) / weight  # what the session boost added, in units of its weight
        share = score / top
        rows.append((share, score, dense.get(entry_id, 0.0), float(entry_id in cands.dense),
                     lexical.get(entry_id, 0.0), float(entry_id in cands.lexical), context.get(entry_id, 0.0),
                     spill - fused.get(entry_id, 0.0), session_best,
                     float(speaker is not None and h.speaker == speaker),
                     float(speaker is not None and h.speaker != speaker),
                     float(timely and mentions_time(body)), listed * share, listed * session_best,
                     math.log1p(len(body)), ranks[0].get(entry_id, 0.0), ranks[1].get(entry_id, 0.0),
                     ranks[2].get(entry_id, 0.0), 1.0 / (1 + position), float(body.rstrip().endswith("?"))))
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(FEATURES))


def reorder(query: str | QueryInfo, head: Sequence[HeadEntry], order: Sequence[tuple[str, float]], cands: Candidates,
            fused: Mapping[str, float], spilled: Mapping[str, float], params: RetrievalParams,
            model: HeadModel = HeadModel()) -> list[tuple[str, float]]:
    """``order`` (the re-ranked head, best first) re-ordered by the model; the n-th entry keeps the n-th score.

    Example: see the module docstring.
    """
    if len(order) < 2:
        return list(order)
    query = as_query(query)
    X = features(query, head, order, cands, fused, spilled, params)
    if model.cues:
        X = np.hstack([X, cue_columns(query, head, order, cands)[:, _CUE_COLUMNS]])
    logit = X @ np.asarray(model.weights) + model.bias
    key = model.blend * logit + (1 - model.blend) * 10.0 * X[:, 0]
    perm = sorted(range(len(order)), key=lambda n: (-key[n], n))
    scores = sorted((s for _, s in order), reverse=True)
    return [(order[n][0], scores[r]) for r, n in enumerate(perm)]


__all__ = ["BIAS", "BLEND", "FEATURES", "HEAD_CUES", "WEIGHTS", "HeadModel", "features", "reorder"]
