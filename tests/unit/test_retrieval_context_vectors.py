"""Turn context vectors (agentmem.entries.context_vectors): written at remember(), kept current through forget /
expiry / update, leaving no trace of an erased turn, and fused into recall; on the embedded store and PostgreSQL +
pgvector (the Chroma server shares the embedded index's code: its space is covered by tests/conformance)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from agentmem import AgentMemory, MemoryConfig
from agentmem.ports.vectors import CONTEXT_SPACE
from agentmem.security import scan_tree_for_markers
from agentmem.entries.context_vectors import context_vector
from agentmem.recall.retrieval import Candidates, RetrievalParams, rank_scores

TURNS = [("Have you been to the lake lately?", "Ann"), ("Yes, the one by the mountains, we swam there!", "Bob"),
         ("I love it there, so calm.", "Ann"), ("We should camp by the water next month.", "Bob")]


@pytest.fixture(params=["embedded", "postgres+pgvector"])
def mem(request: pytest.FixtureRequest, tmp_path: Path):
    urls = {}
    if request.param != "embedded":
        urls = {"catalog_url": request.getfixturevalue("fresh_postgres_url"), "vector_url": "pgvector"}
    with AgentMemory(tmp_path / "s", config=MemoryConfig(kv_encoding="off", consolidation="off", **urls)) as m:
        yield m


def _talk(mem: AgentMemory, user: str = "u", session: str = "s1", turns=TURNS) -> list[str]:
    return [r.id for r in mem.remember_many([dict(text=t, user_id=user, session_id=session, kind="turn", speaker=s)
                                             for t, s in turns])]


def _own(mem: AgentMemory, ids: list[str], user: str = "u") -> dict[str, np.ndarray]:
    return mem._store.vectors.get(user, ids)


def _ctx(mem: AgentMemory, ids: list[str], user: str = "u") -> dict[str, np.ndarray]:
    return mem._store.vectors.get(user, ids, space=CONTEXT_SPACE)


def test_a_turn_context_vector_is_its_own_plus_its_predecessors(mem: AgentMemory) -> None:
    ids = _talk(mem)
    other = _talk(mem, session="s2", turns=TURNS[:1])  # another session: not anyone's predecessor
    fact = mem.remember("Returns are accepted for 60 days.", user_id="u", kind="knowledge").id
    own, ctx = _own(mem, ids + other), _ctx(mem, ids + other + [fact])
    assert fact not in ctx and np.allclose(ctx[other[0]], own[other[0]], atol=1e-5)
    assert np.allclose(ctx[ids[0]], own[ids[0]], atol=1e-5)  # the first turn of its session: its own vector
    for prev, cur in zip(ids, ids[1:]):
        assert np.allclose(ctx[cur], context_vector(own[cur], own[prev]), atol=1e-5)
    # a later remember() chains onto the session's last turn (no second embedding: stored vectors only)
    late = mem.remember("Count me in!", user_id="u", session_id="s1", kind="turn").id
    assert np.allclose(_ctx(mem, [late])[late], context_vector(_own(mem, [late])[late], own[ids[-1]]), atol=1e-5)
    assert mem._store.vectors.user_ids("other-user", space=CONTEXT_SPACE) == []


def test_forget_rebuilds_the_successor_without_the_forgotten_words(mem: AgentMemory) -> None:
    ids = _talk(mem)
    own = _own(mem, ids)
    assert mem.forget(ids[1]) == 1
    ctx = _ctx(mem, ids)
    assert ids[1] not in ctx and ids[1] not in mem._store.vectors.user_ids("u", space=CONTEXT_SPACE)
    # the turn after the forgotten one now sits after ids[0]: no share of the forgotten vector is left in it
    assert np.allclose(ctx[ids[2]], context_vector(own[ids[2]], own[ids[0]]), atol=1e-5)
    assert np.allclose(ctx[ids[3]], context_vector(own[ids[3]], own[ids[2]]), atol=1e-5)
    assert mem.forget(ids[0]) == 1
    assert np.allclose(_ctx(mem, [ids[2]])[ids[2]], own[ids[2]], atol=1e-5)
    assert mem.forget(user_id="u") == 2
    assert mem._store.vectors.user_ids("u", space=CONTEXT_SPACE) == [] and mem._store.vectors.count() == 0


def test_expiry_and_update_keep_context_vectors_current(mem: AgentMemory) -> None:
    first = mem.remember("We went to the lake.", user_id="u", session_id="s", kind="turn", ttl=0.05).id
    second = mem.remember("It was cold!", user_id="u", session_id="s", kind="turn").id
    time.sleep(0.1)
    assert mem.sweep() == 1
    own = _own(mem, [second])[second]
    assert first not in _ctx(mem, [first]) and np.allclose(_ctx(mem, [second])[second], own, atol=1e-5)
    third = mem.remember("Freezing, really.", user_id="u", session_id="s", kind="turn").id
    mem.update(second, text="It was warm and sunny!")
    new = _own(mem, [second, third])
    assert not np.allclose(new[second], own, atol=1e-3)
    assert np.allclose(_ctx(mem, [second])[second], new[second], atol=1e-5)
    assert np.allclose(_ctx(mem, [third])[third], context_vector(new[third], new[second]), atol=1e-5)


def test_erased_turns_context_leaves_no_bytes_on_disk(tmp_path: Path) -> None:
    # past Chroma's HNSW flush size (1,000), so vectors are in its files; which ones were persisted by the time we
    # look depends on Chroma's flush order, so the test erases a turn whose successor's context vector is on disk
    root = tmp_path / "s"
    with AgentMemory(root, kv_encoding="off", consolidation="off") as mem:
        ids = [r.id for r in mem.remember_many([dict(text=f"turn {i} about the lake and kayaks", user_id="u",
                                                     session_id=f"s{i // 10}") for i in range(1_100)],
                                                consolidate=False)]
        # (forgotten turn, its successor) pairs inside one session: the successor's context carries its words
        pairs = [(ids[i], ids[i + 1]) for i in range(1, 200) if i % 10 not in (0, 9)]
        ctx = _ctx(mem, [nxt for _, nxt in pairs])
        windows = {nxt: _windows(ctx[nxt]) for _, nxt in pairs}
        on_disk = {m for found in scan_tree_for_markers(root, [w for ws in windows.values() for w in ws]).values()
                   for m in found}
        reached = [(gone, nxt) for gone, nxt in pairs if on_disk & set(windows[nxt])]
        assert reached, "no context vector reached Chroma's files: the test would prove nothing"
        gone, nxt = reached[0]
        prev = ids[ids.index(gone) - 1]
        assert mem.forget(gone) == 1
        assert scan_tree_for_markers(root, windows[nxt]) == {}
        own = _own(mem, [prev, nxt])
        assert np.allclose(_ctx(mem, [nxt])[nxt], context_vector(own[nxt], own[prev]), atol=1e-5)


def _windows(vec: np.ndarray) -> list[bytes]:
    """32-byte slices of a vector's float32 bytes: one of them lies inside a file page wherever the vector is cut."""
    raw = np.asarray(vec, dtype=np.float32).tobytes()
    return [raw[i:i + 32] for i in range(0, len(raw) - 32, 128)]


def test_a_store_written_before_context_vectors_recalls_and_is_back_filled(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with AgentMemory(root, kv_encoding="off", consolidation="off") as mem:
        mem._store.contexts.enabled = False  # what an older version wrote: turn vectors only
        ids = _talk(mem)
        assert mem._store.vectors.user_ids("u", space=CONTEXT_SPACE) == []
    with AgentMemory(root, kv_encoding="off", consolidation="off") as mem:
        store = mem._store
        hits = mem.recall("the lake by the mountains", user_id="u", k=4)
        assert len(hits) == 4  # the context search finds nothing: the ranking is the old one
        cands, _ = store.candidates("the lake by the mountains", _scope("u"), pool=10)
        assert cands.turn_context == {}
        late = mem.remember("Count me in!", user_id="u", session_id="s1", kind="turn").id  # first write: back-fill
        own = _own(mem, ids + [late])
        ctx = _ctx(mem, ids + [late])
        assert sorted(ctx) == sorted(ids + [late])
        assert np.allclose(ctx[ids[1]], context_vector(own[ids[1]], own[ids[0]]), atol=1e-5)
        assert np.allclose(ctx[late], context_vector(own[late], own[ids[-1]]), atol=1e-5)


def _scope(user: str):
    from agentmem.entries.store import Scope

    return Scope(user)


def test_recall_fuses_the_context_search(mem: AgentMemory) -> None:
    ids = _talk(mem)
    cands, _ = mem._store.candidates("Did they swim in the lake?", _scope("u"), pool=10)
    assert set(cands.turn_context) == set(ids) and set(cands.places) >= set(ids)
    with_ctx = rank_scores(cands)
    without = rank_scores(cands, RetrievalParams(context_vector_weight=0.0))
    best = max(cands.turn_context, key=cands.turn_context.get)
    assert with_ctx[best] > without[best]
    hits = mem.recall("Did they swim in the lake?", user_id="u", k=4)
    assert {h.id for h in hits} == set(ids)
    assert all(h.scores["context"] == pytest.approx(cands.turn_context[h.id], abs=1e-5) for h in hits)


def test_rank_scores_adds_the_scaled_context_cosine() -> None:
    cands = Candidates({"a": 0.5, "b": 0.4}, {}, turn_context={"a": 0.2, "b": 0.6, "c": 0.4})
    scores = rank_scores(cands, RetrievalParams(context_vector_weight=0.2, session_weight=0.0, spillover=0.0))
    assert scores == pytest.approx({"a": 0.35, "b": 0.2, "c": 0.1})
