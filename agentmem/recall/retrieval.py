"""Hybrid scoring: dense (cosine) and lexical (BM25) evidence fused into one ranking score, spread along the
conversation it came from; then the head of the ranking is re-ranked (:mod:`agentmem.recall.rerank`) and every
hit is given a calibrated relevance read from the query and that hit alone (:mod:`agentmem.recall.calibration`).

Why this fusion: on conversational memory BM25 alone beats MiniLM alone, and rank fusion (RRF) throws away
how *much* better the top lexical match is. We keep the scores: dense cosine is min-max scaled over the
candidate pool, BM25 is divided by the best BM25 of the query (so an absent lexical match is 0, not the
pool minimum), and the two are averaged with ``dense_weight``. Scaling inside the pool ranks 0.03-0.04 recall
better than any absolute scaling we tried (research/notes/retrieval-lab-notes.md), which is why ranking and the reported score
are separate steps: the rank score says "better than the others", the calibrated score says "how likely".

Then the conversation's structure: an answer often sits in the reply to the turn that matched the question, or
a turn or two further on ("context spillover": a turn passes ``spillover ** d`` of its score to the turns at
distance d ≤ 2 in its session), and the turns that answer one question tend to share a session (each candidate
gains ``session_weight`` times the best score in its session: a session that matched well lifts its other turns).

Every constant lives in :class:`RetrievalParams`; its defaults (``agentmem/recall/weights/ranking.json``) were chosen by 5-fold cross-validation over
conversations (``research/locomo_cv.py --folds 5``: chosen on 4 conversations, scored on the fifth).

Example:
    >>> scores = fuse({"a": 0.9, "b": 0.85, "c": 0.5}, {"b": 12.0})   # b: nearly the best cosine and a BM25 hit
    >>> sorted(scores, key=scores.get, reverse=True)
    ['b', 'a', 'c']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Protocol

from agentmem.recall.weights_file import bundled

# Every value below comes from the bundled weights file (agentmem/recall/weights/ranking.json, group "retrieval",
# with its provenance); the comments say what each one does.
_DEFAULTS = bundled("retrieval")
DENSE_WEIGHT: float = _DEFAULTS["dense_weight"]  # BM25 leads (cross-validated: chosen by all 5 folds over 0.5)
SPILLOVER: float = _DEFAULTS["spillover"]  # share of a turn's score passed to its neighbours (squared two away)
SESSION_WEIGHT: float = _DEFAULTS["session_weight"]  # how much the best score of a candidate's session adds
# Turn context vectors (agentmem.entries.context_vectors: normalise(turn + previous turn)), their cosines min-max
# scaled over their own pool of candidate_pool and added × this to the fused score (all five folds chose 0.2,
# research/retrieval_ablation.py, research/notes/retrieval-lab-notes.md).
CONTEXT_VECTOR_WEIGHT: float = _DEFAULTS["context_vector_weight"]


@dataclass(frozen=True)
class RetrievalParams:
    """Every ranking constant in one place (defaults: the bundled weights file's "retrieval" group, cross-validated on
    LoCoMo, see its provenance and research/notes/retrieval-lab-notes.md; ``MemoryConfig.ranking`` names another).

    Example:
        >>> RetrievalParams(speaker_boost=0.0).session_weight
        0.5
    """

    dense_weight: float = DENSE_WEIGHT
    spillover: float = SPILLOVER
    session_weight: float = SESSION_WEIGHT
    speaker_boost: float = _DEFAULTS["speaker_boost"]  # × (1 + b) for the turns of the one speaker a query names
    temporal_boost: float = _DEFAULTS["temporal_boost"]  # × (1 + b) for turns that carry a time expression, on "when ..." queries
    rerank_depth: int = _DEFAULTS["rerank_depth"]  # how many of the best candidates the re-ranking step sees (at least 2k)
    # session first stage: the candidates of the `session_top` sessions whose candidates' fused scores sum highest
    # gain `session_first` × that sum (scaled to [0, 1] over the pool's sessions); 0 = off (CV chose 0: no gain)
    session_first: float = _DEFAULTS["session_first"]
    session_top: int = _DEFAULTS["session_top"]
    # contextual dense evidence (agentmem.recall.context): the mean cosine of a turn and its neighbours, min-max
    # scaled over the head of `context_depth` fused candidates, added × `context_weight`; 0 = off (measured: no
    # gain over spillover, research/notes/retrieval-lab-notes.md)
    context_weight: float = _DEFAULTS["context_weight"]
    context_depth: int = _DEFAULTS["context_depth"]
    # turn context vectors (a second vector per turn, searched beside the first): see CONTEXT_VECTOR_WEIGHT
    context_vector_weight: float = CONTEXT_VECTOR_WEIGHT
    # how many the turn-context search asks for (at most the dense pool). Kept at the pool's 100: 50 places fewer
    # context-only hits on recall's critical path (61 -> 27 at 10k entries, candidates 0.6-1.1 ms faster) and passes
    # nested CV with the head weights refitted in the folds (0.7482 / 0.8165 -> 0.7484 / 0.8191), but with the
    # shipped weights end to end (locomo.py --folds 5) it lost @5 0.7559 -> 0.7520 and cat. 3 0.508 -> 0.500, for a
    # saving below a whole recall's noise; research/notes/retrieval-lab-notes.md session 13
    context_pool: int = _DEFAULTS["context_pool"]
    # session weight for questions whose answer is a list (agentmem.recall.multihop; CV: all 5 folds chose 0.25)
    list_session_weight: float = _DEFAULTS["list_session_weight"]
    # the head re-ordered by a logistic model over the features recall already has (agentmem.recall.learned_rank;
    # trained on LoCoMo dev questions, CV over conversations); False = the hand-set order of the re-ranking alone
    learned_head: bool = _DEFAULTS["learned_head"]
    # the learned order's head also holds the best `head_reserve` of the dense and turn-context pools
    # (agentmem.recall.head_cues.widen: up to 2 × head_reserve more rows loaded, ~19 on LoCoMo; nested CV chose 20 of
    # 0 / 20 / 40, research/notes/retrieval-lab-notes.md session 10); 0 = the fused head alone
    head_reserve: int = _DEFAULTS["head_reserve"]


class Placement(Protocol):
    """Where an entry sits in its conversation (see :class:`agentmem.ports.catalog.TurnContext`)."""

    session_id: str | None
    before: Sequence[str]  # nearest first
    after: Sequence[str]


@dataclass
class Candidates:
    """What the retrievers found for one query: the input of :func:`rank_scores`.

    ``dense`` holds cosine similarities, ``lexical`` BM25 scores (higher is better), ``places`` the
    conversation placement of every candidate.
    """

    dense: dict[str, float]
    lexical: dict[str, float]
    places: Mapping[str, Placement] = field(default_factory=dict)
    context: dict[str, float] = field(default_factory=dict)  # mean cosine with the session neighbours (head only)
    turn_context: dict[str, float] = field(default_factory=dict)  # cosine of the turns' context vectors


def fuse(dense: Mapping[str, float], lexical: Mapping[str, float], *, dense_weight: float = DENSE_WEIGHT) -> dict[str, float]:
    """Combine cosine similarities and BM25 scores (higher is better) into one score in [0, 1], ids in order.

    In id order, not a set's: later steps add scores up in this dict's order (spillover), and a set of strings
    iterates in an order that differs between processes (hash randomisation), so the sums differed in their last
    bits and near-equal candidates swapped places: a store reopened elsewhere re-scored hits by 4e-5..2e-3.
    """
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
        for i in sorted(scaled_dense.keys() | scaled_lex.keys())
    }


def _min_max(scores: Mapping[str, float]) -> dict[str, float]:
    lo, hi = min(scores.values()), max(scores.values())
    return {i: (s - lo) / (hi - lo) if hi > lo else 1.0 for i, s in scores.items()}


def spill_over(scores: Mapping[str, float], places: Mapping[str, Placement], *, share: float = SPILLOVER) -> dict[str, float]:
    """Add ``share ** d`` of each entry's score to the turns ``d`` steps before and after it (which may be new
    candidates).

    >>> class P:  # b sits between a and c
    ...     def __init__(self, before, after): self.session_id, self.before, self.after = "s", before, after
    >>> spill_over({"b": 1.0}, {"b": P(["a"], ["c", "d"])}, share=0.5)
    {'b': 1.0, 'a': 0.5, 'c': 0.5, 'd': 0.25}
    """
    out = dict(scores)
    get = out.get
    powers: list[float] = []  # share ** d, computed once per distance (the same floats as computing it per turn)
    for entry_id, score in scores.items():
        place = places.get(entry_id)
        if place is None:
            continue
        for side in (place.before, place.after):
            while len(powers) < len(side):
                powers.append(share ** (len(powers) + 1))
            for neighbour, weight in zip(side, powers):
                out[neighbour] = get(neighbour, 0.0) + weight * score
    return out


def session_boost(scores: Mapping[str, float], session_of: Mapping[str, str | None], *,
                  weight: float = SESSION_WEIGHT) -> dict[str, float]:
    """Add ``weight`` × the best score in each entry's session (entries without a session are unchanged).

    >>> session_boost({"a": 1.0, "b": 0.2, "c": 0.4}, {"a": "s1", "b": "s1", "c": None})
    {'a': 1.5, 'b': 0.7, 'c': 0.4}
    """
    best: dict[str, float] = {}
    best_get, session_get = best.get, session_of.get
    placed: list[tuple[str, float, str]] = []  # one session look-up per entry, not two
    for entry_id, score in scores.items():
        session = session_get(entry_id)
        if session is not None:
            held = best_get(session, 0.0)
            best[session] = score if score > held else held  # max(held, score), without a call per entry
            placed.append((entry_id, score, session))
    lift = {session: weight * b for session, b in best.items()}  # weight × best, once per session
    out = dict(scores)
    for entry_id, score, session in placed:
        out[entry_id] = score + lift[session]
    return out


def session_first_stage(scores: Mapping[str, float], session_of: Mapping[str, str | None], *, weight: float,
                        top: int) -> dict[str, float]:
    """Score sessions as a whole (the sum of their candidates' scores, scaled to [0, 1] over the pool's sessions)
    and lift the candidates of the ``top`` best sessions by ``weight`` × their session's score.

    A sum, unlike the session boost's max, rewards a session where many turns match a little — the shape of a
    multi-hop answer spread over one conversation.

    >>> session_first_stage({"a": 1.0, "b": 0.5, "c": 0.8}, {"a": "s1", "b": "s1", "c": "s2"}, weight=1.0, top=1)
    {'a': 2.0, 'b': 1.5, 'c': 0.8}
    """
    total: dict[str, float] = {}
    for entry_id, score in scores.items():
        session = session_of.get(entry_id)
        if session is not None:
            total[session] = total.get(session, 0.0) + score
    out = dict(scores)
    if not total or weight == 0 or top <= 0:
        return out
    lo, hi = min(total.values()), max(total.values())
    best = sorted(total, key=lambda s: (-total[s], s))[:top]
    lift = {s: (total[s] - lo) / (hi - lo) if hi > lo else 1.0 for s in best}
    for entry_id, score in scores.items():
        session = session_of.get(entry_id)
        if session in lift:
            out[entry_id] = score + weight * lift[session]
    return out


def best_first(scores: Mapping[str, float]) -> list[tuple[str, float]]:
    """``scores`` as (id, score), best first, equal scores by id: ``sorted(key=lambda kv: (-kv[1], kv[0]))``
    without a Python call per item (two C-level sorts; the second is stable, reverse included). A recall ranks
    ~900 scored ids (spillover neighbours included): 0.67 -> 0.50 ms; keyed by the id alone (no tuple comparison),
    0.33 -> 0.24 ms (session 10, the same lists).

    >>> best_first({"b": 1.0, "c": 2.0, "a": 1.0})
    [('c', 2.0), ('a', 1.0), ('b', 1.0)]
    """
    items = sorted(scores.items(), key=itemgetter(0))  # by id (unique): strings compared, not tuples
    items.sort(key=itemgetter(1), reverse=True)
    return items


def rank_scores(cands: Candidates, params: RetrievalParams = RetrievalParams()) -> dict[str, float]:
    """Fusion, spillover and session boost: the ranking score of every candidate (and spilled-to neighbour).

    Example:
        >>> sorted(rank_scores(Candidates({"a": 0.8, "b": 0.2}, {"a": 3.0})).items())
        [('a', 1.0), ('b', 0.0)]
    """
    return rank_parts(cands, params)[0]


def rank_parts(cands: Candidates, params: RetrievalParams = RetrievalParams()
               ) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """:func:`rank_scores` with its steps: (ranking scores, fused scores before spillover, scores after spillover).
    The learned head order (:mod:`agentmem.recall.learned_rank`) reads the parts; nothing is computed twice.

    Example:
        >>> scores, fused, spilled = rank_parts(Candidates({"a": 0.8, "b": 0.2}, {"a": 3.0}))
        >>> fused["a"], scores["a"]
        (1.0, 1.0)
    """
    fused = fuse(cands.dense, cands.lexical, dense_weight=params.dense_weight)
    if params.context_vector_weight and cands.turn_context:
        for entry_id, c in _min_max(cands.turn_context).items():
            fused[entry_id] = fused.get(entry_id, 0.0) + params.context_vector_weight * c
    if params.context_weight and cands.context:
        lo, hi = min(cands.context.values()), max(cands.context.values())
        for entry_id, c in cands.context.items():
            fused[entry_id] = fused.get(entry_id, 0.0) + params.context_weight * ((c - lo) / (hi - lo) if hi > lo else 1.0)
    if params.session_first:
        fused = session_first_stage(fused, {i: p.session_id for i, p in cands.places.items()},
                                    weight=params.session_first, top=params.session_top)
    spilled = spill_over(fused, cands.places, share=params.spillover)
    return session_boost(spilled, _sessions(cands.places), weight=params.session_weight), fused, spilled


def _sessions(places: Mapping[str, Placement]) -> dict[str, str | None]:
    """The session of every placed entry and of its neighbours: a neighbour reached by spillover shares the session
    of the first turn in placement order that lists it; a placed entry keeps its own. ``setdefault`` in placement
    order (0.15 ms for ~230 placements) rather than ``dict.fromkeys`` written in reverse (0.43 ms): the same values;
    the key order differs, and the session boost only looks sessions up.

    >>> class P:
    ...     def __init__(self, s, before, after): self.session_id, self.before, self.after = s, before, after
    >>> _sessions({"b": P("s1", ("a",), ("c",)), "c": P("s2", ("b",), ())})
    {'a': 's1', 'c': 's2', 'b': 's1'}
    """
    sessions: dict[str, str | None] = {}
    first = sessions.setdefault
    for place in places.values():
        session = place.session_id
        for neighbour in place.before:
            first(neighbour, session)
        for neighbour in place.after:
            first(neighbour, session)
    for entry_id, place in places.items():
        sessions[entry_id] = place.session_id
    return sessions


__all__ = ["CONTEXT_VECTOR_WEIGHT", "DENSE_WEIGHT", "SESSION_WEIGHT", "SPILLOVER", "Candidates", "Placement", "RetrievalParams", "best_first", "fuse",
           "rank_parts", "rank_scores", "session_boost", "session_first_stage", "spill_over"]
