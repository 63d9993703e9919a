"""MemoryNode in real compiled graphs: recall across threads, user isolation, tool results, checkpointers."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.prebuilt import create_react_agent

from agentmem import AgentMemory, InvalidInputError
from agentmem_langgraph import AgentMemStore, ChatAgentMem, MemoryNode, is_context
from lg_fakes import RecordingChatModel
from lg_graphs import build


def cfg(user: str, thread: str) -> dict:
    return {"configurable": {"user_id": user, "thread_id": thread}}


def test_recall_across_threads_of_the_same_user_and_never_across_users(mem):
    llm = RecordingChatModel(["Nice dog!", "Rex, I believe.", "I don't know.", "Sure."])
    graph = build(MemoryNode(mem), llm, InMemorySaver())

    graph.invoke({"messages": [("user", "My dog is called Rex.")]}, cfg("alice", "t1"))
    graph.invoke({"messages": [("user", "What is my dog called?")]}, cfg("alice", "t2"))
    assert "My dog is called Rex." in llm.system_text()  # thread t2 saw what was said in thread t1

    graph.invoke({"messages": [("user", "What is my dog called?")]}, cfg("bob", "t3"))
    assert "Rex" not in llm.system_text()  # bob never sees alice's memories

    state = graph.invoke({"messages": [("user", "Thanks.")]}, cfg("alice", "t2"))
    # one memory-context message at a time: the previous one is replaced, not piled up
    assert sum(is_context(m) for m in state["messages"]) <= 1
    # turns already in the conversation are not recalled again
    assert llm.system_text().count("What is my dog called?") == 0

    stored = mem.list(user_id="alice")
    assert [(r.role, r.text, r.session_id) for r in stored[:2]] == [
        ("user", "My dog is called Rex.", "t1"), ("assistant", "Nice dog!", "t1")]
    assert all(r.metadata["message_id"] for r in stored)
    assert {r.text for r in mem.list(user_id="bob")} == {"What is my dog called?", "I don't know."}


def test_remember_is_idempotent_and_respects_erasure(mem):
    memory = MemoryNode(mem)
    llm = RecordingChatModel(["Noted.", "Okay."])
    graph = build(memory, llm, InMemorySaver())
    state = graph.invoke({"messages": [("user", "I live in Lyon.")]}, cfg("alice", "t1"))
    assert memory.remember(state, cfg("alice", "t1")) == {}  # nothing new: nothing written twice
    assert len(mem.list(user_id="alice")) == 2

    assert mem.forget(session_id="t1") == 2  # the user asks to erase the thread's memories
    graph.invoke({"messages": [("user", "New topic.")]}, cfg("alice", "t1"))
    # only the new turn is stored: the erased messages still in the thread's state are not written back
    assert [r.text for r in mem.list(user_id="alice")] == ["New topic.", "Okay."]


def test_sqlite_checkpointer_across_process_restart(tmp_path):
    db = str(tmp_path / "checkpoints.sqlite")
    with AgentMemory(tmp_path / "mem", kv_encoding="off") as mem:
        saver = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
        graph = build(MemoryNode(mem), RecordingChatModel(["Got it."]), saver)
        graph.invoke({"messages": [("user", "My sister is called Ines.")]}, cfg("alice", "t1"))
        saver.conn.close()

    # a new process: memory and checkpoints re-opened from disk
    with AgentMemory(tmp_path / "mem", kv_encoding="off") as mem:
        saver = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
        llm = RecordingChatModel(["Ines.", "Hello again."])
        graph = build(MemoryNode(mem), llm, saver)
        graph.invoke({"messages": [("user", "What is my sister called?")]}, cfg("alice", "t2"))
        assert "My sister is called Ines." in llm.system_text()

        state = graph.invoke({"messages": [("user", "Hello again.")]}, cfg("alice", "t1"))
        assert [m.content for m in state["messages"] if not is_context(m)] == [
            "My sister is called Ines.", "Got it.", "Hello again.", "Hello again."]
        texts = [r.text for r in mem.list(user_id="alice", session_id="t1")]
        assert texts.count("My sister is called Ines.") == 1  # resumed thread: old turns not re-stored
        # the checkpoint holds only messages (ids and text), no tensors
        ckpt = saver.get_tuple(cfg("alice", "t1")).checkpoint
        assert set(ckpt["channel_values"]) <= {"messages", "__start__", "recall", "agent", "remember",
                                               "branch:to:recall", "branch:to:agent", "branch:to:remember"}
        saver.conn.close()


@tool
def get_weather(city: str) -> str:
    """Current weather of a city."""
    return f"Sunny and 24 C in {city}"


def test_tool_results_are_remembered_and_recalled_with_create_react_agent(mem):
    memory = MemoryNode(mem)
    llm = RecordingChatModel([
        AIMessage(content="", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call1"}]),
        "It is sunny in Paris.",
        "Earlier it was sunny and 24 C in Paris.",
    ])
    agent = create_react_agent(llm, [get_weather], pre_model_hook=memory.pre_model_hook,
                               post_model_hook=memory.post_model_hook, checkpointer=InMemorySaver())
    state = agent.invoke({"messages": [("user", "What's the weather in Paris?")]}, cfg("alice", "t1"))
    assert isinstance(state["messages"][2], ToolMessage)
    assert not any(is_context(m) for m in state["messages"])  # hook mode: memories never enter the history

    tools = mem.list(user_id="alice", kinds=["tool"])
    assert len(tools) == 1
    assert tools[0].text == 'called with {"city": "Paris"}, returned: Sunny and 24 C in Paris'
    assert tools[0].memory_text.endswith('Tool get_weather: ' + tools[0].text)
    assert tools[0].speaker == "get_weather" and tools[0].metadata["tool_call_id"] == "call1"
    assert len(mem.list(user_id="alice")) == 3  # the question, the tool result, the answer (no empty AI turn)

    agent.invoke({"messages": [("user", "How was the weather in Paris when I asked?")]}, cfg("alice", "t2"))
    seen = llm.calls[-1]
    assert isinstance(seen[0], SystemMessage) and is_context(seen[0])  # memories first, then the conversation
    assert "Sunny and 24 C in Paris" in seen[0].content
    assert isinstance(seen[-1], HumanMessage)


def test_user_from_runtime_context(mem):
    @dataclass
    class Context:
        user_id: str

    graph = build(MemoryNode(mem), RecordingChatModel(["Hi Carol."]), InMemorySaver(), context_schema=Context)
    graph.invoke({"messages": [("user", "I am Carol.")]}, {"configurable": {"thread_id": "t1"}},
                 context=Context(user_id="carol"))
    assert [r.text for r in mem.list(user_id="carol")] == ["I am Carol.", "Hi Carol."]


def test_async_graph(mem):
    llm = RecordingChatModel(["Noted.", "Rex."])
    graph = build(MemoryNode(mem), llm, InMemorySaver())

    async def run():
        await graph.ainvoke({"messages": [("user", "My dog is called Rex.")]}, cfg("alice", "t1"))
        await graph.ainvoke({"messages": [("user", "What is my dog called?")]}, cfg("alice", "t2"))

    asyncio.run(run())
    assert "My dog is called Rex." in llm.system_text()
    assert len(mem.list(user_id="alice")) == 4


def test_missing_user_is_a_clear_error(mem):
    graph = build(MemoryNode(mem), RecordingChatModel(["x"]), InMemorySaver())
    with pytest.raises(InvalidInputError, match="user_id"):
        graph.invoke({"messages": [("user", "hello")]}, {"configurable": {"thread_id": "t1"}})


def test_store_items_are_recalled_by_the_node(mem):
    AgentMemStore(mem).put(("alice", "profile"), "diet", {"content": "Alice is vegetarian."})
    llm = RecordingChatModel(["How about a risotto?"])
    build(MemoryNode(mem), llm, InMemorySaver()).invoke(
        {"messages": [("user", "What should I cook for Alice?")]}, cfg("alice", "t1"))
    assert "Alice is vegetarian." in llm.system_text()


def test_a_memory_the_request_does_not_name_is_mounted_only_without_a_threshold(tmp_path):
    # "Suggest a dinner recipe" shares nothing MiniLM sees with "Alice is vegetarian." (cosine ~0.04): under the
    # default mount threshold (0.3) it is not mounted; mount_min_score=0.0 mounts every recalled hit, as before
    for threshold, mounted in ((None, False), (0.0, True)):
        config = {} if threshold is None else {"mount_min_score": threshold}
        with AgentMemory(tmp_path / f"m{threshold}", kv_encoding="off", **config) as mem:
            AgentMemStore(mem).put(("alice", "profile"), "diet", {"content": "Alice is vegetarian."})
            llm = RecordingChatModel(["How about a risotto?"])
            build(MemoryNode(mem), llm, InMemorySaver()).invoke(
                {"messages": [("user", "Suggest a dinner recipe for me.")]}, cfg("alice", "t1"))
            assert ("Alice is vegetarian." in llm.system_text()) is mounted


def test_kv_mode_puts_only_entry_ids_in_the_state(mem):
    rec = mem.remember("My dog is called Rex.", user_id="alice", session_id="t0")
    memory = MemoryNode(mem, model=ChatAgentMem(memory=mem))
    assert memory.mount_mode == "kv" and MemoryNode(mem).mount_mode == "text"
    update = memory.recall({"messages": [HumanMessage("What is my dog called?", id="m1")]}, cfg("alice", "t1"))
    (ctx,) = update["messages"]
    assert ctx.additional_kwargs["agentmem"] == {"mounted": [rec.id], "mode": "kv", "k": 4}
    assert "Rex" not in ctx.content


def test_a_profile_memory_comes_with_every_step(mem):
    mem.remember("My manager is called Dana Whitfield.", user_id="alice", kind="profile")
    llm = RecordingChatModel(["Sure."])
    graph = build(MemoryNode(mem), llm, InMemorySaver())
    graph.invoke({"messages": [("user", "Draft an email to my boss about the delay.")]}, cfg("alice", "t1"))
    assert "My manager is called Dana Whitfield." in llm.system_text()  # mounted although it scores as unrelated


PAGE = "\n\n".join(" ".join([s] * 6) for s in (
    "The Grand Hotel Ghent has 80 rooms and a rooftop bar overlooking the Graslei.",
    "Breakfast at the Grand Hotel is served from 7 to 10 in the winter garden.",
    "The hotel's parking garage closes at midnight and costs 25 euros a night."))


@tool
def fetch_page(url: str) -> str:
    """A web page's text."""
    return PAGE


@pytest.mark.parametrize("words, parts", [(90, 3), (None, 1)])
def test_a_long_tool_result_is_stored_as_parts_each_recalled_on_its_own(mem, words, parts):
    memory = MemoryNode(mem, tool_result_words=words)
    llm = RecordingChatModel([
        AIMessage(content="", tool_calls=[{"name": "fetch_page", "args": {"url": "grandhotel.be"}, "id": "c9"}]),
        "Got it.", "It closes at midnight."])
    agent = create_react_agent(llm, [fetch_page], pre_model_hook=memory.pre_model_hook,
                               post_model_hook=memory.post_model_hook, checkpointer=InMemorySaver())
    agent.invoke({"messages": [("user", "Read the Grand Hotel's page.")]}, cfg("alice", "t1"))
    stored = mem.list(user_id="alice", kinds=["tool"])
    assert len(stored) == parts and all(r.text.startswith('called with {"url": "grandhotel.be"}, returned: ')
                                        for r in stored)
    assert " ".join(" ".join(r.text.split(", returned: ", 1)[1] for r in stored).split()) == " ".join(PAGE.split())
    if words is not None:
        assert [r.metadata["document"]["part"] for r in stored] == [1, 2, 3]
        best = mem.recall("When does the hotel parking garage close?", user_id="alice", kinds=["tool"], k=1)[0]
        assert best.id == stored[2].id
    state = agent.invoke({"messages": [("user", "When does the parking close?")]}, cfg("alice", "t1"))
    assert len(mem.list(user_id="alice", kinds=["tool"])) == parts  # a re-run step stores nothing twice
    assert state["messages"][-1].content == "It closes at midnight."
