"""The engine's turn operation on its own (``KVEngine.turn``): a conversation's kept KV reused across turns gives
the reply a fresh prefill of the whole prompt gives, a dry run leaves the KV as it was, memories mount in front."""

from __future__ import annotations

import pytest

from agentmem.kv import KVEngine, MemoryItem
from agentmem.kv.cache import new_dynamic_cache
from agentmem.kv.runner import decode, prefill
from agentmem.kv.testing import tiny_causal_lm
from agentmem.kv.turn import TurnRequest, plan_turn
from agentmem.sessions import ChatLayout

NEW = 6


@pytest.fixture(scope="module")
def engine() -> KVEngine:
    return KVEngine(*tiny_causal_lm("llama", seed=0))


def _reference(engine: KVEngine, ids: list[int]) -> list[int]:
    cache = new_dynamic_cache()
    return decode(engine.model, cache, prefill(engine.model, cache, ids), max_new_tokens=NEW, eos_ids=engine.eos_ids)


def test_kept_kv_across_turns_matches_a_fresh_prefill(engine):
    chat = ChatLayout.from_prompt_layout(engine.layout)
    P = len(engine.layout.preamble_ids)
    first = chat.user_turn_ids("Hello, I am Ana.", first=True)
    plan = plan_turn(engine, [], history_len=0, new_len=len(first), max_new_tokens=NEW)
    out = engine.turn(TurnRequest(plan, first, [], history=None, capacity=256))
    assert out.fresh and out.kv_tokens == 0 and out.reply == _reference(engine, engine.layout.preamble_ids + first)
    history = first + out.reply
    kv_len = out.kv.length - P  # the turn is in the kept KV, but for the last reply token (prefilled next turn)
    assert kv_len == len(history) - 1

    second = chat.user_turn_ids("My sister is called Ines.", first=False)
    kv = out.kv
    plan = plan_turn(engine, [], history_len=len(history), new_len=len(second), max_new_tokens=NEW)
    dry = engine.turn(TurnRequest(plan, second, history, history=kv, kv_len=kv_len, capacity=kv.capacity,
                                  commit=False))
    assert dry.kv is kv and kv.length == P + kv_len  # a dry run: the kept KV keeps its length
    out = engine.turn(TurnRequest(plan, second, history, history=kv, kv_len=kv_len, capacity=kv.capacity))
    assert not out.fresh and out.kv_tokens == kv_len and out.prefilled == 1 + len(second)
    assert out.reply == dry.reply == _reference(engine, engine.layout.preamble_ids + history + second)


def test_memories_mount_between_preamble_and_history_in_every_mode(engine):
    chat = ChatLayout.from_prompt_layout(engine.layout)
    text = "The user's dog is called Rex."
    entry = engine.encode(text)
    memory = MemoryItem("m1", text, lambda: entry)
    new = chat.user_turn_ids("What is my dog called?", first=True)
    plan = plan_turn(engine, [memory], history_len=0, new_len=len(new), max_new_tokens=NEW)
    P = len(engine.layout.preamble_ids)
    assert plan.spans == [(P, P + len(engine.layout.entry_ids(text)))] and plan.dropped == []
    replies = {}
    for mode in ("kv", "history-text", "text"):
        out = engine.turn(TurnRequest(plan, new, [], history=None, capacity=256, mode=mode, commit=False))
        assert out.fallbacks == []
        replies[mode] = out.reply
    assert replies["kv"] == replies["history-text"]  # the same cache: memories as KV, no history yet
    assert len(replies["text"]) == len(replies["kv"])
