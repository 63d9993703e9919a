"""The learned head order (agentmem.recall.learned_rank): what it moves, what it keeps, and that it is off-able."""

from __future__ import annotations

import json
from pathlib import Path

from agentmem import AgentMemory
from agentmem.recall.learned_rank import FEATURES, HEAD_CUES, WEIGHTS, HeadModel, features, reorder
from agentmem.recall.rerank import HeadEntry, rerank
from agentmem.recall.retrieval import Candidates, RetrievalParams, rank_parts, rank_scores

HEAD = [HeadEntry("q", 1.0, "Ann", "[1 May 2023] Ann: where did you go?"),
        HeadEntry("a", 0.9, "Bob", "[1 May 2023] Bob: I went hiking in the Alps with my brother last week"),
        HeadEntry("c", 0.5, "Ann", "[1 May 2023] Ann: nice")]
CANDS = Candidates({"q": 0.6, "a": 0.5, "c": 0.2}, {"q": 3.0, "a": 2.5})


def test_a_turn_that_only_asks_falls_below_the_answer_and_scores_stay_sorted() -> None:
    p = RetrievalParams()
    order = rerank("Where did Bob go?", HEAD, p)
    out = reorder("Where did Bob go?", HEAD, order, CANDS, {}, {}, p)
    assert [i for i, _ in out][:2] == ["a", "q"]  # the named speaker's answer over a question turn
    # the same entries, and the n-th entry keeps the n-th best score: the rank scores still fall down the list
    assert sorted(i for i, _ in out) == sorted(i for i, _ in order)
    assert [s for _, s in out] == sorted((s for _, s in order), reverse=True)


def test_zero_weights_keep_the_hand_set_order() -> None:
    p = RetrievalParams()
    order = rerank("Where did Bob go?", HEAD, p)
    flat = HeadModel(weights=(0.0,) * len(FEATURES), bias=0.0)
    assert reorder("Where did Bob go?", HEAD, order, CANDS, {}, {}, p, flat) == order


def test_features_read_the_ranking_parts() -> None:
    p = RetrievalParams()
    scores, fused, spilled = rank_parts(CANDS, p)
    assert scores == rank_scores(CANDS, p)
    order = rerank("Where did Bob go?", HEAD, p)
    X = features("Where did Bob go?", HEAD, order, CANDS, fused, spilled, p)
    col = {name: n for n, name in enumerate(FEATURES)}
    row = {i: X[n] for n, (i, _) in enumerate(order)}
    assert X.shape == (3, len(FEATURES)) and len(WEIGHTS) == len(FEATURES) + len(HEAD_CUES)
    assert row["q"][col["is_question"]] == 1.0 and row["a"][col["is_question"]] == 0.0
    assert row["a"][col["speaker_match"]] == 1.0 and row["q"][col["speaker_other"]] == 1.0
    assert row["c"][col["in_lexical"]] == 0.0 and row["c"][col["lexical_rank"]] == 0.0
    assert row["q"][col["dense"]] == 1.0 and row["c"][col["dense"]] == 0.0


def test_more_similar_never_ranks_lower() -> None:
    """The weights of the dense and context features are held >= 0 in the fit: of two turns alike in every other
    way, the one closer to the query in the dense and context pools is not put below the other."""
    dense_like = ("dense", "in_dense", "context", "dense_rank", "context_rank")
    assert all(WEIGHTS[FEATURES.index(f)] >= 0 for f in dense_like)
    head = [HeadEntry("x", 1.0, "Ann", "[1 May 2023] Ann: we walked by the river"),
            HeadEntry("y", 1.0, "Ann", "[1 May 2023] Ann: we walked by the river")]
    for near, far in (("x", "y"), ("y", "x")):
        # no BM25 pool: equal BM25 scores would rank by id, and the lexical rank is a feature of its own
        cands = Candidates({near: 0.8, far: 0.4}, {}, turn_context={near: 0.7, far: 0.3})
        for order in ([(near, 1.0), (far, 1.0)], [(far, 1.0), (near, 1.0)]):  # whichever the hand-set order put first
            assert reorder("Where did Ann walk?", head, order, cands, {}, {}, RetrievalParams())[0][0] == near


def test_recall_can_switch_the_learned_order_off(tmp_path: Path) -> None:
    texts = ["Ann: where did you go last week?", "Bob: I went hiking in the Alps with my brother last week",
             "Ann: that sounds lovely", "Bob: we also visited a small museum about glaciers",
             "Ann: where did you stay?", "Bob: in a mountain hut near the trail"]
    hand_set = tmp_path / "hand_set.json"  # a weights file holding only what it changes (MemoryConfig.ranking)
    hand_set.write_text(json.dumps({"retrieval": {"values": {"learned_head": False}}}))
    # the rankings themselves (recall_questions_last would put both questions last in either)
    with AgentMemory(tmp_path / "m", kv_encoding="off", recall_questions_last=False) as mem:
        mem.remember_many([dict(text=t.split(": ", 1)[1], user_id="u1", session_id="s1", kind="turn",
                                speaker=t.split(":")[0]) for t in texts])
        on = mem.recall("Where did Bob go last week?", user_id="u1", k=6)
    with AgentMemory(tmp_path / "m", kv_encoding="off", ranking=str(hand_set), recall_questions_last=False) as mem:
        off = mem.recall("Where did Bob go last week?", user_id="u1", k=6)
    assert {h.id for h in on} == {h.id for h in off}
    assert [h.scores["rank"] for h in on] == sorted((h.scores["rank"] for h in on), reverse=True)
    assert "Alps" in on[0].text
    # a turn that only asks a question is worth less than a reply: the learned order moves it down, the hand-set
    # one leaves it where the fused scores put it
    texts_on, texts_off = [h.text for h in on], [h.text for h in off]
    assert texts_on != texts_off
    assert texts_on.index("where did you stay?") > texts_off.index("where did you stay?")
