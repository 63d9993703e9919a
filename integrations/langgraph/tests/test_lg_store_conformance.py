"""One suite of BaseStore assertions, run on LangGraph's own InMemoryStore and on AgentMemStore.

Every test states behaviour InMemoryStore has; AgentMemStore must match it on the operations both share.
Order is only asserted where LangGraph defines it (ranked search, list_namespaces); plain listing order is
compared as sets because InMemoryStore's is an accident of dict insertion.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from collections.abc import Iterator

import pytest
from langgraph.store.base import GetOp, InvalidNamespaceError, Item, ListNamespacesOp, PutOp, SearchItem, SearchOp
from langgraph.store.memory import InMemoryStore

from agentmem import AgentMemory
from agentmem_langgraph import AgentMemStore

DIMS = 64


def _embed(texts: list[str]) -> list[list[float]]:
    """Bag-of-words hashing: enough for InMemoryStore to rank an item that shares the query's words first."""
    out = []
    for text in texts:
        v = [0.0] * DIMS
        for word in re.findall(r"[a-z]+", text.lower()):
            v[int(hashlib.md5(word.encode()).hexdigest(), 16) % DIMS] += 1.0
        n = math.sqrt(sum(x * x for x in v)) or 1.0
        out.append([x / n for x in v])
    return out


@pytest.fixture(params=["inmemory", "agentmem"])
def store(request, tmp_path) -> Iterator:
    if request.param == "inmemory":
        yield InMemoryStore(index={"dims": DIMS, "embed": _embed})
    else:
        with AgentMemory(tmp_path / "mem", kv_encoding="off") as mem:
            yield AgentMemStore(mem)


def keys(items) -> set[tuple[tuple[str, ...], str]]:
    return {(tuple(i.namespace), i.key) for i in items}


def test_put_get_roundtrip(store):
    store.put(("u1", "prefs"), "drink", {"content": "green tea", "n": 3, "nested": {"a": [1, 2]}})
    item = store.get(("u1", "prefs"), "drink")
    assert isinstance(item, Item)
    assert item.value == {"content": "green tea", "n": 3, "nested": {"a": [1, 2]}}
    assert item.key == "drink" and item.namespace == ("u1", "prefs")
    assert item.created_at.tzinfo is not None and item.updated_at >= item.created_at
    assert store.get(("u1", "prefs"), "missing") is None
    assert store.get(("u2", "prefs"), "drink") is None  # same key, other namespace


def test_put_overwrites_and_delete_removes(store):
    ns = ("u1", "facts")
    store.put(ns, "city", {"content": "Paris"})
    store.put(ns, "city", {"content": "Lyon"})
    assert store.get(ns, "city").value == {"content": "Lyon"}
    assert len(store.search(ns)) == 1
    store.delete(ns, "city")
    assert store.get(ns, "city") is None
    assert store.search(ns) == []
    store.delete(ns, "never-existed")  # deleting a missing key is not an error


def test_search_is_scoped_to_the_prefix(store):
    store.put(("u1", "a"), "k1", {"content": "one"})
    store.put(("u1", "a", "deep"), "k2", {"content": "two"})
    store.put(("u1", "b"), "k3", {"content": "three"})
    store.put(("u2", "a"), "k4", {"content": "four"})
    assert keys(store.search(("u1", "a"))) == {(("u1", "a"), "k1"), (("u1", "a", "deep"), "k2")}
    assert keys(store.search(("u1",))) == {(("u1", "a"), "k1"), (("u1", "a", "deep"), "k2"), (("u1", "b"), "k3")}
    assert keys(store.search(("u2",))) == {(("u2", "a"), "k4")}
    assert len(store.search(())) == 4
    assert store.search(("nobody",)) == []
    assert all(isinstance(i, SearchItem) for i in store.search(("u1",)))


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        ({"color": "red"}, {"a", "c"}),
        ({"color": {"$eq": "red"}}, {"a", "c"}),
        ({"color": {"$ne": "red"}}, {"b", "d"}),
        ({"size": {"$gt": 2}}, {"c", "d"}),
        ({"size": {"$gte": 2}}, {"b", "c", "d"}),
        ({"size": {"$lt": 2}}, {"a"}),
        ({"size": {"$lte": 2, "$gt": 1}}, {"b"}),
        ({"color": "red", "size": {"$gte": 3}}, {"c"}),
        ({"meta": {"shape": "round"}}, {"b"}),
        ({"tags": ["x", "y"]}, {"d"}),
        ({"color": "purple"}, set()),
    ],
)
def test_search_filters(store, flt, expected):
    ns = ("u1", "things")
    store.put(ns, "a", {"content": "apple", "color": "red", "size": 1})
    store.put(ns, "b", {"content": "ball", "color": "blue", "size": 2, "meta": {"shape": "round"}})
    store.put(ns, "c", {"content": "car", "color": "red", "size": 3})
    store.put(ns, "d", {"content": "dice", "color": "white", "size": 4, "tags": ["x", "y"]})
    assert {i.key for i in store.search(ns, filter=flt)} == expected


def test_search_pagination(store):
    ns = ("u1", "notes")
    for n in range(7):
        store.put(ns, f"n{n}", {"content": f"note number {n}", "n": n})
    page1 = store.search(ns, limit=3)
    page2 = store.search(ns, limit=3, offset=3)
    page3 = store.search(ns, limit=3, offset=6)
    assert [len(page1), len(page2), len(page3)] == [3, 3, 1]
    assert keys(page1) | keys(page2) | keys(page3) == {(ns, f"n{n}") for n in range(7)}
    assert not keys(page1) & keys(page2)
    assert store.search(ns, limit=0) == []


def test_semantic_search_ranks_the_matching_item_first(store):
    ns = ("u1", "memories")
    store.put(ns, "food", {"content": "I love pizza with extra cheese"})
    store.put(ns, "pet", {"content": "my cat sleeps all day on the sofa"})
    store.put(ns, "work", {"content": "the quarterly report is due on friday"})
    results = store.search(ns, query="pizza cheese")
    assert results[0].key == "food"
    assert results[0].score is not None and results[0].score >= (results[-1].score or 0)
    assert store.search(ns, query="cat sofa", limit=1)[0].key == "pet"
    # query and filter together: the filter wins over relevance
    store.put(ns, "food2", {"content": "pizza is my favourite", "kind": "opinion"})
    assert [i.key for i in store.search(ns, query="pizza", filter={"kind": "opinion"})] == ["food2"]


def test_list_namespaces(store):
    for ns in [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f"), ("a", "c", "f")]:
        store.put(ns, "k", {"content": "x"})
    assert store.list_namespaces() == sorted(
        [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f"), ("a", "c", "f")]
    )
    assert store.list_namespaces(prefix=("a", "b"), max_depth=3) == [("a", "b", "c"), ("a", "b", "d"), ("a", "b", "f")]
    assert store.list_namespaces(suffix=("f",)) == [("a", "b", "f"), ("a", "c", "f")]
    assert store.list_namespaces(prefix=("a", "*", "f")) == [("a", "b", "f"), ("a", "c", "f")]
    assert store.list_namespaces(max_depth=2) == [("a", "b"), ("a", "c")]
    assert store.list_namespaces(limit=2, offset=1) == [("a", "b", "d", "e"), ("a", "b", "d", "i")]


def test_batch_reads_see_the_store_before_the_batch_writes(store):
    ns = ("u1", "batch")
    store.put(ns, "old", {"content": "before"})
    results = store.batch([
        PutOp(ns, "new", {"content": "written in the batch"}),
        GetOp(ns, "new"),
        GetOp(ns, "old"),
        SearchOp(ns),
        ListNamespacesOp(),
        PutOp(ns, "old", None),
    ])
    assert results[0] is None and results[1] is None
    assert results[2].value == {"content": "before"}
    assert keys(results[3]) == {(ns, "old")}
    assert results[4] == [ns]
    assert results[5] is None
    assert store.get(ns, "old") is None and store.get(ns, "new").value == {"content": "written in the batch"}


def test_last_write_in_a_batch_wins(store):
    ns = ("u1", "batch")
    store.batch([PutOp(ns, "k", {"v": 1}), PutOp(ns, "k", {"v": 2})])
    assert store.get(ns, "k").value == {"v": 2}
    assert len(store.search(ns)) == 1


def test_async_api(store):
    async def run():
        await store.aput(("u1", "async"), "k", {"content": "async value"})
        got = await store.aget(("u1", "async"), "k")
        found = await store.asearch(("u1",), query="async value")
        spaces = await store.alist_namespaces()
        await store.adelete(("u1", "async"), "k")
        return got, found, spaces, await store.aget(("u1", "async"), "k")

    got, found, spaces, gone = asyncio.run(run())
    assert got.value == {"content": "async value"}
    assert [i.key for i in found] == ["k"]
    assert spaces == [("u1", "async")]
    assert gone is None


@pytest.mark.parametrize("bad", [(), ("langgraph", "x"), ("a", ""), ("a.b",)])
def test_invalid_namespaces_are_rejected(store, bad):
    with pytest.raises(InvalidNamespaceError):
        store.put(bad, "k", {"v": 1})
