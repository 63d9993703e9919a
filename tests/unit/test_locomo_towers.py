"""research/locomo_cv.py's held-out query towers: each conversation's questions are asked through its own tower (the
one trained without it), on a real store, and the store's own tower is back afterwards."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from agentmem import AgentMemory
from agentmem.embed.query_tower import BUNDLED_BASE, QueryTower, save_tower

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / d) for d in ("benchmarks", "research")]
import locomo  # noqa: E402
import locomo_cv  # noqa: E402

TURNS = {"a": ["Caroline moved to Boston last spring.", "Caroline bakes bread on Sundays."],
         "b": ["Melanie paints lakes at sunrise.", "Melanie ran a marathon in May."]}


def _tower(path: Path, *, zero: bool) -> Path:
    g = torch.Generator().manual_seed(3)
    a = torch.randn(4, 384, generator=g) / 384 ** 0.5
    b = torch.zeros(384, 4) if zero else torch.randn(384, 4, generator=g) * 0.2
    return save_tower(path, {"encoder.layer.5.attention.self.query": (a, b)}, scale=2.0, base=BUNDLED_BASE)


def test_recall_summary_pools_questions_and_splits_categories() -> None:
    qs = [locomo.Question("a", "q1", 1, {"x", "y"}), locomo.Question("b", "q2", 3, {"z"})]
    got = locomo.recall_summary(qs, [["x", "n", "y"], ["n", "z"]], [1, 2])
    assert got == {"recall@1": 0.25, "recall@2": 0.75, "questions": 2, "recall@2_by_category": {"1": 0.5, "3": 1.0}}


def test_by_conversation_summarises_each_conversations_questions_alone() -> None:
    qs = [locomo.Question("a", "q1", 1, {"x", "y"}), locomo.Question("b", "q2", 3, {"z"}),
          locomo.Question("a", "q3", 3, {"w"})]
    got = locomo_cv.by_conversation(qs, [["x", "n", "y"], ["n", "z"], ["w"]], [1, 2])
    assert got == {"a": {"recall@1": 0.75, "recall@2": 0.75, "questions": 2,
                         "recall@2_by_category": {"1": 0.5, "3": 1.0}},
                   "b": {"recall@1": 0.0, "recall@2": 1.0, "questions": 1, "recall@2_by_category": {"3": 1.0}}}


@pytest.fixture()
def mem(tmp_path: Path):
    with AgentMemory(tmp_path / "store", kv_encoding="off", query_tower=None) as m:
        for conv, turns in TURNS.items():
            for t in turns:
                m.remember(t, user_id=f"locomo-{conv}")
        yield m


def test_each_conversation_is_asked_through_its_own_tower_and_the_stores_tower_comes_back(mem: AgentMemory,
                                                                                          tmp_path: Path) -> None:
    ids = {h.text: h.id for c in TURNS for h in mem.recall("anything", user_id=f"locomo-{c}", k=5)}
    qs = [locomo.Question("a", "Where does Caroline live?", 4, {ids[TURNS["a"][0]]}),
          locomo.Question("b", "What does Melanie paint?", 4, {ids[TURNS["b"][0]]})]
    zero = tmp_path / "zero"
    zero.mkdir()
    for c in TURNS:
        _tower(zero / f"{c}.safetensors", zero=True)
    plain = locomo.end_to_end(mem, qs, [1, 2])
    held = locomo_cv.held_out_towers(mem, qs, [1, 2], zero)  # zero towers: the plain model's ranking
    assert {k: held[k] for k in ("recall@1", "recall@2")} == {k: plain[k] for k in ("recall@1", "recall@2")}
    assert sorted(held["by_conversation"]) == ["a", "b"]
    assert all(v["questions"] == 1 for v in held["by_conversation"].values())
    assert mem._store.embedder.query_tower is None
    tuned = tmp_path / "tuned"
    tuned.mkdir()
    _tower(tuned / "a.safetensors", zero=False)
    _tower(tuned / "b.safetensors", zero=True)
    seen: dict[str, str | None] = {}
    embed = mem._store._encode_query  # the query path the store decided once (factory.query_encoder)

    def spy(text: str) -> np.ndarray:
        tower = mem._store.embedder.query_tower
        seen[text] = tower.digest if tower else None
        return embed(text)

    mem._store._encode_query = spy
    locomo_cv.held_out_towers(mem, qs, [1, 2], tuned)
    assert seen == {qs[0].text: QueryTower.load(tuned / "a.safetensors").digest,
                    qs[1].text: QueryTower.load(tuned / "b.safetensors").digest}
    assert mem._store.embedder.query_tower is None
    with pytest.raises(Exception, match="not found"):
        locomo_cv.held_out_towers(mem, [locomo.Question("c", "?", 1, {"x"})], [1], tuned)
    assert mem._store.embedder.query_tower is None  # restored after a failure too
