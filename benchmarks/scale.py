"""Ingest rate and recall latency (embedding included) for one user holding many entries, on one backend.

    python benchmarks/scale.py --backend embedded|postgres|chroma-server --entries 100000 [--users 1] [--queries 200]

Texts are synthetic diary lines over a fixed vocabulary (seeded). Embedding 100,000 texts with MiniLM on this
machine's two shared cores would take longer than the store writes, so the bulk is written with vectors derived
from 2,000 real embeddings (each plus small Gaussian noise, re-normalised: distinct, realistically clustered
points) through the public ``remember_many(consolidate=False, vectors=...)`` (validation, catalog + lexical
index, vector index, all-or-nothing; each entry also keeps its vector as its text vector, as remember() does); the
embedder's own rate is measured on those 2,000 texts. ``ingest_per_s`` combines both
(1 / (1/write_rate + 1/embed_rate)): what ``remember_many`` would sustain. Recall goes through the public
``recall`` (query embedding, dense + lexical, fusion, row loads) for random questions.

Last line: {"backend", "entries", "ingest_per_s", "p50_ms", "p95_ms", "users", "write_per_s", "embed_per_s"}.
Where a recall's time goes, part by part, is research (it reads private parts): ``research/scale_profile.py`` on
a store kept with ``--store``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from _backends import BACKENDS, backend_urls

WORDS = ("heron kayak lighthouse bakery violin garden tram harbour lantern orchard cello meadow bridge ferry "
         "pottery canyon glacier market bicycle library festival river mountain kitchen sister brother doctor "
         "teacher museum concert recipe birthday holiday airport station coffee winter summer autumn spring").split()
VERBS = "visited painted repaired cooked found lost bought sold drew planted crossed photographed".split()


def _line(rng: random.Random, i: int) -> str:
    a, b, c = rng.sample(WORDS, 3)
    return f"On day {i % 365} I {rng.choice(VERBS)} the {a} near the {b} with my {c}."


def ingest(mem: Any, args: argparse.Namespace, rng: random.Random) -> tuple[float, float]:
    """Top the store up to ``args.entries`` in batches; return (store writes per s, embeddings per s)."""
    sample = [_line(rng, i) for i in range(2000)]
    t0 = time.perf_counter()
    seeds = mem.embed(sample)
    embed_per_s = len(sample) / (time.perf_counter() - t0)
    noise = np.random.default_rng(0)
    # a kept store (--store) is topped up, not redone
    written, write_s = sum(len(mem.list(user_id=f"user{u}")) for u in range(args.users)), 1e-9
    start = written
    while written < args.entries:
        n = min(args.batch, args.entries - written)
        idx = noise.integers(0, len(sample), n)
        vecs = seeds[idx] + noise.normal(0, 0.02, (n, seeds.shape[1])).astype(np.float32)
        items = [{"text": f"{sample[j]} (note {written + k})", "user_id": f"user{(written + k) % args.users}"}
                 for k, j in enumerate(idx)]
        t0 = time.perf_counter()
        # stored as given, as remember_many(consolidate=False) stores them, under these vectors (re-normalised)
        mem.remember_many(items, consolidate=False, vectors=vecs)
        write_s += time.perf_counter() - t0
        written += n
        print(f"  {written} entries, {(written - start) / write_s:.0f}/s", file=sys.stderr, flush=True)
    return ((written - start) / write_s if written > start else float("nan")), embed_per_s


def warm_page_cache(base: Path) -> int:
    """Read every file of a kept store (and its server's data) once, so the OS page cache holds it as it does for
    a store just written or one serving traffic: the first recalls after re-opening a 2 GB PostgreSQL store read
    its HNSW pages from disk (47 ms for a query that takes 1 ms warm). Returns the bytes read.

    Example:
        >>> warm_page_cache(Path("/nonexistent"))
        0
    """
    total = 0
    for path in sorted(base.rglob("*")) if base.exists() else ():
        try:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    total += len(chunk)
        except OSError:  # a directory, a socket, a file the server user alone may read
            continue
    return total


def recall_latency(mem: Any, args: argparse.Namespace, rng: random.Random) -> list[float]:
    """Milliseconds of ``args.queries`` public recalls (after 10 warm-up ones), sorted."""
    lat = []
    for q in range(args.queries + 10):
        a, b = rng.sample(WORDS, 2)
        user = f"user{rng.randrange(args.users)}"
        t0 = time.perf_counter()
        hits = mem.recall(f"when did I see the {a} with my {b}?", user_id=user, k=5)
        if q >= 10:  # the first few warm caches up
            lat.append(1000 * (time.perf_counter() - t0))
        assert hits, "recall returned nothing"
    return sorted(lat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=BACKENDS, default="embedded")
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=1)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--store", type=Path, default=None,
                    help="keep the store (and the server's data) here and reuse it when it already holds --entries")
    args = ap.parse_args()
    from agentmem import AgentMemory

    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="agentmem-scale-") as tmp:
        base = Path(tmp) if args.store is None else args.store
        with backend_urls(args.backend, base, keep=args.store is not None) as urls, \
                AgentMemory(base / "store", kv_encoding="off", **urls) as mem:
            write_per_s, embed_per_s = ingest(mem, args, rng)
            if write_per_s != write_per_s:  # a kept store, re-opened: nothing of it is in the page cache yet
                print(f"  page cache warmed: {warm_page_cache(base) / 2**20:.0f} MiB read", file=sys.stderr)
            lat = recall_latency(mem, args, rng)
    # a kept store that already held --entries wrote nothing this run: no write rate to report (null)
    ingest_rate = None if write_per_s != write_per_s else round(1 / (1 / write_per_s + 1 / embed_per_s), 1)
    print(json.dumps({"backend": args.backend, "entries": args.entries, "ingest_per_s": ingest_rate,
                      "p50_ms": round(statistics.median(lat), 1), "p95_ms": round(lat[int(0.95 * len(lat)) - 1], 1),
                      "users": args.users, "write_per_s": None if ingest_rate is None else round(write_per_s, 1), "embed_per_s": round(embed_per_s, 1)}))


if __name__ == "__main__":
    main()
