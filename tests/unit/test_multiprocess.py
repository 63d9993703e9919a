"""Several processes on one embedded store directory: real subprocesses, real SQLite, Chroma and files.

Covers #12 (a process sees another's writes; no lost or duplicated write) and #13 item 1 (opening a store from a
second process must not erase entries another process is writing).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from agentmem import AgentMemory

ROOT = Path(__file__).resolve().parents[2]
WRITER = ROOT / "benchmarks" / "_writer.py"
_OPENER = """
import sys, time
from pathlib import Path
from agentmem import AgentMemory
stop = Path(sys.argv[2]); n = 0
while not stop.exists():
    with AgentMemory(sys.argv[1], consolidation="off") as mem:
        mem.verify() if n % 25 == 0 else None
    n += 1
print(n)
"""


def _writer(store: Path, report: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WRITER), str(store), str(report), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    assert "errors=0" in out, err[-2000:]
    return out


def test_opening_and_closing_beside_a_writer_erases_nothing(tmp_path: Path) -> None:
    """#13 item 1: A remembers 300 encoded entries while B opens and closes the store over and over."""
    store, report, stop = tmp_path / "store", tmp_path / "a.txt", tmp_path / "stop"
    AgentMemory(store, consolidation="off").close()
    writer = _writer(store, report, "--tiny-model", "--count", "300")
    opener = subprocess.Popen([sys.executable, "-c", _OPENER, str(store), str(stop)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _finish(writer)
    stop.touch()
    out, err = opener.communicate(timeout=300)
    assert opener.returncode == 0, err[-2000:]
    assert int(out.split()[-1]) > 10, "the opener barely ran beside the writer"
    ids = report.read_text().split()
    assert len(ids) == len(set(ids)) == 300
    with AgentMemory(store, consolidation="off") as mem:
        check = mem.verify()
        assert check["rows"] == check["vectors"] == check["blobs"] == 300, check
        assert check["orphan_vectors"] == check["orphan_blobs"] == check["pending"] == 0, check
        assert all(mem.get(i).kv is not None for i in ids)


def test_a_long_lived_process_sees_another_process_writes(tmp_path: Path) -> None:
    """The #12 report: a child remembers 20 entries; the parent, open since before, recalls them all."""
    store = tmp_path / "store"
    with AgentMemory(store, consolidation="off") as mem:
        mem.remember("the parent wrote this first, about a pelican", user_id="u")
        assert len(mem.recall("pelican", user_id="u", k=30)) == 1  # Chroma's index is now loaded here
        _finish(_writer(store, tmp_path / "r.txt", "--count", "20"))
        written = set((tmp_path / "r.txt").read_text().split())
        t0 = time.monotonic()
        hits = {h.id for h in mem.recall("pelican crossed river", user_id="u", k=30)}
        assert written <= hits, f"{len(written - hits)} of 20 entries written by the child are not recalled"
        assert time.monotonic() - t0 < 1.0
        dense = {i for i, _ in mem._store.vectors.query(mem._store.embedder.encode(["pelican"])[0], user_id="u", n=50)}
        assert written <= dense  # by the vector index itself, not only through the lexical index
        assert len(mem.list(user_id="u")) == 21


def test_concurrent_writers_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    """Two processes write one user's memories at once; every vector stays searchable (Chroma's HNSW included)."""
    store = tmp_path / "store"
    AgentMemory(store, consolidation="off").close()
    procs = [_writer(store, tmp_path / f"{n}.txt", "--count", "80", "--recall") for n in range(2)]
    for p in procs:
        _finish(p)
    ids = [i for n in range(2) for i in (tmp_path / f"{n}.txt").read_text().split()]
    assert len(ids) == len(set(ids)) == 160
    with AgentMemory(store, consolidation="off") as mem:
        check = mem.verify()
        assert check["rows"] == check["vectors"] == 160 and check["orphan_vectors"] == 0, check
        found = {i for i, _ in mem._store.vectors.query(np.ones(384, np.float32) / np.sqrt(384), user_id="u", n=1000)}
        assert found == set(ids)  # a stale writer would have persisted an index missing the other's vectors


_OTHER = """
import sys, numpy as np
from pathlib import Path
from agentmem.backends.chroma.index import ChromaVectorIndex
index = ChromaVectorIndex(Path(sys.argv[1]))
rng = np.random.default_rng(int(sys.argv[2]))
for step in sys.argv[3:]:
    op, _, arg = step.partition(":")
    if op == "add":
        ids = arg.split(",")
        index.add(["u"] * len(ids), ids, rng.standard_normal((len(ids), 16)).astype(np.float32), [{"kind": "note"}] * len(ids))
    elif op == "del":
        index.delete(arg.split(","), user_id="u")
    elif op == "erase":
        index.erase_residue(["u"])
index.close()
"""


def _other(path: Path, seed: int, *steps: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _OTHER, str(path), str(seed), *steps], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_reader_sees_other_processes_writes_without_reopening_its_client(tmp_path: Path) -> None:
    """Others' upserts and deletes reach a process whose index is loaded through the journal, exactly scored; a
    write to a collection changed elsewhere re-opens first, so the persisted index loses nothing."""
    from agentmem.backends.chroma.index import ChromaVectorIndex

    path = tmp_path / "chroma"
    index = ChromaVectorIndex(path)
    rng = np.random.default_rng(0)
    mine = [f"a{i}" for i in range(30)]
    index.add(["u"] * 30, mine, rng.standard_normal((30, 16)).astype(np.float32), [{"kind": "note"}] * 30)
    assert len(index.query(np.ones(16, np.float32), user_id="u", n=100)) == 30  # the index is loaded here
    opens = index._handle.reopens
    _other(path, 1, "add:b0,b1,b2", "del:a0,a1")
    vecs = index.get("u", ["b0", "b1", "a0", "a2"])
    assert set(vecs) == {"b0", "b1", "a2"}
    found = dict(index.query(vecs["b0"], user_id="u", n=100))
    assert set(found) == set(mine[2:]) | {"b0", "b1", "b2"}
    assert abs(found["b0"] - 1.0) < 1e-5 and max(found, key=found.get) == "b0"
    assert [i for i, _ in index.query(vecs["b1"], user_id="u", n=3, where={"kind": "note"})][0] == "b1"
    assert index.query(vecs["b1"], user_id="u", n=5, where={"kind": "other"}) == []
    assert {i for i, _ in index.query(vecs["b1"], user_id="u", n=5, ids=["b1", "a5", "a0"])} == {"b1", "a5"}
    assert index._handle.reopens == opens  # all of that without re-opening the client
    index.add(["u"], ["a30"], rng.standard_normal((1, 16)).astype(np.float32), [{"kind": "note"}])
    assert index._handle.reopens == opens + 1  # its index of "u" was stale: re-opened before writing
    _other(path, 2, "del:b2", "erase")  # an erasure rebuilds the collection under a new id
    after = {i for i, _ in index.query(np.ones(16, np.float32), user_id="u", n=100)}
    assert after == set(mine[2:]) | {"b0", "b1", "a30"}
    index.close()
    fresh = ChromaVectorIndex(path)  # a new process's view: the persisted index holds every write
    assert {i for i, _ in fresh.query(np.ones(16, np.float32), user_id="u", n=100)} == after
    fresh.close()
