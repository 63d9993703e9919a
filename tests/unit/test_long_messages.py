"""A long chat message (a pasted plan, a fetched page) is remembered as parts (``MemoryConfig.message_max_words``):
each part is recalled and mounted on its own, numbered like ``remember_document``'s, and a session's long turn too."""

from __future__ import annotations

import pydantic
import pytest

from agentmem import AgentMemory, InvalidInputError
from agentmem.kv.testing import tiny_causal_lm

PLAN = "\n\n".join([
    "Here is the plan for our trip to Portugal, pasted from my notes so you have it all in one place.",
    " ".join(["Day one we land in Lisbon and check into the small hotel near the Alfama district."] * 5),
    " ".join(["Day two is for museums: the tile museum in the morning, then the Gulbenkian after lunch."] * 5),
    " ".join(["Day three we take the train to Sintra and visit the Pena palace and the Moorish castle."] * 5),
    "Finally, the rental car booking reference is QX-7731 and it must be returned to the Faro airport office by "
    "10 am on the last day.",
])  # ~270 words
FACTS = ["I like green tea.", "My dog is called Rex.", "I work as a nurse.", "My sister lives in Porto."]


def _store_plan(mem: AgentMemory) -> list:
    for fact in FACTS:
        mem.remember(fact, user_id="u1")
    return mem.remember_messages([{"role": "user", "content": PLAN},
                                  {"role": "assistant", "content": "Got it, a lovely trip."}], user_id="u1")


def test_a_pasted_plan_is_stored_as_numbered_parts_and_its_last_part_is_mounted(mem: AgentMemory):
    records = _store_plan(mem)
    parts, reply = records[:-1], records[-1]
    assert len(parts) >= 2 and all(p.role == "user" and p.kind == "turn" for p in parts)
    assert all(len(p.text.split()) <= 150 for p in parts)
    assert " ".join(" ".join(p.text for p in parts).split()) == " ".join(PLAN.split())  # every word, in order
    documents = [p.metadata["document"] for p in parts]
    assert [d["part"] for d in documents] == list(range(1, len(parts) + 1))
    assert {d["parts"] for d in documents} == {len(parts)} and len({d["id"] for d in documents}) == 1
    assert reply.text == "Got it, a lovely trip." and "document" not in reply.metadata  # short: whole, as before
    choice = mem.mount_choice("Where do I return the rental car?", user_id="u1")
    assert [h.id for h in choice.mounted][:1] == [parts[-1].id] and "Faro" in choice.mounted[0].text


def test_message_max_words_none_keeps_every_message_whole(mem_path):
    with AgentMemory(mem_path, message_max_words=None) as mem:
        records = _store_plan(mem)
    assert records[-2].text == PLAN and "document" not in records[-2].metadata


def test_a_long_tool_result_keeps_its_call_with_every_part(mem: AgentMemory):
    call = {"id": "c1", "type": "function", "function": {"name": "fetch_page", "arguments": '{"url": "a.example"}'}}
    page = " ".join(f"Paragraph {i} of the fetched page says nothing new." for i in range(40))  # 320 words
    records = mem.remember_messages([{"role": "user", "content": "Read a.example for me."},
                                     {"role": "assistant", "content": None, "tool_calls": [call]},
                                     {"role": "tool", "tool_call_id": "c1", "content": page}], user_id="u1")
    tools = [r for r in records if r.kind == "tool"]
    assert len(tools) == 3 and all(r.speaker == "fetch_page" for r in tools)
    assert all(r.text.startswith('called with {"url": "a.example"}, returned: Paragraph') for r in tools)
    assert {r.metadata["document"]["title"] for r in tools} == {"fetch_page"}


def test_a_bad_message_in_a_long_transcript_stores_no_part(mem: AgentMemory):
    with pytest.raises(InvalidInputError, match=r"messages\[1\]"):
        mem.remember_messages([{"role": "user", "content": PLAN}, {"role": "critic", "content": "no"}], user_id="u1")
    assert mem.list(user_id="u1") == []


def test_message_max_words_must_be_positive(mem_path):
    with pytest.raises(pydantic.ValidationError, match="message_max_words"):  # as every MemoryConfig field
        AgentMemory(mem_path, message_max_words=0)


def test_a_sessions_long_turn_is_remembered_as_parts(tmp_path):
    model, tokenizer = tiny_causal_lm("llama")
    model.config.max_position_embeddings = 4096  # its byte tokens: the plan is ~1,550 (RoPE positions are computed)
    with AgentMemory(tmp_path / "s", model=(model, tokenizer), message_max_words=60, session_max_tokens=4096) as mem:
        chat = mem.session("trip", user_id="u1")
        chat.send(PLAN, max_new_tokens=2)
        stored = [r for r in mem.list(session_id="trip") if r.role == "user"]
    assert len(stored) >= 4 and [r.metadata["document"]["part"] for r in stored] == list(range(1, len(stored) + 1))
