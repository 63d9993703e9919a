"""research/score_sentences.py: a compound memory's best sentence is read from the store's sentence vectors, and the
gain feature is zero for a memory of one sentence."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import score_sentences as probe  # noqa: E402
from agentmem import AgentMemory  # noqa: E402


def test_the_best_sentence_is_closer_than_the_whole_compound_memory(tmp_path: Path) -> None:
    with AgentMemory(tmp_path / "m", kv_encoding="off") as mem:
        compound = mem.remember("Hi, I'm Alice. I take 20 mg of lisinopril every morning.", user_id="u")
        mem.remember("My brother lives in Denver.", user_id="u")
        hits = mem.recall("What medication do I take?", user_id="u", k=2)
        made = probe.with_sentences(mem, "What medication do I take?", hits,
                                    [{"cosine": h.scores["text_dense"], "overlap": 0.0} for h in hits])
    by_id = {h.id: s for h, s in zip(hits, made)}
    assert by_id[compound.id]["sentence"] > by_id[compound.id]["cosine"]
    assert [s["sentence"] for h, s in by_id.items() if h != compound.id] == [None]
    assert probe.features({**by_id[compound.id]}, "gain")[-1] > 0
    assert probe.features({"cosine": 0.4, "overlap": 0.5, "sentence": None}, "gain")[-1] == 0.0


def test_auc_orders_answers_above_unrelated() -> None:
    assert probe.auc(np.array([0.9, 0.8, 0.1, 0.2]), np.array([1.0, 1.0, 0.0, 0.0])) == 1.0
    assert probe.auc(np.array([0.1, 0.9]), np.array([1.0, 0.0])) == 0.0
