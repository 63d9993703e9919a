"""``remember_many(vectors=...)`` and ``embed``: a bulk load whose texts were embedded elsewhere is stored under
those vectors, all-or-nothing, with the same checks as any write."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agentmem import AgentMemory, InvalidInputError

# the facade on the SQLite file and on the in-process catalog written against the port alone (tests/conftest.py)
pytestmark = pytest.mark.catalogs(None, "memory")

TEXTS = ["I live in Lyon.", "My dog is called Rex.", "I play the cello on Sundays."]


def _items(texts: list[str] = TEXTS) -> list[dict[str, str]]:
    return [{"text": t, "user_id": "u1"} for t in texts]


def test_given_vectors_are_what_the_index_holds(mem: AgentMemory) -> None:
    # each item is given another item's vector: the index must hold what was given, not the item's own embedding
    given = mem.embed(TEXTS[1:] + TEXTS[:1])
    recs = mem.remember_many(_items(), consolidate=False, vectors=given * 3.0)  # any length: stored unit-length
    stored = mem.stored_vectors([r.id for r in recs], user_id="u1")
    for rec, vec in zip(recs, given):
        assert np.allclose(stored[rec.id], vec, atol=1e-5)
    assert mem.verify()["rows_missing_vector"] == 0


def test_recall_finds_entries_written_with_their_own_vectors(mem: AgentMemory) -> None:
    recs = mem.remember_many(_items(), consolidate=False, vectors=mem.embed(TEXTS))
    assert mem.recall("what is my dog's name?", user_id="u1", k=1)[0].id == recs[1].id


@pytest.mark.parametrize("bad, message", [
    (np.ones((2, 384)), r"shape \(3, 384\)"),
    (np.ones((3, 7)), r"shape \(3, 384\)"),
    (np.zeros((3, 384)), "non-zero"),
    (np.full((3, 384), np.nan), "finite"),
    ("not vectors", "array of numbers"),
])
def test_bad_vectors_are_refused_and_nothing_is_written(mem: AgentMemory, bad: object, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        mem.remember_many(_items(), consolidate=False, vectors=bad)
    assert mem.list(user_id="u1") == []


def test_vectors_skip_consolidation_so_they_ask_for_consolidate_false(mem: AgentMemory) -> None:
    with pytest.raises(InvalidInputError, match="consolidate=False"):
        mem.remember_many(_items(), vectors=mem.embed(TEXTS))
    assert mem.list(user_id="u1") == []


def test_with_consolidation_off_the_store_takes_vectors_as_is(tmp_path: Path) -> None:
    with AgentMemory(tmp_path / "s", consolidation="off") as mem:
        recs = mem.remember_many(_items(), vectors=mem.embed(TEXTS))
        assert [r.event for r in recs] == ["ADD"] * 3


def test_embed_checks_its_texts(mem: AgentMemory) -> None:
    assert mem.embed(TEXTS).shape == (3, 384)
    with pytest.raises(InvalidInputError, match="list of texts"):
        mem.embed("I live in Lyon.")
    with pytest.raises(InvalidInputError, match="empty"):
        mem.embed(["  "])
