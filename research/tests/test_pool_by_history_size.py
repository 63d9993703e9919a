"""research/pool_by_history_size.py: the pool setting reaches the store's search, ``in_pool`` counts evidence among
the candidates before ranking, and the pooled figures weigh conversations by their questions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import pool_by_history_size as pb  # noqa: E402

from agentmem import AgentMemory  # noqa: E402

TURNS = [f"Turn {i}: we talked about topic number {i} and the weather on day {i}." for i in range(60)]
TURNS[7] = "My sister Elise adopted a grey cat called Pepper last spring."


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    with AgentMemory(tmp_path_factory.mktemp("pool") / "s", kv_encoding="off", consolidation="off",
                     recall_questions_last=False) as mem:  # recall looks no deeper than k: the pool asked is the pool
        records = mem.remember_many([{"text": t, "user_id": "locomo-c1", "kind": "turn"} for t in TURNS])
        yield mem, [r.id for r in records]


def test_the_pool_asked_for_is_the_pool_the_store_searches(store, monkeypatch: pytest.MonkeyPatch) -> None:
    mem, ids = store
    question = pb.locomo.Question("c1", "What is the name of Elise's cat?", 1, {ids[7]})
    asked: list[int] = []
    search = mem._store.candidates

    def spy(*args, pool: int, **kwargs):
        asked.append(pool)
        return search(*args, pool=pool, **kwargs)

    monkeypatch.setattr(mem._store, "candidates", spy)
    for pool in (40, 200):
        ranked = pb.ranked_with_pool(mem, [question], pool)
        assert asked[-1] == pool and ranked[0][0] == ids[7]
    cands, _ = search(question.text, pb.Scope("locomo-c1"), pool=40)
    assert len(cands.dense) == 40  # of 60 stored: the pool caps the candidates


def test_in_pool_is_the_share_of_evidence_among_the_candidates(store) -> None:
    mem, ids = store
    found = pb.locomo.Question("c1", "What is the name of Elise's cat?", 1, {ids[7]})
    assert pb.in_pool(mem, [found], 100) == 1.0
    # evidence of two turns, one of them not stored for this user at all: half of it can be found
    half = pb.locomo.Question("c1", "What is the name of Elise's cat?", 1, {ids[7], "not-an-entry"})
    assert pb.in_pool(mem, [half], 100) == 0.5


def test_pooled_weighs_each_conversation_by_its_questions() -> None:
    one = {"in_pool": 1.0, "pools": {"100": {"recall@5": 1.0, "recall@10": 1.0}}}
    three = {"in_pool": 0.0, "pools": {"100": {"recall@5": 0.0, "recall@10": 0.6}}}
    out = pb.pooled([(100, [None], one), (300, [None] * 3, three)])
    assert out["history_turns"] == 200 and out["questions"] == 4
    assert out["in_pool"] == 0.25 and out["pools"]["100"] == {"recall@5": 0.25, "recall@10": 0.7}
