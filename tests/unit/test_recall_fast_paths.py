"""Recall's latency cuts (issue #16) must not change a single hit: each faster path is pinned against the path it
replaced, on one store, to the last field and score. The store mixes the probes of recall_probes.py
(version chains, tags, filters, expired entries, another user) with recall_latency.py's generated sessions of
turns (spillover across neighbours, session boosts, consolidation's supersessions and conflict check)."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from agentmem import AgentMemory
from agentmem.ports.vectors import CONTEXT_SPACE, query_each_space
from agentmem.recall import retrieval
from agentmem.backends.sqlite.catalog import SqliteCatalog, bump_chain_cuts, chain_cuts
from agentmem.entries.store import Scope
from agentmem.entries.kb_versions import KbVersions
from agentmem.recall.multihop import for_query
from tests.unit.recall_probes import PROBES, _fill, _recalls

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from recall_latency import SUBJECTS, VERBS, sentence  # noqa: E402

GENERATED = 300


@pytest.fixture(scope="module")
def mem(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentMemory]:
    with AgentMemory(tmp_path_factory.mktemp("fast") / "m", kv_encoding="off") as m:
        _fill(m)
        rng = random.Random(0)
        m.remember_many([dict(text=sentence(rng, i), user_id="u1", session_id=f"g{i // 25}")
                         for i in range(GENERATED)])
        yield m


def _all_recalls(mem: AgentMemory) -> list[object]:
    rng = random.Random(1)
    generated = [f"what did {rng.choice(SUBJECTS)} {rng.choice(VERBS)}?" for _ in range(30)]
    return [*_recalls(mem), *(mem.recall(q, user_id="u1", k=k) for q in generated for k in (1, 5, 10))]


def test_the_two_vector_searches_side_by_side_equal_them_one_after_the_other(mem: AgentMemory) -> None:
    vectors = mem._store.vectors
    together = _all_recalls(mem)
    vectors.query_spaces = partial(query_each_space, vectors)  # one query per space, as before query_spaces
    try:
        apart = _all_recalls(mem)
    finally:
        del vectors.query_spaces
    assert together == apart
    assert any(h.scores.get("context") is not None for hits in together for h in hits)  # context vectors searched


def test_query_spaces_equals_query_per_space_with_where_ids_and_missing_spaces(mem: AgentMemory) -> None:
    store = mem._store
    vec = store.embed_query(PROBES[0])
    some = [h.id for h in mem.recall("the dog", user_id="u1", k=10)] + ["no-such-id"]
    for kwargs in ({}, {"where": {"session_id": "g3"}}, {"ids": some}):
        got = store.vectors.query_spaces(vec, user_id="u1", n=50, spaces=("", CONTEXT_SPACE), **kwargs)
        assert got == [store.vectors.query(vec, user_id="u1", n=50, space=s, **kwargs) for s in ("", CONTEXT_SPACE)]
        assert got[0] and got[1]
    # a user without vectors: every space empty, none fails
    assert store.vectors.query_spaces(vec, user_id="nobody", n=5, spaces=("", CONTEXT_SPACE)) == [[], []]


def test_the_context_search_asks_for_context_pool_and_finds_that_many(mem: AgentMemory, monkeypatch) -> None:
    store = mem._store
    vectors = store.vectors
    asked = []
    real = vectors.query_spaces

    def spy(vector, **kwargs):
        got = real(vector, **kwargs)
        asked.append((kwargs["n"], [len(h) for h in got]))
        return got

    monkeypatch.setattr(vectors, "query_spaces", spy)
    default = store.params
    assert default.context_pool == store.config.candidate_pool == 100
    mem.recall("what did the dog eat?", user_id="u1", k=5)
    # both searches ask for the pool (100) and get 100 (the user holds 300+ turns)
    assert asked == [((100, 100), [100, 100])]
    asked.clear()
    store.params = replace(default, context_pool=50)
    mem.recall("what did the dog eat?", user_id="u1", k=5)
    assert asked == [((100, 50), [100, 50])]
    asked.clear()
    store.params = replace(default, context_pool=7)
    try:
        cands, _ = store.candidates("what did the dog eat?", Scope("u1"), pool=100)
        assert asked == [((100, 7), [100, 7])] and len(cands.turn_context) == 7 and len(cands.dense) == 100
        asked.clear()
        store.candidates("what did the dog eat?", Scope("u1"), pool=5)  # never more than the pool
        assert asked == [((5, 5), [5, 5])]
    finally:
        store.params = default


def test_a_side_search_that_fails_fails_the_query_after_both_ended(mem: AgentMemory, monkeypatch) -> None:
    vectors = mem._store.vectors
    real = vectors._search
    calls = []

    def failing(col, *args):
        calls.append(col.name)
        if col.name.endswith(CONTEXT_SPACE):
            raise RuntimeError("side search failed")
        return real(col, *args)

    monkeypatch.setattr(vectors, "_search", failing)
    with pytest.raises(RuntimeError, match="side search failed"):
        vectors.query_spaces(np.ones(384, np.float32), user_id="u1", n=5, spaces=("", CONTEXT_SPACE))
    assert len(calls) == 2


def _spill_over_before(scores, places, *, share):
    """spill_over as it was before its trims (a power per turn, enumerate)."""
    out = dict(scores)
    for entry_id, score in scores.items():
        place = places.get(entry_id)
        if place is None:
            continue
        for side in (place.before, place.after):
            for distance, neighbour in enumerate(side, start=1):
                out[neighbour] = out.get(neighbour, 0.0) + share**distance * score
    return out


def _session_boost_before(scores, session_of, *, weight):
    best: dict[str, float] = {}
    for entry_id, score in scores.items():
        session = session_of.get(entry_id)
        if session is not None:
            best[session] = max(best.get(session, 0.0), score)
    out = dict(scores)
    for entry_id, score in scores.items():
        session = session_of.get(entry_id)
        if session is not None:
            out[entry_id] = score + weight * best[session]
    return out


def _rank_parts_before(cands, params):
    scores, fused, spilled = retrieval.rank_parts(cands, params)  # fusion itself is unchanged
    spilled = _spill_over_before(fused, cands.places, share=params.spillover)
    sessions = {i: p.session_id for i, p in cands.places.items()}
    for place in cands.places.values():
        for neighbour in (*place.before, *place.after):
            sessions.setdefault(neighbour, place.session_id)
    return _session_boost_before(spilled, sessions, weight=params.session_weight), fused, spilled


def test_trimmed_spillover_and_session_boost_give_the_same_floats_in_the_same_order(mem: AgentMemory) -> None:
    store = mem._store
    rng = random.Random(2)
    queries = [*PROBES, *(f"what did {rng.choice(SUBJECTS)} {rng.choice(VERBS)}?" for _ in range(20))]
    for query in queries:
        cands, _ = store.candidates(query, Scope("u1"), pool=100)
        assert any(p.before or p.after for p in cands.places.values())
        listing = for_query(store.params, "how many trips did Ann take?")  # a list question's session weight
        assert listing.session_weight != store.params.session_weight
        for params in (store.params, listing, replace(store.params, spillover=0.4)):
            got = retrieval.rank_parts(cands, params)
            want = _rank_parts_before(cands, params)
            assert [list(d.items()) for d in got] == [list(d.items()) for d in want]  # bit for bit, dict order too


def test_session_boost_keeps_zero_and_negative_scores_as_max_did() -> None:
    scores = {"a": -0.5, "b": 0.0, "c": -1.0, "d": 0.3, "e": 2.0}
    sessions = {"a": "s1", "b": "s1", "c": "s2", "d": "s3", "e": None}
    assert retrieval.session_boost(scores, sessions, weight=0.5) == _session_boost_before(scores, sessions, weight=0.5)
    places = {"d": type("P", (), {"session_id": "s3", "before": ("x", "y", "z"), "after": ()})()}
    assert retrieval.spill_over(scores, places, share=0.3) == _spill_over_before(scores, places, share=0.3)


def test_one_store_info_read_gives_the_served_versions_and_the_chain_cut_stamp(tmp_path: Path) -> None:
    cat = SqliteCatalog(str(tmp_path / "c.db"))
    kb = KbVersions(cat)
    sessions = [None, *(f"s{i}" for i in range(40))]
    assert [kb.recall_state(s) for s in sessions] == [(kb.served(s), 0) for s in sessions]  # nothing declared yet
    kb.set("v1")
    kb.set("v2", rollout=0.5)
    for _ in range(3):
        with cat.transaction() as s:
            bump_chain_cuts(s)
    got = [kb.recall_state(s) for s in sessions]
    assert got == [(kb.served(s), chain_cuts(cat)) for s in sessions] and chain_cuts(cat) == 3
    assert {served for served, _ in got} == {("v1", None), ("v2", None)}  # both sides of the rollout seen
    cat.close()


def test_recall_hands_its_stamp_to_the_chain_ends_and_a_cut_elsewhere_still_resets_them(mem: AgentMemory) -> None:
    chains = mem._store.chains
    reads = []
    real = chains._stamp
    chains._stamp = lambda: reads.append(1) or real()
    try:
        before = _all_recalls(mem)
        assert reads == []  # the stamp came with the knowledge versions' read
        with mem._store.catalog.transaction() as s:  # what a forget or update in another process does
            bump_chain_cuts(s)
        mem.recall(PROBES[0], user_id="u1")
        assert chains._seen == chain_cuts(mem._store.catalog)  # the moved stamp was seen: chains forgotten
        assert _all_recalls(mem) == before
    finally:
        chains._stamp = real


def _pair_features_before(new, new_words, olds, old_words, *, min_background=3):
    """pair_features as it was before it wrote its rows in place (np.median, np.stack, np.hstack)."""
    from agentmem.consolidate.pairs import BACKGROUND_NEIGHBOURS, NEW_SCALE, PRODUCT_SCALE, _jaccard

    old = np.asarray(olds, dtype=np.float32)
    cos = old @ new
    top = np.sort(cos)[::-1][:BACKGROUND_NEIGHBOURS]
    background = float(np.median(top)) if len(top) >= min_background else 1.0
    nearest = np.zeros(len(cos), dtype=np.float32)
    nearest[int(np.argmax(cos))] = 1.0
    scalars = np.stack([cos, cos - background, np.array([_jaccard(w, new_words) for w in old_words]), nearest], 1)
    return np.hstack([scalars, PRODUCT_SCALE * old * new, np.repeat(NEW_SCALE * new[None, :], len(old), 0)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pair_features_in_place_are_the_stacked_features_bit_for_bit(dtype) -> None:
    from agentmem.consolidate.pairs import PairModel, pair_features

    rng = np.random.default_rng(3)
    vocab = ["lyon", "paris", "dog", "cat", "tea", "kayak", "red", "blue"]
    model = PairModel.bundled()
    for m in range(1, 14):  # odd and even backgrounds, fewer than 3 (no background) and more than 10 (cut)
        for _ in range(5):
            vecs = rng.standard_normal((m + 1, 384)).astype(dtype)
            vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
            words = [set(rng.choice(vocab, size=int(rng.integers(0, 4)), replace=False)) for _ in range(m + 1)]
            for floor in (3, 1):
                got = pair_features(vecs[0], words[0], list(vecs[1:]), words[1:], min_background=floor)
                want = _pair_features_before(vecs[0], words[0], list(vecs[1:]), words[1:], min_background=floor)
                assert got.dtype == want.dtype and got.shape == want.shape
                assert np.array_equal(got, want)
                if model is not None and dtype is np.float32:
                    assert np.array_equal(got @ model.weights + model.bias, want @ model.weights + model.bias)


def test_look_ahead_hits_outside_the_dense_pool_have_their_cosine_read_only_when_their_score_is(
        mem: AgentMemory, monkeypatch: pytest.MonkeyPatch) -> None:
    """recall ranks k hits plus its conflict check's look-ahead; a hit the dense pool did not return gets its cosine
    from a search restricted to such hits, now made only when recall reads one of their scores. ``min_score=0``
    reads every ranked hit's score before the cut (it keeps them all): the hits are the same, field for field."""
    vectors = mem._store.vectors
    real, reads = vectors.query, []

    def counted(vector: np.ndarray, **kwargs: object) -> list[tuple[str, float]]:
        if kwargs.get("ids") is not None:
            reads.append(kwargs["ids"])
        return real(vector, **kwargs)

    monkeypatch.setattr(vectors, "query", counted)
    rng = random.Random(3)
    queries = [*PROBES, *(f"what did {rng.choice(SUBJECTS)} {rng.choice(VERBS)}?" for _ in range(30))]
    asked = [(q, k) for q in queries for k in (1, 3, 5)]
    lazy = [mem.recall(q, user_id="u1", k=k) for q, k in asked]
    lazy_reads, reads[:] = len(reads), []
    eager = [mem.recall(q, user_id="u1", k=k, min_score=0.0) for q, k in asked]
    assert lazy == eager
    assert 0 < lazy_reads < len(reads)  # some returned hits needed it; more look-ahead hits did not
    assert all("dense" in h.scores for hits in lazy for h in hits)
