"""Plain recall ranks a user's earlier question after the facts it found (``MemoryConfig.recall_questions_last``).

A chat stores the user's questions as their turns ("What is my job?"), and the same or the next question
resembles them more than the fact that answers it: ``recall(k=1)`` returned the user's own question for 0.865 of the
held-out scenarios where the user had asked about the fact (``benchmarks/knowledge_update.py --asked-n 200``). A
question answers nothing (on LoCoMo and REALTALK dev no evidence turn only asks), so recall puts such memories after
the statements; they stay recallable, and a mount leaves them out as before (``MemoryConfig.mount_questions``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmem import AgentMemory

FACT = "I work as a paralegal at a small firm."
ASKED = "What is my job?"  # the user's message, stored as their turn, then asked again
OTHERS = ["The weather was lovely this weekend.", "I need to buy coffee filters.", "I planted tomatoes on the balcony."]


def _store(mem: AgentMemory) -> tuple[str, str]:
    fact = mem.remember(FACT, user_id="u1", role="user", session_id="s1")
    for text in OTHERS:
        mem.remember(text, user_id="u1", role="user", session_id="s1")
    asked = mem.remember(ASKED, user_id="u1", role="user", session_id="s2")
    return fact.id, asked.id


@pytest.mark.parametrize("questions_last", [True, False])
def test_the_fact_ranks_before_the_users_earlier_question(tmp_path: Path, questions_last: bool) -> None:
    with AgentMemory(tmp_path / "s", recall_questions_last=questions_last) as mem:
        fact, asked = _store(mem)
        ranked = [h.id for h in mem.recall(ASKED, user_id="u1", k=5)]
        assert fact in ranked and asked in ranked  # both recalled: the question is not dropped
        if questions_last:
            assert ranked[0] == fact and ranked[-1] == asked  # after every statement found
        else:
            assert ranked.index(asked) < ranked.index(fact)  # the store's ranking: the question resembles the query


def test_the_question_fills_a_place_only_after_the_statements(tmp_path: Path) -> None:
    with AgentMemory(tmp_path / "s") as mem:
        fact, asked = _store(mem)
        assert [h.id for h in mem.recall(ASKED, user_id="u1", k=1)] == [fact]
        assert asked not in [h.id for h in mem.recall_for_mount(ASKED, user_id="u1")]
        # a question alone in the store is still found
        only = mem.remember("Do you know a good vet nearby?", user_id="u2", role="user")
        assert [h.id for h in mem.recall("good vet nearby", user_id="u2", k=3)] == [only.id]
