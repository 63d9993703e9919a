"""AgentMemMiddleware in real LangChain 1.x ``create_agent`` agents: recall before the model call, remember after,
tool results, user isolation, async, and KV mounting when the model is ChatAgentMem."""

from __future__ import annotations

import asyncio

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from agentmem import AgentMemory, InvalidInputError
from agentmem_langgraph import AgentMemMiddleware, ChatAgentMem, is_context
from lg_fakes import RecordingChatModel


def cfg(user: str, thread: str) -> dict:
    return {"configurable": {"user_id": user, "thread_id": thread}}


@tool
def get_weather(city: str) -> str:
    """Current weather of a city."""
    return f"Sunny and 24 C in {city}"


def test_recall_before_remember_after_across_threads_never_across_users(mem):
    llm = RecordingChatModel(["Nice dog!", "Rex, I believe.", "I don't know."])
    agent = create_agent(llm, [], system_prompt="You are terse.", middleware=[AgentMemMiddleware(mem)],
                         checkpointer=InMemorySaver())
    agent.invoke({"messages": [("user", "My dog is called Rex.")]}, cfg("alice", "t1"))
    assert "Rex" not in llm.system_text(0)  # nothing remembered yet
    state = agent.invoke({"messages": [("user", "What is my dog called?")]}, cfg("alice", "t2"))
    seen = llm.calls[-1]
    assert seen[0].content == "You are terse."  # the agent's own system prompt stays first
    assert is_context(seen[1]) and "My dog is called Rex." in seen[1].content  # then the memories
    assert isinstance(seen[-1], HumanMessage) and seen[-1].content == "What is my dog called?"
    assert not any(is_context(m) for m in state["messages"])  # memories never enter the agent's history

    agent.invoke({"messages": [("user", "What is my dog called?")]}, cfg("bob", "t3"))
    assert "Rex" not in llm.system_text()  # bob never sees alice's memories
    stored = mem.list(user_id="alice")
    assert [(r.role, r.text, r.session_id) for r in stored] == [
        ("user", "My dog is called Rex.", "t1"), ("assistant", "Nice dog!", "t1"),
        ("user", "What is my dog called?", "t2"), ("assistant", "Rex, I believe.", "t2")]


def test_tool_results_are_remembered_once_and_recalled_later(mem):
    llm = RecordingChatModel([
        AIMessage(content="", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call1"}]),
        "It is sunny in Paris.",
        "Earlier it was sunny and 24 C in Paris.",
    ])
    agent = create_agent(llm, [get_weather], middleware=[AgentMemMiddleware(mem)], checkpointer=InMemorySaver())
    state = agent.invoke({"messages": [("user", "What's the weather in Paris?")]}, cfg("alice", "t1"))
    assert isinstance(state["messages"][2], ToolMessage)
    tools = mem.list(user_id="alice", kinds=["tool"])
    assert [t.text for t in tools] == ['called with {"city": "Paris"}, returned: Sunny and 24 C in Paris']
    assert len(mem.list(user_id="alice")) == 3  # the question, the tool result, the answer (no empty AI turn)

    agent.invoke({"messages": [("user", "How was the weather in Paris when I asked?")]}, cfg("alice", "t2"))
    assert "Sunny and 24 C in Paris" in llm.system_text()
    assert len(mem.list(user_id="alice")) == 5  # nothing from thread t1 was stored a second time


def test_async_agent(mem):
    llm = RecordingChatModel(["Noted.", "Rex."])
    agent = create_agent(llm, [], middleware=[AgentMemMiddleware(mem)], checkpointer=InMemorySaver())

    async def run() -> None:
        await agent.ainvoke({"messages": [("user", "My dog is called Rex.")]}, cfg("alice", "t1"))
        await agent.ainvoke({"messages": [("user", "What is my dog called?")]}, cfg("alice", "t2"))

    asyncio.run(run())
    assert "My dog is called Rex." in llm.system_text()
    assert len(mem.list(user_id="alice")) == 4


def test_missing_user_is_a_clear_error(mem):
    agent = create_agent(RecordingChatModel(["x"]), [], middleware=[AgentMemMiddleware(mem)])
    with pytest.raises(InvalidInputError, match="user_id"):
        agent.invoke({"messages": [("user", "hello")]})


def test_kv_mounting_with_chat_agent_mem(tmp_path, tiny_lm):
    with AgentMemory(tmp_path / "kv", model=tiny_lm) as mem:
        told = mem.remember("My dog is called Rex.", user_id="alice", session_id="t0")
        llm = ChatAgentMem(memory=mem, max_new_tokens=4)
        agent = create_agent(llm, [], middleware=[AgentMemMiddleware(mem)], checkpointer=InMemorySaver())
        out = agent.invoke({"messages": [("user", "What is my dog called?")]}, cfg("alice", "t1"))
        meta = out["messages"][-1].response_metadata["agentmem"]
        assert meta["mode"] == "kv" and told.id in meta["mounted"] and told.id in meta["requested"]
        assert not any(is_context(m) for m in out["messages"])
        assert not any(isinstance(m, SystemMessage) and "Rex" in str(m.content) for m in out["messages"])
