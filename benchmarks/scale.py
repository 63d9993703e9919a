"""Ingest rate and recall latency (embedding included) for one user holding many entries, on one backend.

    python benchmarks/scale.py --backend embedded|postgres|chroma-server --entries 100000 [--users 1] [--queries 200]

Texts are synthetic diary lines over a fixed vocabulary (seeded). Embedding 100,000 texts with MiniLM on this
machine's two shared cores would take longer than the store writes, so the bulk is written with vectors derived
from 2,000 real embeddings (each plus small Gaussian noise, re-normalised: distinct, realistically clustered
points) through the store's own write path (validation, catalog + lexical index, vector index, all-or-nothing);
the embedder's own rate is measured on those 2,000 texts. ``ingest_per_s`` combines both
(1 / (1/write_rate + 1/embed_rate)): what ``remember_many`` would sustain. Recall goes through the public
``recall`` (query embedding, dense + lexical, fusion, row loads) for random questions.

Last line: {"backend", "entries", "ingest_per_s", "p50_ms", "p95_ms", "users", "write_per_s", "embed_per_s"}
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WORDS = ("heron kayak lighthouse bakery violin garden tram harbour lantern orchard cello meadow bridge ferry "
         "pottery canyon glacier market bicycle library festival river mountain kitchen sister brother doctor "
         "teacher museum concert recipe birthday holiday airport station coffee winter summer autumn spring").split()
VERBS = "visited painted repaired cooked found lost bought sold drew planted crossed photographed".split()


def _line(rng: random.Random, i: int) -> str:
    a, b, c = rng.sample(WORDS, 3)
    return f"On day {i % 365} I {rng.choice(VERBS)} the {a} near the {b} with my {c}."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["embedded", "postgres", "chroma-server"], default="embedded")
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=1)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1000)
    args = ap.parse_args()
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    from agentmem import AgentMemory

    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="agentmem-scale-") as tmp:
        base = Path(tmp)
        os.chmod(base, 0o755)  # a PostgreSQL server user must reach its data dir
        server, urls = None, {}
        if args.backend == "postgres":
            from tests.servers import start_postgres

            server = start_postgres(base / "pg")
            urls = {"catalog_url": server.url, "vector_url": "pgvector"}
        elif args.backend == "chroma-server":
            from tests.servers import start_chroma

            server = start_chroma(base / "chroma")
            urls = {"vector_url": server.url}
        try:
            with AgentMemory(base / "store", kv_encoding="off", **urls) as mem:
                store = mem._store
                sample = [_line(rng, i) for i in range(2000)]
                t0 = time.perf_counter()
                seeds = store.embedder.encode(sample, batch_size=64)
                embed_per_s = len(sample) / (time.perf_counter() - t0)
                noise = np.random.default_rng(0)
                written, write_s = 0, 0.0
                while written < args.entries:
                    n = min(args.batch, args.entries - written)
                    idx = noise.integers(0, len(sample), n)
                    vecs = seeds[idx] + noise.normal(0, 0.02, (n, seeds.shape[1])).astype(np.float32)
                    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
                    entries = [mem._new_entry(f"{sample[j]} (note {written + k})",
                                              user_id=f"user{(written + k) % args.users}", session_id=None,
                                              kind="turn", role=None, speaker=None, timestamp=None, tags=None,
                                              ttl=None, metadata=None) for k, j in enumerate(idx)]
                    t0 = time.perf_counter()
                    store.add(entries, vectors=vecs.astype(np.float32))
                    write_s += time.perf_counter() - t0
                    written += n
                    print(f"  {written} entries, {written / write_s:.0f}/s", file=sys.stderr, flush=True)
                write_per_s = written / write_s
                lat = []
                for q in range(args.queries + 10):
                    a, b = rng.sample(WORDS, 2)
                    user = f"user{rng.randrange(args.users)}"
                    t0 = time.perf_counter()
                    hits = mem.recall(f"when did I see the {a} with my {b}?", user_id=user, k=5)
                    if q >= 10:  # the first few warm caches up
                        lat.append(1000 * (time.perf_counter() - t0))
                    assert hits, "recall returned nothing"
        finally:
            if server is not None:
                server.stop()
    lat.sort()
    ingest = 1 / (1 / write_per_s + 1 / embed_per_s)
    print(json.dumps({"backend": args.backend, "entries": args.entries, "ingest_per_s": round(ingest, 1),
                      "p50_ms": round(statistics.median(lat), 1), "p95_ms": round(lat[int(0.95 * len(lat)) - 1], 1),
                      "users": args.users, "write_per_s": round(write_per_s, 1), "embed_per_s": round(embed_per_s, 1)}))


if __name__ == "__main__":
    main()
