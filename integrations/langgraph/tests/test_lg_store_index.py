"""The store-wide ``index={"dims", "embed", "fields"}`` config and LangGraph's meaning of search scores (cosine
similarity), asserted on LangGraph's own InMemoryStore and on AgentMemStore with the same embeddings.

The behaviours are the ones LangGraph's store test-suite checks for its vector stores (scores that are cosine
similarities, max over an item's field vectors; ``fields`` choosing what is embedded; per-put ``index=`` lists
and ``index=False``); the two stores must also agree on every score to float precision.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterator

import pytest
from langchain_core.embeddings import Embeddings
from langgraph.store.base import get_text_at_path
from langgraph.store.memory import InMemoryStore

from agentmem import AgentMemory
from agentmem_langgraph import AgentMemStore

DIMS = 48


class LetterEmbeddings(Embeddings):
    """Deterministic letter-frequency vectors projected to DIMS (a LangChain ``Embeddings``):
    texts that share letters are close, equal texts are identical."""

    def __init__(self) -> None:
        rng = random.Random(7)
        self._proj: dict[str, list[float]] = {}
        self._rng = rng

    def _vec(self, text: str) -> list[float]:
        out = [0.0] * DIMS
        counts = Counter(text.lower())
        for ch, n in sorted(counts.items()):
            if ch not in self._proj:
                self._proj[ch] = [self._rng.gauss(0.0, 1.0) for _ in range(DIMS)]
            for d, p in enumerate(self._proj[ch]):
                out[d] += n * p
        norm = math.sqrt(sum(x * x for x in out)) or 1.0
        return [x / norm for x in out]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._vec(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._vec(text)



@pytest.fixture
def embeddings() -> LetterEmbeddings:
    return LetterEmbeddings()


@pytest.fixture
def make_store(tmp_path, embeddings, request) -> Iterator:
    """Both stores, built from the same index config (the test is run once per store)."""
    mems: list[AgentMemory] = []

    def make(kind: str, **index):
        config = {"dims": DIMS, "embed": embeddings, **index}
        if kind == "inmemory":
            return InMemoryStore(index=config)
        mem = AgentMemory(tmp_path / f"mem{len(mems)}", kv_encoding="off")
        mems.append(mem)
        return AgentMemStore(mem, index=config)

    yield make
    for mem in mems:
        mem.close()


KINDS = ["inmemory", "agentmem"]


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


@pytest.mark.parametrize("kind", KINDS)
def test_index_config_is_kept(make_store, kind):
    store = make_store(kind, fields=["text"])
    assert store.index_config["dims"] == DIMS and store.index_config["fields"] == ["text"]


@pytest.mark.parametrize("kind", KINDS)
def test_score_is_the_cosine_similarity_of_the_configured_embeddings(make_store, embeddings, kind):
    store = make_store(kind)
    docs = {"a": {"text": "purple penguins paddle"}, "b": {"text": "a quiet mountain lake"},
            "c": {"text": "penguins in the snow"}}
    for key, value in docs.items():
        store.put(("u1", "docs"), key, value)
    for query in ("penguins", "mountain lake", "zzz"):
        results = store.search(("u1",), query=query)
        q = embeddings.embed_query(query)
        # the whole value is embedded by default ("$": its JSON), like LangGraph's stores do
        expected = {k: _cos(q, embeddings.embed_query(_json(v))) for k, v in docs.items()}
        assert {r.key: r.score for r in results} == pytest.approx(expected, abs=1e-5), query
        assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)


def _json(value) -> str:
    return get_text_at_path(value, "$")[0]  # what LangGraph embeds for the "$" path


@pytest.mark.parametrize("kind", KINDS)
def test_fields_choose_what_is_embedded_and_the_best_field_scores(make_store, kind):
    store = make_store(kind, fields=["title", "body"])
    store.put(("u1",), "one", {"title": "xylophone", "body": "quartz", "note": "mmmm"})
    store.put(("u1",), "two", {"title": "harbour", "body": "xylophone", "note": "nnnn"})
    both = store.search(("u1",), query="xylophone")
    assert {r.key for r in both} == {"one", "two"}
    assert both[0].score == pytest.approx(1.0, abs=1e-5) and both[1].score == pytest.approx(1.0, abs=1e-5)
    assert store.search(("u1",), query="harbour")[0].key == "two"
    # "note" is not indexed: matching it scores below an exact field match
    assert all(r.score < 0.99 for r in store.search(("u1",), query="mmmm"))


@pytest.mark.parametrize("kind", KINDS)
def test_put_level_index_overrides_and_index_false_has_no_score(make_store, kind):
    store = make_store(kind, fields=["unused"])
    store.put(("u1",), "p", {"a": "kiwi", "b": "lemon"}, index=["a"])
    store.put(("u1",), "q", {"a": "grape", "b": "lemon"}, index=["b"])
    store.put(("u1",), "r", {"a": "kiwi", "b": "kiwi"}, index=False)
    kiwi = store.search(("u1",), query="kiwi")
    assert [r.key for r in kiwi][:1] == ["p"] and kiwi[0].score == pytest.approx(1.0, abs=1e-5)
    assert next(r for r in kiwi if r.key == "r").score is None and kiwi[-1].key == "r"
    lemon = store.search(("u1",), query="lemon")
    assert lemon[0].key == "q" and lemon[0].score > lemon[1].score
    # at a limit that scored items fill, the unindexed item is left out
    assert "r" not in {r.key for r in store.search(("u1",), query="kiwi", limit=2)}


@pytest.mark.parametrize("kind", KINDS)
def test_updating_an_item_replaces_its_vectors(make_store, kind):
    store = make_store(kind)
    store.put(("u1",), "d", {"text": "zebra xerxes"})
    store.put(("u1",), "e", {"text": "hound dogs"})
    before = next(r.score for r in store.search(("u1",), query="zebra xerxes") if r.key == "d")
    store.put(("u1",), "d", {"text": "hound dogs again"})
    after = next(r.score for r in store.search(("u1",), query="zebra xerxes") if r.key == "d")
    assert after < before


@pytest.mark.parametrize("kind", KINDS)
def test_filters_and_pagination_with_index(make_store, kind):
    store = make_store(kind, fields=["text"])
    for i, (text, color) in enumerate([("red apple", "red"), ("red car", "red"), ("green apple", "green"),
                                       ("blue car", "blue"), ("blue apple", "blue")]):
        store.put(("u1",), f"d{i}", {"text": text, "color": color, "n": i})
    red = store.search(("u1",), query="apple", filter={"color": "red"})
    assert [r.key for r in red] == ["d0", "d1"]
    page1 = store.search(("u1",), query="apple", limit=2)
    page2 = store.search(("u1",), query="apple", limit=2, offset=2)
    assert len(page1) == 2 and len(page2) == 2 and not {r.key for r in page1} & {r.key for r in page2}
    assert len(store.search(("u1",), query="apple", limit=10)) == 5


def test_both_stores_agree_on_every_score(make_store):
    stores = [make_store(kind, fields=["text", "tags[*]"]) for kind in KINDS]
    values = [{"text": "sunrise over the harbour", "tags": ["boats", "morning"]},
              {"text": "a recipe for plum cake", "tags": ["baking"]},
              {"text": "notes from the harbour master", "tags": []}]
    for store in stores:
        for i, v in enumerate(values):
            store.put(("u1", "n"), f"k{i}", v)
    for query in ("harbour", "cake baking", "early boats"):
        scores = [{r.key: r.score for r in s.search(("u1",), query=query)} for s in stores]
        assert scores[0] == pytest.approx(scores[1], abs=1e-6), query


def test_without_index_config_scores_are_minilm_cosine(tmp_path):
    with AgentMemory(tmp_path / "m", kv_encoding="off") as mem:
        store = AgentMemStore(mem)
        store.put(("u1",), "tea", {"content": "I drink green tea every morning"})
        store.put(("u1",), "car", {"content": "The car needs new tyres"})
        results = store.search(("u1",), query="what does the user drink?")
        assert results[0].key == "tea"
        tea = next(r.id for r in mem.list(user_id="u1") if r.metadata.get("lg:key") == "tea")
        # the vector the index holds for it (its line without the time); the query through recall's query path
        # (int8 feed-forward weights)
        vecs = mem.stored_vectors([tea], user_id="u1")[tea], mem._store.embed_query("what does the user drink?")
        assert results[0].score == pytest.approx(float(vecs[0] @ vecs[1]), abs=1e-4)
        assert -1.0 <= results[1].score < results[0].score
