"""The benchmarks rank with recall's own order (agentmem.recall.head.rank_candidates): LoCoMo's ``ranking``, which the
cross-validation, the calibration fits and the learned-head ablations score, must return exactly the ids and rank
scores ``recall`` returns over the same candidates, on a real store ingested by the benchmark's own loader."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from agentmem import AgentMemory
from agentmem.recall.head import head_of, rank_candidates
from agentmem.recall.head_cues import widen
from agentmem.recall.learned_rank import HeadModel, reorder
from agentmem.recall.multihop import for_query
from agentmem.recall.rerank import HeadEntry
from agentmem.recall.retrieval import RetrievalParams, best_first, rank_parts

sys.path[:0] = [str(Path(__file__).parents[2] / "benchmarks"), str(Path(__file__).parents[2] / "research")]
import locomo  # noqa: E402
import locomo_cv  # noqa: E402
from recall_latency import OBJECTS, SUBJECTS, VERBS  # noqa: E402

SPEAKERS = ("Ann", "Bob")
WHEN = ("yesterday", "last week", "on Saturday", "two days ago", "", "", "")


def _conversation(cid: str, rng: random.Random) -> dict:
    """A LoCoMo-shaped conversation: 6 dated sessions of 14 turns, two speakers, some questions among the turns."""
    sessions = []
    for s in range(6):
        turns = []
        for t in range(14):
            text = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(WHEN)}".strip()
            if t % 5 == 4:
                text = f"did {rng.choice(SUBJECTS)} really go to {rng.choice(OBJECTS)}?"
            turns.append({"speaker": SPEAKERS[t % 2], "dia_id": f"D{s + 1}:{t + 1}", "text": text})
        sessions.append({"session": s + 1, "date_time": f"{s + 1} May 2023", "turns": turns})
    return {"conversation_id": cid, "sessions": sessions, "qa": []}


def _questions(rng: random.Random) -> list[str]:
    asks = [f"When did {rng.choice(SPEAKERS)} say {rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}?"
            for _ in range(12)]
    asks += [f"What did {rng.choice(SUBJECTS)} {rng.choice(VERBS)}?" for _ in range(8)]
    return asks + ["What things did Ann buy?", "Which places did Bob visit?", "Where did the dog go?"]


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentMemory, list[locomo.Question], dict]]:
    rng = random.Random(7)
    conversations = [_conversation(c, rng) for c in ("a", "b")]
    # consolidation off: recall is then the store's search alone (no version following, no conflict demotion), the
    # ranking locomo.py's cross-validation scores
    with AgentMemory(tmp_path_factory.mktemp("head") / "m", kv_encoding="off", consolidation="off",
                     recall_questions_last=False) as mem:  # the ranking's own order
        locomo.load_conversations(mem, conversations)
        questions = [locomo.Question(c, text, 1, set()) for c in ("a", "b") for text in _questions(rng)]
        rows = locomo_cv.gather_candidates(mem, questions, max(mem.config.candidate_pool, 40))  # as locomo.py --k 5 10
        yield mem, questions, rows


@pytest.mark.parametrize("k", [5, 10])
def test_locomo_ranking_is_the_order_recall_returns(bench, k: int) -> None:
    mem, questions, rows = bench
    params = mem._store.params
    for q in questions:
        cands, _ = mem._store.candidates(q.text, locomo_cv.Scope(f"locomo-{q.conv}"),
                                         pool=max(mem.config.candidate_pool, 4 * k))
        hits = mem.recall(q.text, user_id=f"locomo-{q.conv}", k=k)
        got = locomo_cv.ranking(q, cands, rows, params, k)
        assert [h.id for h in hits] == [i for i, _ in got], q.text
        assert [h.scores["rank"] for h in hits] == pytest.approx([s for _, s in got], abs=0, rel=1e-12), q.text


def test_the_comparison_sees_every_step(bench) -> None:
    """Not vacuous: on these questions, leaving out the learned order, the widening or the query's own parameters
    changes the order, so a benchmark copy that drifted from recall in any of them fails the test above."""
    mem, questions, rows = bench
    params, k = mem._store.params, 10
    shipped = [locomo_cv.ranking(q, q.cands, rows, params, k) for q in questions]
    for changed in (replace(params, learned_head=False), replace(params, head_reserve=0)):
        assert [locomo_cv.ranking(q, q.cands, rows, changed, k) for q in questions] != shipped
    assert any(for_query(params, q.text) != params for q in questions)  # a list question among them
    widened = [widen(best_first(rank_parts(q.cands, for_query(params, q.text))[0]), q.cands, 20,
                     params.head_reserve)[1] for q in questions]
    assert max(widened) > 20  # the pools' best moved into the head


def test_the_loader_decides_the_head() -> None:
    """What ``load`` leaves out of the head (a row the scope rejects) is not ranked; its tail follows the head."""
    from agentmem.recall.retrieval import Candidates

    lines = {"a": ("Ann", "[1 May 2023] Ann: I went hiking"), "b": ("Bob", "[1 May 2023] Bob: where to?"),
             "c": ("Ann", "[2 May 2023] Ann: hiking again")}
    cands = Candidates({"a": 0.6, "b": 0.5, "c": 0.4}, {"a": 2.0, "b": 3.0, "c": 1.0})

    def without_a(ranked, depth):
        kept = [(i, s) for i, s in ranked if i != "a"]
        return [HeadEntry(i, s, *lines[i]) for i, s in kept[:1]], kept[1:]

    order = rank_candidates("Where did Ann go?", cands, RetrievalParams(), 5, without_a)
    assert "a" not in [i for i, _ in order] and len(order) == 2


def test_the_head_model_is_an_argument(bench) -> None:
    """``model`` omitted is the shipped weights; other weights change the order through the argument alone (no
    default of ``reorder`` is touched, as research/context_pool_ablation.py's refit once did)."""
    mem, questions, rows = bench
    params, k = mem._store.params, 10
    load = locomo_cv.row_loader(rows)
    defaults = reorder.__defaults__
    shipped = [rank_candidates(q.text, q.cands, params, k, load) for q in questions]
    assert [rank_candidates(q.text, q.cands, params, k, load, HeadModel()) for q in questions] == shipped
    flipped = HeadModel(weights=tuple(-w for w in HeadModel().weights))
    other = [rank_candidates(q.text, q.cands, params, k, load, flipped) for q in questions]
    assert other != shipped
    # the head re-ordered, its scores kept in their order
    assert [[s for _, s in o] for o in other] == [[s for _, s in o] for o in shipped]
    assert reorder.__defaults__ == defaults


def test_head_of_is_the_hand_set_ranking(bench) -> None:
    """Without the learned order, the ranking is ``head_of``'s hand-set head then its tail (what the ablations'
    features are computed on)."""
    mem, questions, rows = bench
    hand, k = replace(mem._store.params, learned_head=False), 10
    load = locomo_cv.row_loader(rows)
    for q in questions:
        h = head_of(q.text, q.cands, hand, max(2 * k, hand.rerank_depth), 0, load)
        assert (h.order + h.tail)[:k] == rank_candidates(q.text, q.cands, hand, k, load), q.text
        assert h.params == for_query(hand, q.text)
