"""Sessions on the real embedded SmolLM2-135M-Instruct through the facade (slow: loads the model)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentmem import AgentMemory
from agentmem.kv.cache import new_dynamic_cache
from agentmem.kv.model import EMBEDDED_GGUF_FILE, embedded_model_dir
from agentmem.kv.runner import decode, prefill
from agentmem.sessions import ChatLayout

pytestmark = pytest.mark.slow

TURNS = ["Hi! I'm Ana and I live in Lisbon.", "My sister is called Ines.", "What is my sister's name?"]
NEW = 12


# the embedded model samples by default (agentmem/kv/model.py EMBEDDED_GENERATION); these compare token for token
GREEDY = {"do_sample": False, "repetition_penalty": 1.0}


@pytest.fixture(scope="module")
def mem(tmp_path_factory) -> Iterator[AgentMemory]:
    if not (embedded_model_dir() / EMBEDDED_GGUF_FILE).exists():
        pytest.skip("embedded SmolLM2 not installed")
    # mount_min_score 0: these tests mount every recalled memory (k of them) to check offload and restore exactness
    m = AgentMemory(tmp_path_factory.mktemp("store"), session_idle_seconds=3600, mount_min_score=0.0)
    yield m
    m.sessions.close()
    m.close()


def test_reuse_matches_reencoding_the_conversation_and_the_chat_template(mem):
    engine = mem.sessions.context().engine
    chat_layout = ChatLayout.from_prompt_layout(engine.layout)
    chat = mem.session("plain", user_id="u1")
    history: list[tuple[str, list[int]]] = []
    for i, message in enumerate(TURNS):
        dry = chat.send(message, k=0, max_new_tokens=NEW, mode="text", commit=False, **GREEDY)
        r = chat.send(message, k=0, max_new_tokens=NEW, remember=False, **GREEDY)
        ids = list(engine.layout.preamble_ids)
        for j, (user, reply) in enumerate(history):
            ids += chat_layout.turn_ids(user, reply, first=j == 0)
        ids += chat_layout.user_turn_ids(message, first=not history)
        cache = new_dynamic_cache()
        ref = decode(engine.model, cache, prefill(engine.model, cache, ids), max_new_tokens=NEW, eos_ids=engine._eos)
        assert r.token_ids == dry.token_ids == ref
        assert r.prefilled_tokens < len(ids) - len(engine.layout.preamble_ids) or i == 0
        history.append((message, r.token_ids))
    # the first prompt is exactly what the model's own chat template renders
    system = engine.layout.preamble_text.split("<|im_start|>system\n", 1)[1]
    rendered = engine.tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": TURNS[0]}],
        tokenize=False, add_generation_prompt=True,
    )
    first = engine.layout.preamble_ids + chat_layout.user_turn_ids(TURNS[0], first=True)
    assert first == list(engine.tokenizer(rendered, add_special_tokens=False).input_ids)


def test_disk_offload_and_restore_continue_token_identically_with_memories(mem):
    mem.remember("Ana's favourite food is grilled sardines.", user_id="u2", session_id="earlier")
    mem.remember("Ana works as a nurse at Santa Maria hospital.", user_id="u2", session_id="earlier")
    moved, stay = mem.session("moved", user_id="u2"), mem.session("stay", user_id="u2")
    for i, message in enumerate(["What do I like to eat?", "Where do I work?", "Thanks!"]):
        if i:
            assert mem.sessions.offload("moved", to="disk") == "cold"
        a = moved.send(message, k=2, max_new_tokens=NEW, remember=False, **GREEDY)
        b = stay.send(message, k=2, max_new_tokens=NEW, remember=False, **GREEDY)
        assert a.mounted == b.mounted and len(a.mounted) == 2
        assert a.token_ids == b.token_ids
        assert a.restored_from == ("cold" if i else None)
