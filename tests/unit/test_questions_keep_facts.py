"""A user who asks about a fact does not retract it: a memory that only asks ("Do I still live in Lyon?") supersedes
nothing on write and demotes nothing in recall or a mount (``statements.only_asks``), while a newer statement still
replaces the older one."""

from __future__ import annotations

import pytest

from agentmem import AgentMemory

FACTS_AND_QUESTIONS = [
    ("I live in Lyon.", "Do I still live in Lyon?", "Where do I live?"),
    ("My dog is called Rex.", "What is my dog called?", "What is the name of my dog?"),
    ("I take 10 mg of amlodipine daily.", "Hey! Is it 10 mg of amlodipine I take?", "What dose of amlodipine do I take?"),
]


@pytest.mark.parametrize("fact, question, query", FACTS_AND_QUESTIONS)
def test_asking_about_a_fact_keeps_it_active_recalled_and_mounted(mem: AgentMemory, fact, question, query):
    stated = mem.remember(fact, user_id="u1", session_id="monday", role="user")
    asked = mem.remember(question, user_id="u1", session_id="tuesday", role="user")
    assert asked.event == "ADD" and asked.superseded_ids == ()
    assert mem.get(stated.id).status == "active"
    assert stated.id in [h.id for h in mem.recall(query, user_id="u1", k=2)]
    choice = mem.mount_choice(query, user_id="u1")
    assert stated.id in [h.id for h in choice.mounted] and choice.contradicted == []


def test_a_newer_statement_still_replaces_the_fact(mem: AgentMemory):
    old = mem.remember("I moved to Lyon last May.", user_id="u1", session_id="monday", role="user")
    mem.remember("Do I still live in Lyon?", user_id="u1", session_id="tuesday", role="user")
    new = mem.remember("I moved to Paris in June.", user_id="u1", session_id="wednesday", role="user")
    assert new.event == "UPDATE" and new.superseded_ids == (old.id,)
    assert mem.get(old.id).status == "superseded"


def test_an_llm_consolidator_cannot_retract_a_fact_for_a_question(tmp_path):
    """With ``consolidation="llm"`` a model that answers UPDATE for a question is not asked at all."""
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    chat = FakeListChatModel(responses=['{"event": "UPDATE", "id": 0, "reason": "the user asks again"}'])
    with AgentMemory(tmp_path / "s", consolidation="llm", consolidation_model=chat) as mem:
        fact = mem.remember("I live in Lyon.", user_id="u1")
        mem.remember("Do I still live in Lyon?", user_id="u1")
        assert mem.wait_consolidation(30)
        assert mem.get(fact.id).status == "active" and mem.stats()["lifecycle"] == {"llm_add": 2}


def test_a_mount_leaves_the_users_earlier_questions_out(mem_path):
    """A user's earlier questions resemble the next one more than the fact does: recall ranks them first, a mount
    (``k=2`` here) leaves them out and holds the fact, unless ``mount_questions=True``."""
    for mount_questions in (False, True):
        with AgentMemory(mem_path / str(mount_questions), mount_questions=mount_questions) as mem:
            fact = mem.remember("I moved to Lyon last May.", user_id="u1", session_id="monday", role="user")
            asked = [mem.remember(q, user_id="u1", session_id=f"s{i}", role="user").id
                     for i, q in enumerate(["Where do I live?", "Which city do I live in now?"])]
            assert set(asked) <= {h.id for h in mem.recall("Where do I live now?", user_id="u1", k=3)}
            mounted = [h.id for h in mem.recall_for_mount("Where do I live now?", user_id="u1", k=2)]
            if mount_questions:
                assert set(mounted) == set(asked)
            else:
                assert mounted == [fact.id]
