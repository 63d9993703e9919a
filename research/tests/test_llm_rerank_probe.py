"""research/llm_rerank_probe.py: a batch of left-padded prompts scores each question as the prompt alone would, and
the re-ranking moves evidence into the top k only when the weight lets the model's score count."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import llm_rerank_probe as probe  # noqa: E402
from agentmem.kv.testing import tiny_causal_lm  # noqa: E402


def test_batched_left_padded_scores_equal_one_prompt_at_a_time() -> None:
    model, tok = tiny_causal_lm("llama")
    prompts = ["A short line.\nQuestion:", "A much longer memory line, with many more words in it.\nQuestion:"]
    together = probe._logprob(model, tok, prompts, "Where do I live?", batch=2)
    alone = [probe._logprob(model, tok, [p], "Where do I live?", batch=1)[0] for p in prompts]
    assert together == pytest.approx(alone, abs=1e-4)
    assert together[0] != pytest.approx(together[1], abs=1e-4)  # the prompt matters


def test_the_weight_decides_whether_the_model_reorders() -> None:
    row = {"q": "where", "gold": ["b"], "ids": ["a", "b"], "score": [0.9, 0.5], "rank": [2.0, 1.0],
           "lp": [-9.0, -1.0], "lp0": -5.0}
    assert probe._recall_at([row], 0.0, 1, "rank") == 0.0  # recall's own order: "a" first
    assert probe._recall_at([row], 1.0, 1, "rank") == 1.0  # pmi -4 against +4 puts "b" first
