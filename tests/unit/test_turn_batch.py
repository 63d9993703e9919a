"""Conversation turns (``KVEngine.turn``) decode in the engine's batch with every other answer: turns decoded
together equal the fresh-prefill reference, a long turn does not hold back another conversation's turn, and a
cancelled turn leaves a working KV that matches what it delivered."""

from __future__ import annotations

import threading
import time

import pytest

from agentmem.kv import KVEngine
from agentmem.kv.cache import new_dynamic_cache
from agentmem.kv.runner import decode, prefill
from agentmem.kv.testing import tiny_causal_lm
from agentmem.kv.turn import TurnRequest, plan_turn
from agentmem.sessions import ChatLayout
from tests.unit.kv_batch_requests import record_packed_steps

MESSAGES = [("Hello, I am Ana.", "My sister is called Ines."), ("hello", "Tell me a long story."),
            ("What did Dan buy?", "And Bob?"), ("Go on and on.", "Why?")]


@pytest.fixture(scope="module")
def engine() -> KVEngine:
    return KVEngine(*tiny_causal_lm("llama", seed=0))


def _reference(engine: KVEngine, ids: list[int], new: int) -> list[int]:
    cache = new_dynamic_cache()
    return decode(engine.model, cache, prefill(engine.model, cache, ids), max_new_tokens=new, eos_ids=engine.eos_ids)


def _turn(engine: KVEngine, history: list[int], kv, message: str, new: int, **kw):
    chat = ChatLayout.from_prompt_layout(engine.layout)
    ids = chat.user_turn_ids(message, first=not history)
    plan = plan_turn(engine, [], history_len=len(history), new_len=len(ids), max_new_tokens=new)
    kv_len = 0 if kv is None else kv.length - len(engine.layout.preamble_ids)
    out = engine.turn(TurnRequest(plan, ids, history, history=kv, kv_len=kv_len, capacity=512, **kw))
    return ids, out


def _conversation(engine: KVEngine, i: int, new: int) -> list[tuple[list[int], list[int]]]:
    """Two turns of conversation ``i``: each turn's prompt ids (from the preamble on) and its reply."""
    history, kv, turns = [], None, []
    for message in MESSAGES[i]:
        ids, out = _turn(engine, history, kv, message, new)
        turns.append((list(engine.layout.preamble_ids) + history + ids, out.reply))
        history, kv = history + ids + out.reply, out.kv
    return turns


def test_turns_decoded_together_equal_the_fresh_prefill_reference(engine):
    n, new = len(MESSAGES), 24
    results: list = [None] * n
    barrier = threading.Barrier(n)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = _conversation(engine, i, new + 5 * i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert engine.decoder.max_batch_seen >= 2  # the turns really shared decode steps
    for i, turns in enumerate(results):
        for prompt, reply in turns:
            assert reply == _reference(engine, prompt, new + 5 * i)
    assert any(len(reply) > 10 for turns in results for _, reply in turns)  # not a comparison of empty replies


def test_a_long_turn_does_not_hold_back_another_conversations_turn(engine):
    done: dict[str, float] = {}

    def long() -> None:
        _turn(engine, [], None, "hello", 400)
        done["long"] = time.perf_counter()

    t = threading.Thread(target=long)
    t.start()
    time.sleep(0.2)
    _, out = _turn(engine, [], None, "What did Dan buy?", 3)
    done["short"] = time.perf_counter()
    t.join(300)
    assert out.reply and done["short"] < done["long"]


def test_a_cancelled_turn_keeps_a_working_kv_that_matches_what_it_delivered(engine):
    cancel, pieces = threading.Event(), []

    def slow_reader(piece: str) -> None:  # the decode worker runs ahead of this reader, then the cancel comes
        pieces.append(piece)
        time.sleep(0.05)
        if len(pieces) == 3:
            cancel.set()

    ids, out = _turn(engine, [], None, "hello", 200, on_text=slow_reader, cancel=cancel)
    assert 3 <= len(out.reply) < 200
    history = ids + out.reply
    assert out.kv.length - len(engine.layout.preamble_ids) <= len(history)
    ids2, out2 = _turn(engine, history, out.kv, "Tell me a long story.", 12)
    assert out2.reply == _reference(engine, list(engine.layout.preamble_ids) + history + ids2, 12)


def test_a_turns_message_is_fed_beside_a_decoding_answer_and_replies_as_the_reference(engine, monkeypatch):
    """A turn's prefill goes through the decode worker like an answer's prompt: a long message is fed in chunks
    between the steps of an answer already decoding, and the reply still equals the fresh-prefill reference."""
    engine = KVEngine(engine.model, engine.tokenizer, decode_lanes=1)  # one worker: the message rides its steps
    monkeypatch.setattr(engine.decoder, "step_tokens", 8)
    fed = record_packed_steps(engine, monkeypatch)  # (rows decoding, message tokens fed) per packed step
    running = threading.Thread(target=_turn, args=(engine, [], None, "Go on and on.", 300))
    start = engine.decoder.steps
    running.start()
    while engine.decoder.steps < start + 3:
        assert running.is_alive()
        time.sleep(0.001)
    ids, out = _turn(engine, [], None, "Tell me a long story about the blue door and the cat called Miso.", 12)
    running.join(300)
    assert len([n for rows, n in fed if rows >= 1]) >= 3  # the message went in over several steps beside the answer
    assert out.reply == _reference(engine, list(engine.layout.preamble_ids) + ids, 12)
