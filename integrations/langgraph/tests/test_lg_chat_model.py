"""ChatAgentMem: KV mounting through mem.generate / mem.session, as a LangChain model and inside graphs.

A tiny random Llama stands in for the local LLM: its text is junk but deterministic, and every code path
(encode, store, load, re-rotate, mount, session reuse) is the real one. One slow test runs SmolLM2.
"""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.prebuilt import create_react_agent

from agentmem import AgentMemory
from agentmem_langgraph import ChatAgentMem, MemoryNode, is_context
from agentmem_langgraph._context import context_message
from lg_graphs import build


@pytest.fixture
def kvmem(tmp_path, tiny_lm):
    with AgentMemory(tmp_path / "kvmem", model=tiny_lm) as m:
        m.remember("I moved to Lyon last May.", user_id="alice", session_id="old")
        m.remember("My dog is called Rex.", user_id="alice", session_id="old")
        m.remember("Bob's cat is called Tom.", user_id="bob", session_id="old")
        yield m


def test_invoke_mounts_recalled_memories_as_kv(kvmem):
    llm = ChatAgentMem(memory=kvmem, user_id="alice", k=1, max_new_tokens=6)
    msg = llm.invoke("Where do I live now that I moved?")
    info = msg.response_metadata["agentmem"]
    lyon = kvmem.recall("Where do I live now that I moved?", user_id="alice", k=1)[0]
    assert info["mounted"] == [lyon.id] and info["mode"] == "kv" and info["user_id"] == "alice"
    assert {"retrieve", "load", "mount", "prefill", "ttft", "total"} <= set(info["timings"])
    assert msg.usage_metadata["input_tokens"] > 0 and msg.usage_metadata["output_tokens"] <= 6
    # streaming and async give the same (greedy) answer
    assert "".join(c.content for c in llm.stream("Where do I live now that I moved?")) == msg.content
    assert asyncio.run(llm.ainvoke("Where do I live now that I moved?")).content == msg.content


def test_reads_mounted_ids_from_the_node_context_message(kvmem):
    llm = ChatAgentMem(memory=kvmem, user_id="alice", max_new_tokens=4)
    dog = kvmem.recall("dog", user_id="alice", k=1)[0]
    ctx = context_message([dog], mode="kv")
    out = llm.invoke([ctx, HumanMessage("What is my dog's name?")])
    assert out.response_metadata["agentmem"]["requested"] == [dog.id]
    assert out.response_metadata["agentmem"]["mounted"] == [dog.id]
    # the node found nothing relevant: nothing is mounted
    empty = llm.invoke([context_message([], mode="kv"), HumanMessage("What is my dog's name?")])
    assert empty.response_metadata["agentmem"]["mounted"] == []
    # ids may also come through config metadata
    meta = llm.invoke("What is my dog's name?", config={"metadata": {"agentmem_mounted": []}})
    assert meta.response_metadata["agentmem"]["mounted"] == []


def test_user_comes_from_config_and_users_stay_isolated(kvmem):
    llm = ChatAgentMem(memory=kvmem, k=3, max_new_tokens=2)
    out = llm.invoke("What is my pet called?", config={"metadata": {"user_id": "bob"}})
    assert out.response_metadata["agentmem"]["user_id"] == "bob"
    alice_ids = {r.id for r in kvmem.list(user_id="alice")}
    assert not set(out.response_metadata["agentmem"]["mounted"]) & alice_ids


def test_bind_tools_binds_openai_schemas(kvmem):
    # tool calling itself: tests/test_lg_tools.py
    bound = ChatAgentMem(memory=kvmem).bind_tools([{"type": "function", "function": {"name": "f"}}])
    assert bound.kwargs["tools"][0]["function"]["name"] == "f"


def test_graph_with_node_sessions_and_sqlite_checkpoints(kvmem, tmp_path):
    llm = ChatAgentMem(memory=kvmem, k=2, max_new_tokens=6)
    saver = SqliteSaver(sqlite3.connect(str(tmp_path / "ckpt.sqlite"), check_same_thread=False))
    graph = build(MemoryNode(kvmem, model=llm), llm, saver)
    config = {"configurable": {"user_id": "alice", "thread_id": "t1"}}

    first = graph.invoke({"messages": [("user", "Where do I live?")]}, config)
    ctx = [m for m in first["messages"] if is_context(m)]
    assert len(ctx) == 1 and ctx[0].additional_kwargs["agentmem"]["mode"] == "kv"
    assert "Lyon" not in ctx[0].content  # KV mode: the state carries entry ids, not memory text
    answer = first["messages"][-1]
    assert isinstance(answer, AIMessage)
    assert answer.response_metadata["agentmem"]["thread_id"] == "t1"
    assert answer.response_metadata["agentmem_memory"]["by"] == "session"

    second = graph.invoke({"messages": [("user", "And what is my dog called?")]}, config)
    info = second["messages"][-1].response_metadata["agentmem"]
    assert info["reused_tokens"] > 0  # the first turn's KV was reused, not re-encoded
    assert info["mounted"] == info["requested"]  # the session mounted what the node chose (not this thread's turns)
    turns = [r.text for r in kvmem.list(user_id="alice", session_id="t1")]
    assert turns.count("Where do I live?") == 1 and turns.count("And what is my dog called?") == 1
    # the checkpoint round-trips through SQLite (no tensors in the state)
    restored = saver.get_tuple(config).checkpoint["channel_values"]["messages"]
    assert [m.id for m in restored] == [m.id for m in second["messages"]]
    saver.conn.close()


def test_react_agent_hooks_mount_nothing_when_the_node_keeps_nothing(kvmem):
    llm = ChatAgentMem(memory=kvmem, max_new_tokens=4)
    picky = MemoryNode(kvmem, model=llm, min_score=1.0)  # drops every recalled memory (scores are < 1)
    agent = create_react_agent(llm, [], pre_model_hook=picky.pre_model_hook, post_model_hook=picky.post_model_hook,
                               checkpointer=InMemorySaver())
    out = agent.invoke({"messages": [("user", "Where do I live?")]},
                       {"configurable": {"user_id": "alice", "thread_id": "t9"}})
    info = out["messages"][-1].response_metadata["agentmem"]
    assert info["requested"] == [] and info["mounted"] == []
    assert not any(is_context(m) for m in out["messages"])  # hook mode: the state holds the conversation only


@pytest.mark.slow
def test_smollm2_mounts_a_memory_told_in_another_thread(tmp_path):
    # The integration's job is to mount the right entries and reuse the session KV; whether a 135M model then
    # answers correctly is the engine's and the model's business, so the answer's content is not asserted.
    with AgentMemory(tmp_path / "real") as mem:  # the embedded SmolLM2-135M-Instruct
        llm = ChatAgentMem(memory=mem, k=2, max_new_tokens=12)
        graph = build(MemoryNode(mem, model=llm), llm, InMemorySaver())
        graph.invoke({"messages": [("user", "My favourite city is Lisbon.")]},
                     {"configurable": {"user_id": "alice", "thread_id": "t1"}})
        t2 = {"configurable": {"user_id": "alice", "thread_id": "t2"}}
        out = graph.invoke({"messages": [("user", "What is my favourite city?")]}, t2)
        told = mem.list(user_id="alice", session_id="t1")[0]
        assert told.text == "My favourite city is Lisbon."
        assert told.id in out["messages"][-1].response_metadata["agentmem"]["mounted"]
        assert out["messages"][-1].content.strip()
        again = graph.invoke({"messages": [("user", "Thanks!")]}, t2)
        assert again["messages"][-1].response_metadata["agentmem"]["reused_tokens"] > 0
