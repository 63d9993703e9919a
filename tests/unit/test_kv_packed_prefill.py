"""Prompts fed in the decode worker's steps (agentmem.kv.batch, DecodeBatch.prefill) through KVEngine.generate on
the tiny test model: prompts waiting together are packed into one step and answer exactly as alone, a long prompt
is fed in chunks while other answers keep decoding, and memories are loaded and mounted while another request holds
the model."""

from __future__ import annotations

import threading
import time

import pytest

from agentmem.kv import KVEngine, MemoryItem
from agentmem.kv.batch import DecodeBatch, FairRLock, _Prompt
from agentmem.kv.runner import prefill
from agentmem.kv.testing import tiny_causal_lm
from tests.unit.kv_batch_requests import FACTS, record_packed_steps, request_memories as _memories

QUESTIONS = ["Where does Alice live?", "What does Bob keep?", "Tell me about the door and what it means?",
             "What is the cat called?", "hello"]


@pytest.fixture(scope="module")
def engine() -> KVEngine:
    model, tok = tiny_causal_lm("llama", seed=0)
    return KVEngine(model, tok, decode_lanes=1)  # packing within one worker's steps (two lanes: test_kv_lanes.py)


def _queued_together(engine: KVEngine, fn, n: int) -> list:
    """``fn(i)`` on ``n`` threads whose prompts all queue while the model lock is held, then run: the worker takes
    the first prompt or two into a step that waits for the lock, the others are fed together in the next step."""
    results: list = [None] * n
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, fn(i))) for i in range(n)]
    with engine.decoder.lock:  # as if another forward held the model
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while engine.decoder.pending < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.decoder.pending == n
    for t in threads:
        t.join(300)
    return results


@pytest.mark.parametrize("mode", ["kv", "text"])
def test_prompts_packed_into_one_step_answer_exactly_as_alone(engine, mode, monkeypatch):
    monkeypatch.setattr(engine.decoder, "step_tokens", 4096)  # room for every prompt, text mode's too, in one step
    n = len(QUESTIONS)
    memories = [_memories(engine, i) for i in range(n)]
    alone = [engine.generate(QUESTIONS[i], memories[i], mode=mode, max_new_tokens=12).token_ids for i in range(n)]
    engine.decoder.max_prompts_seen = 0
    together = _queued_together(engine, lambda i: engine.generate(QUESTIONS[i], memories[i], mode=mode,
                                                                  max_new_tokens=12).token_ids, n)
    # the prompts went in over two steps at most (what the worker took before the lock came free, then the rest)
    assert engine.decoder.max_prompts_seen >= (n + 1) // 2
    assert together == alone
    assert all(len(ids) > 3 for ids in alone)  # not a trivial comparison of empty answers


def test_a_packed_step_appends_each_prompt_to_its_own_cache_at_its_own_positions(engine):
    n = len(QUESTIONS)
    memories = [_memories(engine, i) for i in range(n)]
    preps = [engine.prepare(QUESTIONS[i], memories[i]) for i in range(n)]
    logits = _queued_together(engine, lambda i: engine.decoder.prefill(preps[i].cache, preps[i].pending_ids), n)
    for i, prep in enumerate(preps):
        ref = engine.prepare(QUESTIONS[i], memories[i])
        ref_logits = prefill(engine.model, ref.cache, ref.pending_ids)[-1:]  # the plain, unbatched forward
        assert prep.cache.get_seq_length() == ref.cache.get_seq_length() == prep.prompt_tokens
        assert int(logits[i].argmax()) == int(ref_logits.argmax())
        assert (logits[i] - ref_logits).abs().max() < 1e-4
        for layer, ref_layer in zip(prep.cache.layers, ref.cache.layers):
            assert (layer.keys - ref_layer.keys).abs().max() < 1e-4


def test_a_prompt_left_alone_after_a_packed_step_is_fed_only_what_is_left_of_it(engine):
    """A packed step over a small budget feeds all of a short prompt and the first chunk of a long one; the next
    step, the long one alone, is the plain forward over the rest of it: its first chunk is in its cache once."""
    memories = _memories(engine, 0)
    short, long = engine.prepare("hello", []), engine.prepare(QUESTIONS[0], memories, mode="text")
    jobs = [_Prompt(short.cache, short.pending_ids), _Prompt(long.cache, long.pending_ids)]
    batch = DecodeBatch(engine.model, FairRLock(), step_tokens=len(jobs[0].ids) + 8)
    assert len(jobs[1].ids) > batch.step_tokens
    batch._step([], jobs)  # the worker's step: the short prompt whole, then the long one's first chunk
    assert jobs[0].left == 0 and 0 < jobs[1].fed < len(jobs[1].ids)
    batch._step([], [jobs[1]])  # the long one, alone now
    ref = engine.prepare(QUESTIONS[0], memories, mode="text")
    ref_logits = prefill(engine.model, ref.cache, ref.pending_ids)[-1:]  # the plain, unbatched forward
    assert long.cache.get_seq_length() == ref.cache.get_seq_length() == long.prompt_tokens
    assert int(jobs[1].logits.argmax()) == int(ref_logits.argmax())
    assert (jobs[1].logits - ref_logits).abs().max() < 1e-4


def test_a_long_prompt_is_fed_in_chunks_while_another_answer_keeps_decoding(engine, monkeypatch):
    """A text-mode prompt much longer than a step's budget goes in over several steps, each beside the running
    answer's decode row, so that answer never waits for the whole prefill; both answer exactly as alone."""
    memories = _memories(engine, 0) + _memories(engine, 3)  # as text: several times the step budget below
    question = "Tell me everything about the door."
    alone_long = engine.generate(question, memories, mode="text", max_new_tokens=6).token_ids
    alone_running = engine.generate("Go on and on.", [], max_new_tokens=300).token_ids
    monkeypatch.setattr(engine.decoder, "step_tokens", 8)
    steps = record_packed_steps(engine, monkeypatch)  # (rows decoding, prompt tokens fed) per packed step
    running_ids: list = []
    running = threading.Thread(target=lambda: running_ids.extend(
        engine.generate("Go on and on.", [], max_new_tokens=300).token_ids))
    start = engine.decoder.steps
    running.start()
    while engine.decoder.steps < start + 3:
        assert running.is_alive()
        time.sleep(0.001)
    out = engine.generate(question, memories, mode="text", max_new_tokens=6)
    running.join(300)
    beside = [fed for rows, fed in steps if rows >= 1]
    assert out.prompt_tokens > 4 * 8 and len(beside) >= 4  # the prompt went in over several decode steps
    assert all(fed <= 8 - 1 for fed in beside)  # each chunk within the step's budget beside the one decode row
    assert out.token_ids == alone_long and running_ids == alone_running


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
