"""Batched prefill across requests (agentmem.kv.prefill) through KVEngine.generate on the tiny test model: prompts
that wait for the model together are prefilled in one padded forward and answer exactly as alone, and memories are
loaded and mounted while another request holds the model."""

from __future__ import annotations

import threading
import time

import pytest

from agentmem.kv import KVEngine, MemoryItem
from agentmem.kv.runner import prefill
from agentmem.kv.testing import tiny_causal_lm
from tests.unit.kv_batch_requests import FACTS, request_memories as _memories

QUESTIONS = ["Where does Alice live?", "What does Bob keep?", "Tell me about the door and what it means?",
             "What is the cat called?", "hello"]


@pytest.fixture(scope="module")
def engine() -> KVEngine:
    model, tok = tiny_causal_lm("llama", seed=0)
    return KVEngine(model, tok)


def _queued_together(engine: KVEngine, fn, n: int) -> list:
    """``fn(i)`` on ``n`` threads whose prefills all queue while the model lock is held, then run."""
    results: list = [None] * n
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, fn(i))) for i in range(n)]
    with engine.prefiller.lock:  # as if a long decode step held the model
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while engine.prefiller.waiting < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.prefiller.waiting == n
    for t in threads:
        t.join(300)
    return results


@pytest.mark.parametrize("mode", ["kv", "text"])
def test_prompts_prefilled_together_answer_exactly_as_alone(engine, mode):
    n = len(QUESTIONS)
    memories = [_memories(engine, i) for i in range(n)]
    alone = [engine.generate(QUESTIONS[i], memories[i], mode=mode, max_new_tokens=12).token_ids for i in range(n)]
    forwards = engine.prefiller.forwards
    together = _queued_together(engine, lambda i: engine.generate(QUESTIONS[i], memories[i], mode=mode,
                                                                  max_new_tokens=12).token_ids, n)
    assert engine.prefiller.forwards - forwards == 1  # one padded forward prefilled all of them
    assert engine.prefiller.max_batch_seen >= n
    assert together == alone
    assert all(len(ids) > 3 for ids in alone)  # not a trivial comparison of empty answers


def test_batched_prefill_appends_each_prompt_to_its_own_cache_at_its_own_positions(engine):
    n = len(QUESTIONS)
    memories = [_memories(engine, i) for i in range(n)]
    preps = [engine.prepare(QUESTIONS[i], memories[i]) for i in range(n)]
    logits = _queued_together(engine, lambda i: engine.prefiller.prefill(preps[i].cache, preps[i].pending_ids), n)
    for i, prep in enumerate(preps):
        ref = engine.prepare(QUESTIONS[i], memories[i])
        ref_logits = prefill(engine.model, ref.cache, ref.pending_ids)[-1:]  # the plain, unbatched forward
        assert prep.cache.get_seq_length() == ref.cache.get_seq_length() == prep.prompt_tokens
        assert int(logits[i].argmax()) == int(ref_logits.argmax())
        assert (logits[i] - ref_logits).abs().max() < 1e-4
        for layer, ref_layer in zip(prep.cache.layers, ref.cache.layers):
            assert (layer.keys - ref_layer.keys).abs().max() < 1e-4


def test_memories_are_mounted_while_another_request_holds_the_model(engine):
    entries = engine.encode_many(FACTS[:2])
    loaded = threading.Event()

    def load(e):
        loaded.set()
        return e

    items = [MemoryItem(f"w{j}", t, (lambda e=e: load(e))) for j, (t, e) in enumerate(zip(FACTS, entries))]
    worker = threading.Thread(target=lambda: engine.generate(QUESTIONS[0], items, max_new_tokens=2))
    with engine.decoder.lock:  # the model's lock: a decode step or another prefill holds the model
        worker.start()
        assert loaded.wait(30), "the memories were not loaded until the model was free"
    worker.join(60)
