"""Verified erasure: after ``forget``, scan every file of the store for what was erased, not only its text.

    python benchmarks/erasure.py [--entries 1100] [--bystander 200]

User A gets ``--entries`` memories (enough to push Chroma past its HNSW flush threshold, so vectors reach
``data_level0.bin``), each with a unique text marker, KV encoded by a tiny model so blobs hit the disk, spread over
7 sessions; user B (the bystander) gets ``--bystander``. What is planted and then searched for, byte by byte, in
every file under the store (SQLite WAL, Chroma segments, blob files, hidden files):

* text markers, entry ids and session ids of A's erased entries (the audit log names the erased scope by design:
  a ``forget(session_id=...)`` line holds that session id; it is left out of the session-id scan);
* the exact float32 bytes of each erased entry's stored vector (a 32-byte prefix: 8 floats).

Two erasures are measured in one run: ``forget(session_id=...)`` of one of A's sessions (A's collection still has
live vectors: it is rebuilt) and then ``forget(user_id="A")`` (the collection is dropped); the ratio compares their
cost. B must be untouched: every entry listed and recalled as before.

Last line: {"erased": N, "text_residue": 0, "vector_residue": 0, "id_residue": 0, "session_id_residue": 0,
            "bystander_untouched": 1, "forget_session_s": ..., "forget_user_s": ..., "session_over_user": ...}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ.pop("AGENTMEM_ENCRYPTION_KEY", None)


def vector_prefixes(mem, user: str, ids: list[str]) -> list[bytes]:
    """The first 32 bytes (8 float32s) of each entry's vector as the index stores it (``mem.stored_vectors``)."""
    import numpy as np

    out: list[bytes] = []
    for i in range(0, len(ids), 500):
        got = mem.stored_vectors(ids[i : i + 500], user_id=user)
        out += [np.asarray(v, dtype=np.float32)[:8].tobytes() for v in got.values()]
    return out


def count_residue(root: Path, markers: list[bytes], *, skip: tuple[str, ...] = ()) -> tuple[int, dict[str, int]]:
    from agentmem.security import scan_tree_for_markers

    found = {str(p.relative_to(root)): len(v) for p, v in scan_tree_for_markers(root, markers).items()
             if p.name not in skip}
    return sum(found.values()), found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=1100)
    ap.add_argument("--bystander", type=int, default=200)
    ap.add_argument("--store", type=Path, default=None)
    args = ap.parse_args()

    from agentmem import AgentMemory
    from agentmem.kv.testing import tiny_causal_lm

    root = args.store or Path(tempfile.mkdtemp(prefix="agentmem-erasure-")) / "store"
    t_start = time.perf_counter()
    with AgentMemory(root, model=tiny_causal_lm("llama", seed=0), kv_encoding="eager") as mem:
        markers = [f"zq{uuid.uuid4().hex[:14]}" for _ in range(args.entries)]
        sessions = [f"sess{uuid.uuid4().hex[:10]}" for _ in range(7)]
        a = mem.remember_many([{"text": f"note {i} about the orchard, code {m}", "user_id": "A",
                                "session_id": sessions[i % 7]} for i, m in enumerate(markers)])
        b = mem.remember_many([{"text": f"B's note {i} on sailing", "user_id": "B", "session_id": "b-session"}
                               for i in range(args.bystander)])
        b_before = [(r.id, r.text) for r in mem.list(user_id="B")]
        b_recall = [h.id for h in mem.recall("sailing note 7", user_id="B", k=5)]
        vectors = vector_prefixes(mem, "A", [r.id for r in a])
        planted_hnsw, where = count_residue(root, vectors)
        print(f"planted: {len(a)} entries of A; vector bytes found before erasure in {sorted(where)}", flush=True)

        t = time.perf_counter()
        n_session = mem.forget(session_id=sessions[0])
        forget_session_s = time.perf_counter() - t
        t = time.perf_counter()
        n_user = mem.forget(user_id="A")
        forget_user_s = time.perf_counter() - t

        text_n, text_at = count_residue(root, [m.encode() for m in markers])
        vec_n, vec_at = count_residue(root, vectors)
        id_n, id_at = count_residue(root, [r.id.encode() for r in a])
        sess_n, sess_at = count_residue(root, [s.encode() for s in sessions], skip=("audit.jsonl",))
        for name, at in (("text", text_at), ("vector", vec_at), ("id", id_at), ("session id", sess_at)):
            if at:
                print(f"{name} residue: {at}", flush=True)
        untouched = (b_before == [(r.id, r.text) for r in mem.list(user_id="B")]
                     and b_recall == [h.id for h in mem.recall("sailing note 7", user_id="B", k=5)]
                     and len(b) == args.bystander)
        report = mem.verify()
    print(json.dumps({
        "erased": n_session + n_user, "planted_vectors_on_disk_before": planted_hnsw,
        "text_residue": text_n, "vector_residue": vec_n, "id_residue": id_n, "session_id_residue": sess_n,
        "bystander_untouched": int(untouched), "rows_after": report["rows"], "vectors_after": report["vectors"],
        "forget_session_s": round(forget_session_s, 3), "forget_user_s": round(forget_user_s, 3),
        "session_over_user": round(forget_session_s / max(forget_user_s, 1e-9), 2),
        "seconds": round(time.perf_counter() - t_start, 1),
    }))


if __name__ == "__main__":
    main()
