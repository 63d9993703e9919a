"""Erasure reaches Chroma's files (issue #13 item 3): after ``forget`` no erased vector (its float32 bytes), entry id
or session id is left anywhere under the store, while other users' vectors stay searchable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agentmem import AgentMemory
from agentmem.security import scan_tree_for_markers
from agentmem.backends.chroma.erase import REBUILD_SUFFIX, recover_rebuilds

N_FLUSH = 1_100  # past Chroma's default HNSW sync threshold (1,000): vectors reach data_level0.bin


def planted(mem: AgentMemory, user_id: str, ids: list[str]) -> list[bytes]:
    """The exact bytes of each entry's stored vector (a 32-byte float32 prefix: unique, and what an attacker reads)."""
    return [np.asarray(v, dtype=np.float32)[:8].tobytes() for v in mem.stored_vectors(ids, user_id=user_id).values()]


def _collection(mem: AgentMemory, user_id: str):
    vectors = mem._store.vectors
    with vectors._handle.lock:
        return vectors._collection(vectors._handle.fresh(), user_id, create=False)


def residue(root: Path, markers: list[bytes]) -> dict[str, int]:
    """{file: how many markers it holds}, naming a Chroma segment directory by its collection."""
    import sqlite3

    names = {}
    db = root / "chroma" / "chroma.sqlite3"
    if db.exists():
        with sqlite3.connect(db) as conn:
            names = dict(conn.execute("SELECT s.id, c.name FROM segments s JOIN collections c ON c.id = s.collection"))
    out = {}
    for p, v in scan_tree_for_markers(root, markers).items():
        rel = str(p.relative_to(root))
        seg = p.parent.name
        out[f"{rel} ({names[seg]})" if seg in names else rel] = len(v)
    return out


@pytest.fixture
def big_store(tmp_path: Path):
    root = tmp_path / "s"
    mem = AgentMemory(root)
    # templated near-identical notes: stored as given (consolidation would merge some; this test is about erasure)
    a = mem.remember_many([{"text": f"note {i} about the orchard", "user_id": "A", "session_id": f"sessA{i % 7}x"}
                           for i in range(N_FLUSH)], consolidate=False)
    b = mem.remember_many([{"text": f"B's note {i} on sailing", "user_id": "B", "session_id": "sessBzz"}
                           for i in range(40)], consolidate=False)
    yield mem, root, a, b
    mem.close()


def test_erasure_leaves_no_vector_or_id_on_disk(big_store) -> None:
    """A session's erasure rebuilds the user's collection; the user's erasure drops it; both leave no residue.
    (One test, because writing 1,100 entries is the slow part.)"""
    mem, root, a, b = big_store
    vec_all = planted(mem, "A", [r.id for r in a])
    before = residue(root, vec_all)
    assert any("data_level0.bin" in p for p in before), before  # the planted vectors did reach the HNSW files

    gone = [r for r in a if r.session_id == "sessA3x"]
    kept = [r for r in a if r.session_id != "sessA3x"]
    vec_gone = planted(mem, "A", [r.id for r in gone])
    assert mem.forget(session_id="sessA3x") == len(gone)
    assert residue(root, vec_gone) == {}
    # the audit line names the erased session (by design: it records what was erased, never content)
    assert residue(root, [r.id.encode() for r in gone] + [b"sessA3x"]) == {"audit.jsonl": 1}
    assert residue(root, planted(mem, "A", [r.id for r in kept[:50]]))  # live vectors are still there
    hits = mem.recall("note 12 about the orchard", user_id="A", k=3)
    assert hits and all(h.session_id != "sessA3x" for h in hits)
    report = mem.verify()
    assert report["rows"] == report["vectors"] == len(kept) + len(b) and report["orphan_vectors"] == 0

    assert mem.forget(user_id="A") == len(kept)
    assert residue(root, vec_all) == {}
    assert residue(root, [r.id.encode() for r in a] + [f"sessA{i}x".encode() for i in range(7) if i != 3]) == {}
    assert _collection(mem, "A") is None  # the user's collection is gone
    assert {h.id for h in mem.recall("sailing", user_id="B", k=40)} == {r.id for r in b}  # the bystander answers
    report = mem.verify()
    assert report["rows"] == report["vectors"] == len(b) and report["orphan_vectors"] == 0
    mem.close()
    with AgentMemory(root) as again:  # and after a reopen
        assert residue(root, vec_all) == {}
        assert len(again.recall("sailing", user_id="B", k=5)) == 5


def test_forget_one_entry_erases_its_vector(tmp_path: Path) -> None:
    with AgentMemory(tmp_path / "s") as mem:
        recs = [mem.remember(f"entry {i} about kites", user_id="u") for i in range(5)]
        marker = planted(mem, "u", [recs[2].id])
        assert mem.forget(recs[2].id) == 1
        assert residue(tmp_path / "s", marker + [recs[2].id.encode()]) == {}
        assert len(mem.recall("kites", user_id="u", k=10)) == 4


def test_an_interrupted_rebuild_is_recovered(tmp_path: Path) -> None:
    """A crash between "old collection dropped" and "copy renamed" leaves the copy under its temporary name."""
    with AgentMemory(tmp_path / "s") as mem:
        rec = mem.remember("the boat is blue", user_id="u")
        vectors = mem._store.vectors
        name = vectors.collection_name("u")
        client = vectors._handle.fresh()
        col = client.get_collection(name, embedding_function=None)
        copy = client.create_collection(name + REBUILD_SUFFIX, embedding_function=None,
                                        configuration={"hnsw": {"space": "cosine"}})
        got = col.get(include=["embeddings", "metadatas"])
        copy.upsert(ids=got["ids"], embeddings=got["embeddings"], metadatas=got["metadatas"])
        client.delete_collection(name)  # the crash: old dropped, copy not renamed yet
    with AgentMemory(tmp_path / "s") as mem:  # opening recovers
        assert mem.recall("boat", user_id="u", k=1)[0].id == rec.id
        assert mem.verify()["orphan_vectors"] == 0 and mem.verify()["rows_missing_vector"] == 0
        client = mem._store.vectors._handle.fresh()
        assert recover_rebuilds(client) == 0
