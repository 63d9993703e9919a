"""Decode lanes (agentmem.kv.lanes) through KVEngine.generate on the tiny test model: a prompt goes to the lane with
the least work while answers join the lane where most decode, and the second lane runs while the first is held.
(Answers spread over two lanes equal their answers alone: test_kv_batch.py runs every batching test on one lane
and on two.)"""

from __future__ import annotations

import threading
import time

import pytest

from agentmem.kv import KVEngine
from agentmem.kv.lanes import DecodeLanes
from agentmem.kv.testing import tiny_causal_lm
from tests.unit.kv_batch_requests import request_memories as _memories

@pytest.fixture(scope="module")
def engine() -> KVEngine:
    return KVEngine(*tiny_causal_lm("llama", seed=0), decode_lanes=2)


def _wait_for(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


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
    model, tok = tiny_causal_lm("llama", seed=0)
    with pytest.raises(ValueError, match="lanes must be at least 1"):
        DecodeLanes(model, None, lanes=0)
    with pytest.raises(ValueError, match="lanes must be at least 1"):
        KVEngine(model, tok, decode_lanes=0)
