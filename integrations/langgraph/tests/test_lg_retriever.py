"""AgentMemRetriever: LangChain's standard retriever tests, and what a memory retriever must add (the user scope,
the score, the record in metadata)."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_tests.integration_tests import RetrieversIntegrationTests

from agentmem import AgentMemory, InvalidInputError
from agentmem_langgraph import AgentMemRetriever

FACTS = ["I moved to Lyon last May.", "My dog is called Rex.", "I work as a nurse at the Lyon hospital.",
         "My sister lives in Porto.", "I take the tram to work every morning."]


@pytest.fixture(scope="module")
def facts_memory(tmp_path_factory):
    with AgentMemory(tmp_path_factory.mktemp("retriever") / "mem", kv_encoding="off") as mem:
        mem.remember_many([{"text": t, "user_id": "u1", "session_id": "s1"} for t in FACTS])
        mem.remember("Bob lives in Lyon too.", user_id="bob")
        yield mem


class TestAgentMemRetrieverStandard(RetrieversIntegrationTests):
    @pytest.fixture(autouse=True)
    def _memory(self, facts_memory: AgentMemory) -> None:
        self._mem = facts_memory

    @property
    def retriever_constructor(self) -> type[BaseRetriever]:
        return AgentMemRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"memory": getattr(self, "_mem", None), "user_id": "u1"}

    @property
    def retriever_query_example(self) -> str:
        return "Where does the user live and work?"


def test_documents_carry_the_memory_its_score_and_its_record(facts_memory):
    docs = AgentMemRetriever(memory=facts_memory, user_id="u1", k=2).invoke("What is my dog called?")
    assert isinstance(docs[0], Document) and docs[0].page_content == "My dog is called Rex."
    hit = facts_memory.recall("What is my dog called?", user_id="u1", k=1)[0]
    assert docs[0].id == docs[0].metadata["id"] == hit.id and docs[0].metadata["score"] == pytest.approx(hit.score)
    assert docs[0].metadata["kind"] == "turn" and docs[0].metadata["session_id"] == "s1"


def test_the_user_comes_from_the_call_the_runs_metadata_or_the_constructor(facts_memory):
    retriever = AgentMemRetriever(memory=facts_memory, user_id="u1", k=5)
    mine = {d.page_content for d in retriever.invoke("Who lives in Lyon?")}
    assert "Bob lives in Lyon too." not in mine and "I moved to Lyon last May." in mine
    assert [d.page_content for d in retriever.invoke("Who lives in Lyon?", user_id="bob")] == ["Bob lives in Lyon too."]
    by_metadata = retriever.invoke("Who lives in Lyon?", config={"metadata": {"user_id": "bob"}})
    assert [d.page_content for d in by_metadata] == ["Bob lives in Lyon too."]
    with pytest.raises(InvalidInputError, match="no user"):
        AgentMemRetriever(memory=facts_memory).invoke("Who lives in Lyon?")


def test_min_score_leaves_unrelated_memories_out(facts_memory):
    docs = AgentMemRetriever(memory=facts_memory, user_id="u1", k=5, min_score=0.5).invoke("What is my dog called?")
    assert [d.page_content for d in docs] == ["My dog is called Rex."]
    assert all(d.metadata["score"] >= 0.5 for d in docs)


def test_inside_a_graph_the_user_is_the_runs_configurable_user(facts_memory):
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class State(TypedDict):
        question: str
        answers: list[str]

    retriever = AgentMemRetriever(memory=facts_memory, user_id="u1", k=3)
    graph = StateGraph(State)
    graph.add_node("recall", lambda s: {"answers": [d.page_content for d in retriever.invoke(s["question"])]})
    graph.add_edge(START, "recall")
    graph.add_edge("recall", END)
    out = graph.compile().invoke({"question": "Who lives in Lyon?", "answers": []},
                                 config={"configurable": {"user_id": "bob"}})
    assert out["answers"] == ["Bob lives in Lyon too."]
