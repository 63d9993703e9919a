"""AgentMemStore beyond the shared conformance suite: the agentmem mapping, TTL, persistence, agents."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Annotated

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.prebuilt import InjectedStore, create_react_agent
from langgraph.store.base import BaseStore, PutOp

from agentmem import AgentMemory, InvalidInputError
from agentmem_langgraph import AgentMemStore
from lg_fakes import RecordingChatModel


def test_namespace_maps_to_user_tags_and_metadata(mem):
    store = AgentMemStore(mem, user_index=1)  # LangMem's ("memories", "{langgraph_user_id}")
    store.put(("memories", "alice"), "k1", {"content": {"content": "Alice is allergic to peanuts"}, "kind": "Memory"})
    store.put(("memories", "bob"), "k2", {"content": "Bob collects stamps"})
    (rec,) = mem.list(user_id="alice")
    assert rec.kind == "knowledge" and rec.text == "Alice is allergic to peanuts"
    assert rec.metadata["lg:namespace"] == ["memories", "alice"] and rec.metadata["lg:key"] == "k1"
    assert 'lg-ns:["memories"]' in rec.tags and 'lg-ns:["memories","alice"]' in rec.tags
    # the user is agentmem's isolation boundary
    assert [h.text for h in mem.recall("peanuts", user_id="bob", k=5)] == ["Bob collects stamps"]
    assert [i.key for i in store.search(("memories", "bob"), query="peanut allergy")] == ["k2"]
    # a prefix above the user spans users (through the namespace registry), still one result per item
    assert {i.key for i in store.search(("memories",), query="allergy")} == {"k1", "k2"}
    # a namespace shorter than the user index goes to the shared user
    store.put(("memories",), "k3", {"content": "shared note"})
    assert [r.text for r in mem.list(user_id="_langgraph_shared")] == ["shared note"]
    # erasing a subtree with agentmem's own tools
    assert mem.forget(tags=['lg-ns:["memories","alice"]']) == 1
    assert store.get(("memories", "alice"), "k1") is None


def test_update_keeps_created_at_and_persists_across_reopen(tmp_path):
    with AgentMemory(tmp_path / "m", kv_encoding="off") as mem:
        store = AgentMemStore(mem)
        store.put(("u1", "prefs"), "drink", {"content": "coffee"})
        first = store.get(("u1", "prefs"), "drink")
        store.put(("u1", "prefs"), "drink", {"content": "green tea"})
        second = store.get(("u1", "prefs"), "drink")
        assert second.created_at == first.created_at and second.updated_at > first.updated_at
    with AgentMemory(tmp_path / "m", kv_encoding="off") as mem:
        store = AgentMemStore(mem)
        assert store.get(("u1", "prefs"), "drink").value == {"content": "green tea"}
        assert store.list_namespaces() == [("u1", "prefs")]
        assert len(mem.list(user_id="u1")) == 1  # the overwritten version is erased, not hidden


def test_ttl_expiry_and_refresh_on_read(mem):
    store = AgentMemStore(mem)
    assert store.supports_ttl
    store.put(("u1", "tmp"), "short", {"content": "gone soon"}, ttl=1.0 / 60)  # minutes, as in LangGraph
    store.put(("u1", "tmp"), "kept", {"content": "refreshed"}, ttl=2.0 / 60)
    store.put(("u1", "tmp"), "forever", {"content": "no ttl"})
    time.sleep(1.3)
    assert store.get(("u1", "tmp"), "short") is None  # expired: invisible at once, before any sweep
    assert store.get(("u1", "tmp"), "kept") is not None  # read at ~1.3 s: its 2 s clock restarts
    time.sleep(1.2)  # ~2.5 s after the put, ~1.2 s after the refresh
    assert store.get(("u1", "tmp"), "kept", refresh_ttl=False) is not None
    assert {i.key for i in store.search(("u1",))} == {"kept", "forever"}
    assert store.sweep_ttl() >= 1


def test_ttl_as_a_timedelta_or_an_expiry_datetime(mem):
    """Newer LangGraph releases take ``ttl=timedelta(...)`` or an expiry ``datetime`` in ``put`` (older ones hand it
    to the store as given): both expire the item when they say, and a ttl of another type is refused before
    anything of the batch is written."""
    store = AgentMemStore(mem)
    start = datetime.now(timezone.utc)
    store.put(("u1", "tmp"), "delta", {"content": "fifteen minutes"}, ttl=timedelta(minutes=15))
    store.put(("u1", "tmp"), "until", {"content": "one hour"}, ttl=start + timedelta(hours=1))
    expiry = {r.metadata["lg:key"]: r.expires_at for r in mem.list(user_id="u1")}
    assert abs((expiry["delta"] - start).total_seconds() - 900) < 30
    assert abs((expiry["until"] - start).total_seconds() - 3600) < 30
    with pytest.raises(InvalidInputError, match="ttl must be minutes"):
        store.batch([PutOp(("u1", "tmp"), "a", {"content": "a"}), PutOp(("u1", "tmp"), "b", {"content": "b"}, ttl="soon")])
    assert store.get(("u1", "tmp"), "a") is None and len(mem.list(user_id="u1")) == 2


def test_default_ttl_from_config(mem):
    store = AgentMemStore(mem, ttl={"default_ttl": 0.5 / 60, "refresh_on_read": False})
    store.put(("u1", "tmp"), "k", {"content": "x"})
    time.sleep(0.8)
    assert store.get(("u1", "tmp"), "k") is None
    assert store.list_namespaces() == []  # a namespace whose items all expired is not listed


def test_default_refresh_on_read_is_ttl_configs_documented_default(mem):
    # TTLConfig says refresh_on_read "defaults to True if not configured" (InMemoryStore agrees); LangGraph's
    # SqliteStore refreshes only when it is set: docs/langgraph.md states which one this store follows
    def expiry(user: str):
        return max(r.expires_at for r in mem.list(user_id=user))

    for user, config, refreshes in (("u1", {"default_ttl": 60}, True),
                                    ("u2", {"default_ttl": 60, "refresh_on_read": False}, False)):
        store = AgentMemStore(mem, ttl=config)
        store.put((user, "tmp"), "k", {"content": "x"})
        before = expiry(user)
        time.sleep(0.05)
        assert store.get((user, "tmp"), "k") is not None
        assert (expiry(user) > before) is refreshes, config


def test_dotted_filter_key_reads_a_nested_field(mem):
    store = AgentMemStore(mem)
    store.put(("docs",), "hyphen", {"user": {"access-level": "nested"}, "content": "a nested level"})
    store.put(("docs",), "other", {"user": {"access-level": "top"}, "content": "another level"})
    store.put(("docs",), "flat", {"user.access-level": "literal", "content": "a dotted top-level field"})
    assert [i.key for i in store.search(("docs",), filter={"user.access-level": "nested"})] == ["hyphen"]
    assert [i.key for i in store.search(("docs",), query="level", filter={"user.access-level": "nested"})] == [
        "hyphen"]
    assert [i.key for i in store.search(("docs",), filter={"user.access-level": {"$ne": "nested"}})] == [
        "other", "flat"]
    assert [i.key for i in store.search(("docs",), filter={"user.access-level": "literal"})] == ["flat"]


@pytest.mark.parametrize("key", ["bad key", "a'); DROP TABLE store; --", "user[0]", "$eq", ""])
def test_invalid_filter_key_raises(mem, key):
    store = AgentMemStore(mem)
    store.put(("docs",), "k", {"content": "x"})
    with pytest.raises(InvalidInputError, match="invalid filter key"):
        store.search(("docs",), filter={key: "x"})
    with pytest.raises(ValueError):  # LangGraph's stores raise ValueError: InvalidInputError is one
        store.search(("docs",), query="x", filter={key: "x"})


def test_namespace_with_only_deleted_items_is_not_listed(mem):
    store = AgentMemStore(mem)
    store.put(("a", "b"), "k", {"content": "x"})
    store.put(("a", "c"), "k", {"content": "y"})
    store.delete(("a", "c"), "k")
    assert store.list_namespaces() == [("a", "b")]


@tool
def save_fact(fact: str, store: Annotated[BaseStore, InjectedStore()]) -> str:
    """Save a fact about the user."""
    store.put(("alice", "facts"), "fact-1", {"content": fact})
    return "saved"


def test_create_react_agent_with_the_store(mem):
    store = AgentMemStore(mem)
    llm = RecordingChatModel([
        AIMessage(content="", tool_calls=[{"name": "save_fact", "args": {"fact": "Alice runs marathons"},
                                           "id": "c1"}]),
        "Saved.",
    ])
    agent = create_react_agent(llm, [save_fact], store=store)
    agent.invoke({"messages": [("user", "Remember that I run marathons.")]})
    assert store.get(("alice", "facts"), "fact-1").value == {"content": "Alice runs marathons"}
    assert mem.recall("sport", user_id="alice", k=1)[0].text == "Alice runs marathons"


def test_put_record_says_what_the_put_did(mem):
    store = AgentMemStore(mem)
    first = store.put_record(("u1", "prefs"), "drink", {"content": "likes green tea"})
    assert first.event == "ADD" and first.version == 1 and first.user_id == "u1"
    again = store.put_record(("u1", "prefs"), "drink", {"content": "likes green tea."})  # keys decide, not similarity
    assert again.event == "UPDATE" and again.id == first.id and again.version == 2
    assert [v.op for v in mem.history(first.id)] == ["add", "update"]
    assert store.get(("u1", "prefs"), "drink").value == {"content": "likes green tea."}
    assert store.put(("u1", "prefs"), "food", {"content": "ramen"}) is None  # LangGraph's contract


def test_items_under_the_profile_namespace_are_mounted_with_every_answer(mem):
    store = AgentMemStore(mem, profile_namespace="profile")
    store.put(("alice", "profile"), "boss", {"content": "My manager is called Dana Whitfield."})
    store.put(("alice", "notes"), "trip", {"content": "The trip to Oslo is in May."})
    boss = store.put_record(("alice", "profile"), "boss", {"content": "My manager is called Dana Whitfield."})
    assert boss.kind == "profile" and mem.get(boss.id).kind == "profile"
    mounted = mem.recall_for_mount("Draft an email to my boss about the delay.", user_id="alice")
    assert [h.id for h in mounted][:1] == [boss.id]  # a request that does not name the manager still gets it
    assert [i.key for i in store.search(("alice",), query="who is my manager?")][:1] == ["boss"]  # searchable
    assert store.get(("alice", "notes"), "trip") is not None
    plain = AgentMemStore(mem)  # without the option every item is knowledge
    assert plain.put_record(("bob", "profile"), "x", {"content": "I like tea."}).kind == "knowledge"
