"""Batched decoding across requests (agentmem.kv.batch, on one lane and on two: agentmem.kv.lanes) through
KVEngine.generate on the tiny test model: answers decoded together equal their unbatched greedy answers, a cancel
stops a decode before its next step, and the model's lock is granted in arrival order."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from agentmem.kv import KVEngine
from agentmem.kv.batch import FairRLock
from agentmem.kv.cache import new_dynamic_cache
from agentmem.kv.runner import prefill
from agentmem.kv.testing import tiny_causal_lm
from tests.unit.kv_batch_requests import request_memories as _memories

QUESTIONS = ["Where does Alice live?", "What does Bob keep?", "Tell me about the door.", "What is the cat called?",
             "What did Dan buy?", "hello"]


@pytest.fixture(scope="module", params=[1, 2], ids=["one lane", "two lanes"])
def engine(request) -> KVEngine:
    """One batch worker, and two (agentmem/kv/lanes.py: the default on a CPU with two usable cores)."""
    model, tok = tiny_causal_lm("llama", seed=0)
    return KVEngine(model, tok, decode_lanes=request.param)


def _concurrently(fn, n: int) -> list:
    results: list = [None] * n
    barrier = threading.Barrier(n)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = fn(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return results


@pytest.mark.parametrize("mode", ["kv", "text"])
def test_answers_decoded_together_equal_their_unbatched_greedy_answers(engine, mode):
    n = len(QUESTIONS)
    memories = [_memories(engine, i) for i in range(n)]
    alone = [engine.generate(QUESTIONS[i], memories[i], mode=mode, max_new_tokens=24 + 7 * i).token_ids
             for i in range(n)]
    before, lane_steps = engine.decoder.max_batch_seen, [lane.steps for lane in engine.decoder.lanes]
    together = _concurrently(lambda i: engine.generate(QUESTIONS[i], memories[i], mode=mode,
                                                       max_new_tokens=24 + 7 * i).token_ids, n)
    assert engine.decoder.max_batch_seen >= 2 or before >= 2  # the answers really shared decode steps
    assert all(lane.steps > b for lane, b in zip(engine.decoder.lanes, lane_steps))  # every lane took part
    assert together == alone
    assert any(len(ids) > 10 for ids in alone)  # not a trivial comparison of empty answers


def test_sampled_answers_with_a_seed_are_the_same_batched(engine):
    args = [dict(do_sample=True, temperature=0.8, top_p=0.9, seed=s, max_new_tokens=30) for s in range(4)]
    alone = [engine.generate(QUESTIONS[i], [], **args[i]).token_ids for i in range(4)]
    together = _concurrently(lambda i: engine.generate(QUESTIONS[i], [], **args[i]).token_ids, 4)
    assert together == alone


def test_cancel_stops_the_decode_before_its_next_step(engine):
    cancel = threading.Event()
    pieces: list[str] = []
    steps_at_cancel: list[int] = []

    def on_text(piece: str) -> None:
        assert not cancel.is_set(), "a piece was delivered after the cancel"
        pieces.append(piece)
        if len(pieces) == 3:
            steps_at_cancel.append(engine.decoder.steps)
            cancel.set()

    out = engine.generate("hello", [], max_new_tokens=300, on_text=on_text, cancel=cancel)
    assert out.cancelled and 3 <= len(out.token_ids) < 300
    assert engine.decoder.steps - steps_at_cancel[0] <= 1  # at most the step already running was spent
    full = engine.generate("hello", [], max_new_tokens=300)
    assert not full.cancelled and out.token_ids == full.token_ids[: len(out.token_ids)]


def test_a_long_answer_does_not_hold_back_a_short_one(engine):
    """Decode steps interleave: a short request started while a long one decodes finishes long before it."""
    done: dict[str, float] = {}

    def long() -> None:
        engine.generate("hello", [], max_new_tokens=400)
        done["long"] = time.perf_counter()

    t = threading.Thread(target=long)
    t.start()
    time.sleep(0.2)
    out = engine.generate("What did Dan buy?", [], max_new_tokens=3)
    done["short"] = time.perf_counter()
    t.join(300)
    assert out.token_ids and done["short"] < done["long"]


def test_a_new_request_is_prefilled_while_a_running_answer_decodes_and_answers_as_alone(engine):
    """Continuous batching: a request arriving while a long answer decodes is prefilled between two of its steps
    (the lock is granted in arrival order: test_fair_lock_is_granted_in_arrival_order), decodes beside it, and
    still answers exactly what it answers alone."""
    alone = engine.generate("What did Dan buy?", [], max_new_tokens=12).token_ids
    running = threading.Thread(target=engine.generate, args=("Go on and on.", []), kwargs={"max_new_tokens": 400})
    start = engine.decoder.steps
    running.start()
    deadline = time.time() + 60
    while engine.decoder.steps < start + 5:  # the long answer is decoding
        assert time.time() < deadline and running.is_alive()
        time.sleep(0.001)
    first_choice: list[bool] = []

    def note_first_choice(ids, scores):  # called when the first id is chosen: right after the prefill
        if not first_choice:
            first_choice.append(running.is_alive())
        return scores

    out = engine.generate("What did Dan buy?", [], max_new_tokens=12, logits_processor=note_first_choice)
    done_while_long_decodes = running.is_alive()
    running.join(300)
    assert first_choice == [True] and done_while_long_decodes
    assert out.token_ids == alone and len(alone) > 3


def test_fair_lock_is_granted_in_arrival_order():
    lock, order = FairRLock(), []
    lock.acquire()
    threads = []
    for i in range(4):
        t = threading.Thread(target=lambda i=i: (lock.acquire(), order.append(i), lock.release()))
        t.start()
        threads.append(t)
        time.sleep(0.05)  # each waiter queues before the next arrives
    lock.release()
    lock.acquire()  # the releasing thread asks again at once: it queues behind the waiters
    order.append("again")
    lock.release()
    for t in threads:
        t.join(5)
    assert order == [0, 1, 2, 3, "again"]
    with lock, lock:
        assert lock.held_by_me()
    assert not lock.held_by_me()


def test_a_forward_by_other_code_during_a_batched_step_sees_the_models_own_attention():
    """The batched decoder never switches the model's attention implementation while it runs (issue #40's race:
    a prefill that ran while a batched step had the model set to the ragged attention lost its causal mask and
    chose 239 where the reference chose 92). Here a prefill on top of a cache, by a thread that does not hold the
    engine's lock, is forced to run inside a batched step (a forward pre-hook holds the step until it is done); its
    logits must equal the same prefill run before any batching."""
    model, tok = tiny_causal_lm("llama", seed=0)
    prefix, suffix = tok.encode("Carol's cat is called Miso."), tok.encode(" It sleeps all day long, and Dan bought")

    def prefill_on_a_prefix() -> torch.Tensor:  # on a non-empty cache: wrong without a causal mask
        cache = new_dynamic_cache()
        prefill(model, cache, prefix)
        return prefill(model, cache, suffix)

    reference = prefill_on_a_prefix()  # the model as loaded, before any engine
    engine = KVEngine(model, tok)
    inside: list[torch.Tensor] = []
    seen_during: list[str] = []

    def during_a_batched_step(_module, _args, kwargs) -> None:
        if kwargs["input_ids"].shape[0] >= 2 and not inside:
            seen_during.append(model.config._attn_implementation)
            other = threading.Thread(target=lambda: inside.append(prefill_on_a_prefix()))
            other.start()
            other.join(60)

    handle = model.register_forward_pre_hook(during_a_batched_step, with_kwargs=True)
    try:
        together = _concurrently(lambda i: engine.generate(QUESTIONS[i], [], max_new_tokens=20).token_ids, 3)
    finally:
        handle.remove()
    assert len(inside) == 1, "no batched step ran"
    assert inside[0].argmax(-1).item() == reference.argmax(-1).item()
    torch.testing.assert_close(inside[0], reference)
    assert all(len(ids) > 0 for ids in together)
    assert seen_during == [model.config._attn_implementation]  # the step did not switch the model's attention


def test_answers_of_a_model_without_sdpa_decode_together_as_alone():
    """Gemma 2 runs eager attention (SDPA has no soft-capping): the batch leaves its attention as loaded and steps
    each answer in its own forward. (The batch once forced every model onto its SDPA rows: this raised.)"""
    model, tok = tiny_causal_lm("gemma2", seed=0)
    engine = KVEngine(model, tok)
    questions = QUESTIONS[:3]
    alone = [engine.generate(q, [], mode="text", max_new_tokens=15).token_ids for q in questions]
    together = _concurrently(lambda i: engine.generate(questions[i], [], mode="text", max_new_tokens=15).token_ids, 3)
    assert engine.decoder.max_batch_seen >= 2 and model.config._attn_implementation == "eager"
    assert together == alone and any(len(ids) > 5 for ids in alone)
