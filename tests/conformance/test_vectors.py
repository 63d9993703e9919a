"""One conformance suite for every VectorIndex: embedded Chroma, pgvector (real PostgreSQL), Chroma server (HTTP),
in-process (``vector_url="memory"``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agentmem.errors import InvalidInputError
from agentmem.ports import VectorIndex
from agentmem.ports.vectors import CONTEXT_SPACE

BACKENDS = ["chroma", "pgvector", "chroma-http", "memory"]
DIM = 16


def make_index(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> VectorIndex:
    if kind == "chroma":
        from agentmem.backends.chroma.index import ChromaVectorIndex as Embedded

        return Embedded(tmp_path / "chroma")
    if kind == "pgvector":
        from agentmem.backends.pgvector import PgVectorIndex
        from agentmem.backends.postgres import PostgresCatalog

        return PgVectorIndex(PostgresCatalog(request.getfixturevalue("fresh_postgres_url")).engine)
    if kind == "memory":
        from agentmem.backends.in_memory import MemoryVectorIndex

        return MemoryVectorIndex()
    from agentmem.backends.chroma_http import ChromaHttpIndex

    return ChromaHttpIndex(request.getfixturevalue("fresh_chroma_http_url"))


@pytest.fixture(params=BACKENDS)
def index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[VectorIndex]:
    ix = make_index(request.param, request, tmp_path)
    yield ix
    ix.close()


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _fill(index: VectorIndex, n: int = 30) -> np.ndarray:
    vecs = _unit(np.random.default_rng(0), n)
    index.add(["u"] * n, [f"e{i}" for i in range(n)], vecs,
              [{"kind": "turn" if i % 2 else "fact", "session_id": f"s{i % 3}"} for i in range(n)])
    return vecs


def test_is_a_vector_index_and_empty_at_first(index: VectorIndex) -> None:
    assert isinstance(index, VectorIndex)
    assert index.query(np.ones(DIM, np.float32), user_id="u", n=3) == [] and index.count() == 0


def test_query_returns_exact_neighbours_best_first_with_cosine(index: VectorIndex) -> None:
    vecs = _fill(index)
    hits = index.query(vecs[7], user_id="u", n=5)
    assert hits[0][0] == "e7" and hits[0][1] == pytest.approx(1.0, abs=1e-4)
    sims = [s for _, s in hits]
    assert sims == sorted(sims, reverse=True)
    exact = np.argsort(-(vecs @ vecs[7]))[:5]
    assert [i for i, _ in hits] == [f"e{i}" for i in exact]
    assert sims == pytest.approx([float(vecs[i] @ vecs[7]) for i in exact], abs=1e-4)


def test_users_never_see_each_others_vectors(index: VectorIndex) -> None:
    vecs = _fill(index)
    index.add(["v"], ["other"], vecs[:1], [{"kind": "turn"}])
    assert "other" not in {i for i, _ in index.query(vecs[0], user_id="u", n=50)}
    assert [i for i, _ in index.query(vecs[0], user_id="v", n=50)] == ["other"]
    assert index.query(vecs[0], user_id="nobody", n=5) == []
    assert sorted(index.user_ids("v")) == ["other"] and len(index.user_ids("u")) == 30


def test_where_and_ids_restrict_the_search(index: VectorIndex) -> None:
    vecs = _fill(index)
    turns = index.query(vecs[0], user_id="u", n=50, where={"kind": "turn"})
    assert len(turns) == 15 and all(int(i[1:]) % 2 for i, _ in turns)
    both = index.query(vecs[0], user_id="u", n=50,
                       where={"$and": [{"kind": {"$in": ["turn"]}}, {"session_id": "s1"}]})
    assert {i for i, _ in both} == {f"e{i}" for i in range(30) if i % 2 and i % 3 == 1}
    assert {i for i, _ in index.query(vecs[0], user_id="u", n=50, ids=["e3", "e4", "zz"])} == {"e3", "e4"}


def test_upsert_replaces_and_delete_removes(index: VectorIndex) -> None:
    vecs = _fill(index)
    index.add(["u"], ["e0"], vecs[9:10], [{"kind": "fact"}])
    top = index.query(vecs[9], user_id="u", n=2)
    assert {i for i, _ in top} == {"e0", "e9"}
    index.delete(["e9", "missing"], user_id="u")
    index.delete(["e8"])  # user None: recovery's form
    assert index.count() == 28 and "e9" not in set(index.all_ids()) and "e8" not in set(index.all_ids())
    assert index.query(vecs[9], user_id="u", n=1)[0][0] == "e0"


def test_erase_residue_keeps_live_vectors_and_other_users(index: VectorIndex) -> None:
    vecs = _fill(index)
    index.add(["v"], ["other"], vecs[:1], [{"kind": "turn"}])
    index.delete([f"e{i}" for i in range(1, 30)], user_id="u")
    index.erase_residue(["u"])
    assert [i for i, _ in index.query(vecs[0], user_id="u", n=5)] == ["e0"]
    index.delete(["e0"], user_id="u")
    index.erase_residue(["u"])
    assert index.query(vecs[0], user_id="u", n=5) == [] and index.user_ids("u") == []
    assert [i for i, _ in index.query(vecs[0], user_id="v", n=5)] == ["other"]


def test_a_small_user_among_many_rows_gets_its_exact_neighbours(index: VectorIndex) -> None:
    # An HNSW scan over the whole table finds ef_search candidates, then filters by user: a user holding 20 of
    # 3,020 rows would get back fewer than asked (often none) unless the index re-ranks that user exactly.
    rng = np.random.default_rng(1)
    big, small = _unit(rng, 3000), _unit(rng, 20)
    index.add(["big"] * 3000, [f"b{i}" for i in range(3000)], big, [{"kind": "turn"}] * 3000)
    index.add(["small"] * 20, [f"s{i}" for i in range(20)], small, [{"kind": "turn"}] * 20)
    query = small[3] + 0.5 * big[0]
    expected = [f"s{i}" for i in np.argsort(-(small @ query))[:10]]
    assert [i for i, _ in index.query(query, user_id="small", n=10)] == expected


def test_context_space_is_a_separate_namespace_erased_with_the_entry(index: VectorIndex) -> None:
    # turn context vectors live beside the entries' own vectors, under the same ids (agentmem.entries.context_vectors)
    vecs = _fill(index)
    ctx = _unit(np.random.default_rng(2), 5)
    index.add(["u"] * 5, [f"e{i}" for i in range(5)], ctx, [{"kind": "turn", "session_id": "s0"}] * 5,
              space=CONTEXT_SPACE)
    index.add(["v"], ["other"], ctx[:1], [{"kind": "turn"}], space=CONTEXT_SPACE)
    hits = index.query(ctx[3], user_id="u", n=10, space=CONTEXT_SPACE)
    assert [i for i, _ in hits] == [f"e{i}" for i in np.argsort(-(ctx @ ctx[3]))]  # only the context space
    assert hits[0][1] == pytest.approx(1.0, abs=1e-4)
    own = index.query(vecs[3], user_id="u", n=1)  # the entries' own space is unchanged
    assert own[0][0] == "e3" and own[0][1] == pytest.approx(1.0, abs=1e-4)
    assert sorted(index.user_ids("u", space=CONTEXT_SPACE)) == [f"e{i}" for i in range(5)]
    assert len(index.user_ids("u")) == 30 and index.user_ids("v", space=CONTEXT_SPACE) == ["other"]
    got = index.get("u", ["e2", "e29", "missing"], space=CONTEXT_SPACE)
    assert sorted(got) == ["e2"] and np.allclose(got["e2"], ctx[2], atol=1e-5)
    assert np.allclose(index.get("u", ["e2"])["e2"], vecs[2], atol=1e-5)
    assert index.count() == 36
    assert {i for i, _ in index.query(ctx[0], user_id="u", n=10, where={"session_id": "s0"},
                                      ids=["e1", "e2", "e9"], space=CONTEXT_SPACE)} == {"e1", "e2"}
    index.delete(["e1"], user_id="u")  # an entry's vectors go from every space
    assert "e1" not in index.user_ids("u", space=CONTEXT_SPACE) and "e1" not in index.user_ids("u")
    index.delete([f"e{i}" for i in range(30)], user_id="u")
    index.erase_residue(["u"])
    assert index.query(ctx[0], user_id="u", n=5, space=CONTEXT_SPACE) == [] and index.user_ids("u") == []
    assert [i for i, _ in index.query(ctx[0], user_id="v", n=5, space=CONTEXT_SPACE)] == ["other"]


def test_query_spaces_finds_per_space_what_query_finds_in_that_space(index: VectorIndex) -> None:
    vecs = _fill(index)
    ctx = _unit(np.random.default_rng(2), 12)
    index.add(["u"] * 12, [f"e{i}" for i in range(12)], ctx,
              [{"kind": "turn" if i % 2 else "fact", "session_id": f"s{i % 3}"} for i in range(12)], space=CONTEXT_SPACE)
    index.add(["v"], ["other"], vecs[:1], [{"kind": "turn"}])  # v holds nothing in the context space
    spaces = ("", CONTEXT_SPACE)
    for user, kwargs in [("u", {}), ("u", {"where": {"kind": "turn"}}), ("u", {"ids": ["e1", "e2", "e20", "zz"]}),
                         ("u", {"where": {"session_id": "s1"}, "ids": ["e1", "e4", "e5", "e7"]}), ("v", {})]:
        for n in (3, 50):
            both = index.query_spaces(vecs[4], user_id=user, n=n, spaces=spaces, **kwargs)
            apart = [index.query(vecs[4], user_id=user, n=n, space=s, **kwargs) for s in spaces]
            assert [[i for i, _ in hits] for hits in both] == [[i for i, _ in hits] for hits in apart], (user, kwargs, n)
            assert [s for hits in both for _, s in hits] == pytest.approx([s for hits in apart for _, s in hits], abs=1e-6)
            assert both[0]  # every case finds something in the entries' own space
    for n in ((5, 2), (2, 5)):  # one count per space
        both = index.query_spaces(vecs[4], user_id="u", n=n, spaces=spaces)
        assert [[i for i, _ in h] for h in both] == [[i for i, _ in index.query(vecs[4], user_id="u", n=c, space=s)]
                                                     for s, c in zip(spaces, n)] and [len(h) for h in both] == list(n)
    with pytest.raises(ValueError):
        index.query_spaces(vecs[4], user_id="u", n=(5,), spaces=spaces)
    assert index.query_spaces(vecs[4], user_id="v", n=5, spaces=spaces)[1] == []
    assert index.query_spaces(vecs[4], user_id="nobody", n=5, spaces=spaces) == [[], []]
    assert [[i for i, _ in h] for h in index.query_spaces(ctx[0], user_id="u", n=2, spaces=(CONTEXT_SPACE, ""))] \
        == [[i for i, _ in index.query(ctx[0], user_id="u", n=2, space=s)] for s in (CONTEXT_SPACE, "")]  # in order


def test_has_any_tells_whether_a_user_holds_a_vector_in_a_space(index: VectorIndex) -> None:
    # the cheap existence check a write makes before back-filling context vectors (O(1), not the id list)
    assert not index.has_any("u") and not index.has_any("u", space=CONTEXT_SPACE)
    vecs = _fill(index)
    assert index.has_any("u") and not index.has_any("u", space=CONTEXT_SPACE)
    index.add(["v"], ["other"], vecs[:1], [{"kind": "turn"}], space=CONTEXT_SPACE)
    assert index.has_any("v", space=CONTEXT_SPACE) and not index.has_any("v")  # spaces and users are apart
    assert not index.has_any("u", space=CONTEXT_SPACE) and not index.has_any("nobody")
    index.delete([f"e{i}" for i in range(30)], user_id="u")
    index.erase_residue(["u"])
    assert not index.has_any("u") and index.has_any("v", space=CONTEXT_SPACE)


def test_an_unknown_space_is_refused(index: VectorIndex) -> None:
    with pytest.raises(InvalidInputError, match="space"):
        index.add(["u"], ["e0"], _unit(np.random.default_rng(0), 1), [{"kind": "turn"}], space="x; DROP TABLE")
