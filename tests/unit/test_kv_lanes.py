"""Decode lanes (agentmem.kv.lanes) through KVEngine.generate on the tiny test model: answers spread over two lanes
equal their unbatched greedy answers, a prompt goes to the lane with the least work while answers join the lane
where most decode, and the second lane runs while the first is held."""

from __future__ import annotations

import threading
import time

import pytest

from agentmem.kv import KVEngine
from agentmem.kv.lanes import DecodeLanes
from agentmem.kv.testing import tiny_causal_lm
from tests.unit.kv_batch_requests import request_memories as _memories

QUESTIONS = ["Where does Alice live?", "What does Bob keep?", "Tell me about the door.", "What is the cat called?",
             "What did Dan buy?", "hello"]


@pytest.fixture(scope="module")
def engine() -> KVEngine:
    return KVEngine(*tiny_causal_lm("llama", seed=0), decode_lanes=2)


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


def _wait_for(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


@pytest.mark.parametrize("mode", ["kv", "text"])
def test_answers_spread_over_two_lanes_equal_their_unbatched_greedy_answers(engine, mode):
    n = len(QUESTIONS)
    memories = [_memories(engine, i) for i in range(n)]
    alone = [engine.generate(QUESTIONS[i], memories[i], mode=mode, max_new_tokens=24 + 7 * i).token_ids
             for i in range(n)]
    before = [lane.steps for lane in engine.decoder.lanes]
    together = _concurrently(lambda i: engine.generate(QUESTIONS[i], memories[i], mode=mode,
                                                       max_new_tokens=24 + 7 * i).token_ids, n)
    assert all(lane.steps > b for lane, b in zip(engine.decoder.lanes, before))  # both lanes really ran steps
    assert together == alone
    assert any(len(ids) > 10 for ids in alone)  # not a trivial comparison of empty answers


def test_a_prompt_goes_to_the_idle_lane_and_its_answer_joins_the_decoding_one(engine):
    """While an answer decodes on lane 0, a new prompt is prefilled on lane 1 (the lane with less work), and its
    answer then decodes beside the running one on lane 0; it answers as alone."""
    first, second = engine.decoder.lanes
    alone = engine.generate("What did Dan buy?", [], max_new_tokens=12).token_ids
    running = threading.Thread(target=engine.generate, args=("Go on and on.", []), kwargs={"max_new_tokens": 400})
    start = first.steps
    running.start()
    _wait_for(lambda: first.steps >= start + 3, "the long answer to decode on lane 0")
    second_before, first.max_batch_seen = second.steps, 0
    out = engine.generate("What did Dan buy?", [], max_new_tokens=12)
    decoding_meanwhile = running.is_alive()
    running.join(300)
    assert decoding_meanwhile and out.token_ids == alone and len(alone) > 3
    assert second.steps > second_before  # the prompt went to the idle lane
    assert first.max_batch_seen >= 2  # its answer decoded beside the running one


def test_the_second_lane_answers_while_the_first_is_held(engine):
    """Lane 0 shares the engine's lock; lane 1 has its own: holding the engine's lock (as an encode does) pauses
    lane 0 between two steps, and a prompt sent meanwhile is prefilled on lane 1 all the same."""
    first = engine.decoder.lanes[0]
    stop = threading.Event()
    running = threading.Thread(target=engine.generate, args=("Go on and on.", []),
                               kwargs={"max_new_tokens": 4000, "cancel": stop})
    start = first.steps
    running.start()
    _wait_for(lambda: first.steps >= start + 2, "the long answer to decode on lane 0")
    prep = engine.prepare("Where does Alice live?", _memories(engine, 0))
    with engine.decoder.lock:  # lane 0 is held between two steps
        held_at = first.steps
        logits = engine.decoder.prefill(prep.cache, prep.pending_ids)
        assert first.steps <= held_at + 1  # lane 0 ran no step (one may be counted, waiting for the lock)
    stop.set()
    running.join(300)
    assert logits.shape[0] == 1 and prep.cache.get_seq_length() == prep.prompt_tokens


def test_lanes_must_be_at_least_one():
    model, _ = tiny_causal_lm("llama", seed=0)
    with pytest.raises(ValueError, match="lanes must be at least 1"):
        DecodeLanes(model, None, lanes=0)
