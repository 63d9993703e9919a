"""The prompt prefix cache: text mode starts from the preamble's cached KV instead of prefilling it, with the same
greedy answers and the same teacher-forced logits (causal attention: no preamble token depends on what follows)."""

from __future__ import annotations

import pytest
import torch

from agentmem.kv import KVEngine, MemoryItem
from agentmem.kv.testing import tiny_causal_lm

MEMORIES = ["Alice moved to Lisbon in 2021.", "Bob keeps bees in his garden.", "The blue door is locked."]
QUESTIONS = ["Where does Alice live?", "What does Bob keep?", "hello"]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_text_mode_from_the_cached_prefix_answers_as_without_it(arch):
    model, tok = tiny_causal_lm(arch, seed=1)
    cached, plain = KVEngine(model, tok), KVEngine(model, tok, prefix_cache=False)
    memories = [MemoryItem(f"m{i}", t) for i, t in enumerate(MEMORIES)]
    for q in QUESTIONS:
        a = cached.generate(q, memories, mode="text", max_new_tokens=40)
        b = plain.generate(q, memories, mode="text", max_new_tokens=40)
        assert a.token_ids == b.token_ids and a.prompt_tokens == b.prompt_tokens and a.spans == b.spans
    logits_a, ids_a = cached.answer_logits(QUESTIONS[0], memories, "In Lisbon.", mode="text")
    logits_b, ids_b = plain.answer_logits(QUESTIONS[0], memories, "In Lisbon.", mode="text")
    assert ids_a == ids_b
    torch.testing.assert_close(logits_a, logits_b, rtol=1e-4, atol=1e-4)
