"""LangGraph's AgentMemStore on the lifecycle: a put on an existing key is an update with history; index=False."""

from __future__ import annotations

import pytest

from agentmem import AgentMemory
from agentmem_langgraph import AgentMemStore

# the facade on the SQLite file and on the in-process catalog written against the port alone (tests/conftest.py)
pytestmark = pytest.mark.catalogs(None, "memory")


def test_put_on_an_existing_key_is_an_update_with_history(mem: AgentMemory) -> None:
    store = AgentMemStore(mem)
    store.put(("u1", "prefs"), "city", {"content": "lives in Lyon"})
    first = mem.list(user_id="u1")
    store.put(("u1", "prefs"), "city", {"content": "lives in Paris"})
    now = mem.list(user_id="u1")
    assert len(first) == len(now) == 1 and now[0].id == first[0].id and now[0].version == 2
    assert [(v.op, v.text) for v in mem.history(now[0].id)] == [("add", "lives in Lyon"), ("update", "lives in Paris")]
    assert store.get(("u1", "prefs"), "city").value == {"content": "lives in Paris"}
    assert [i.value for i in store.search(("u1",), query="where does the user live?")] == [{"content": "lives in Paris"}]
    store.delete(("u1", "prefs"), "city")
    assert store.get(("u1", "prefs"), "city") is None and mem.list(user_id="u1") == []


def test_index_false_is_stored_but_not_embedded(mem: AgentMemory) -> None:
    store = AgentMemStore(mem)
    store.put(("u1", "notes"), "n1", {"content": "the parking spot is B12"}, index=False)
    store.put(("u1", "notes"), "n2", {"content": "the gym opens at six"})
    assert store.get(("u1", "notes"), "n1").value == {"content": "the parking spot is B12"}
    # n1 has no vector: it comes after the scored items, without a score (LangGraph's contract)
    assert [(i.key, i.score is None) for i in store.search(("u1",), query="parking spot B12")] == [("n2", False),
                                                                                                  ("n1", True)]
    assert {i.key for i in store.search(("u1", "notes"))} == {"n1", "n2"}  # but listed
    report = mem.verify()
    assert report["rows_missing_vector"] == 0 and report["vectors"] == report["rows"] - 1  # n1 has no vector
    # switching a key to index=False on update drops its vector; back to indexed restores it
    store.put(("u1", "notes"), "n2", {"content": "the gym opens at seven"}, index=False)
    assert all(i.score is None for i in store.search(("u1",), query="gym opens"))
    store.put(("u1", "notes"), "n2", {"content": "the gym opens at seven"})
    assert [i.key for i in store.search(("u1",), query="gym opens") if i.score is not None] == ["n2"]
    assert mem.verify()["rows_missing_vector"] == 0
