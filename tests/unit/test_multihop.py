"""List questions ("What activities …", "How many times …") rank with a weaker session boost
(agentmem/recall/multihop.py), through the store's own ranking."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from agentmem import AgentMemory
from agentmem.entries.store import Scope
from agentmem.recall.multihop import for_query, list_question
from agentmem.recall.retrieval import RetrievalParams


@pytest.mark.parametrize("question, expected", [
    ("What activities does Melanie partake in?", True), ("Which cities has Jon visited?", True),
    ("How many times has John injured his ankle?", True), ("In what ways is Caroline involved?", True),
    ("What are some changes Caroline has faced?", True), ("What is Jon's job?", False),
    ("What does Melanie do to destress?", False), ("When did Melanie paint a sunrise?", False),
    ("Where has Melanie camped?", False), ("What was discussed?", False),
])
def test_list_questions_are_told_by_their_form(question: str, expected: bool) -> None:
    assert list_question(question) is expected


def test_for_query_changes_only_the_session_weight_of_list_questions() -> None:
    p = RetrievalParams()
    assert for_query(p, "What is Jon's job?") is p
    assert for_query(p, "What hobbies does Jon have?") == replace(p, session_weight=p.list_session_weight)
    same = replace(p, list_session_weight=p.session_weight)
    assert for_query(same, "What hobbies does Jon have?") is same


SESSIONS = {  # one session matches the question strongly; its other turns ride on the session boost
    "s1": ["My hobbies and activities: hiking is what I enjoy most.", "The weather was lovely.", "We had sandwiches.",
           "We drove back at night.", "The car needs new tyres."],
    "s2": ["I started a pottery class on Tuesdays.", "The teacher is patient."],
    "s3": ["On weekends I paint landscapes.", "I need to buy more coffee filters."],
}


def _order(mem: AgentMemory, query: str, params: RetrievalParams) -> list[str]:
    mem._store.params = params
    return [s.row.id for s in mem._store.search(query, Scope("u1"), k=9)]


def test_a_list_question_ranks_with_the_list_session_weight(tmp_path: Path) -> None:
    with AgentMemory(tmp_path / "s", consolidation="off") as mem:
        for session, texts in SESSIONS.items():
            mem.remember_many([dict(text=t, user_id="u1", session_id=session, kind="turn", speaker="Ann")
                               for t in texts])
        listq, plain = "What hobbies and activities do I enjoy?", "Do I enjoy my hobbies and activities?"
        assert list_question(listq) and not list_question(plain)
        p = RetrievalParams()
        weak, strong = replace(p, session_weight=0.0, list_session_weight=0.0), replace(p, list_session_weight=0.5)
        assert _order(mem, listq, weak) != _order(mem, listq, strong)  # the session weight matters here
        # a list question follows list_session_weight; another question only session_weight
        assert _order(mem, listq, replace(p, list_session_weight=0.0)) == _order(mem, listq, weak)
        assert _order(mem, plain, replace(p, list_session_weight=0.0)) == _order(mem, plain, strong)
