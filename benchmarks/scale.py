"""Ingest rate and recall latency (embedding included) for one user holding many entries, on one backend.

    python benchmarks/scale.py --backend embedded|postgres|chroma-server --entries 100000 [--users 1] [--queries 200]

Texts are synthetic diary lines over a fixed vocabulary (seeded). Embedding 100,000 texts with MiniLM on this
machine's two shared cores would take longer than the store writes, so the bulk is written with vectors derived
from 2,000 real embeddings (each plus small Gaussian noise, re-normalised: distinct, realistically clustered
points) through the store's own write path (validation, catalog + lexical index, vector index, all-or-nothing);
the embedder's own rate is measured on those 2,000 texts. ``ingest_per_s`` combines both
(1 / (1/write_rate + 1/embed_rate)): what ``remember_many`` would sustain. Recall goes through the public
``recall`` (query embedding, dense + lexical, fusion, row loads) for random questions.

Last line: {"backend", "entries", "ingest_per_s", "p50_ms", "p95_ms", "users", "write_per_s", "embed_per_s",
"parts_p50_ms"} (the last: median ms of the query embedding, lexical search, dense search and turn context, each
called alone after the timed recalls; ``lexical_exhaustive`` is the same lexical search scoring every match, as
before early termination, timed beside it with equal scores checked, and ``lexical_speedup`` their ratio).
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
    store = mem._store
    sample = [_line(rng, i) for i in range(2000)]
    t0 = time.perf_counter()
    seeds = store.embedder.encode(sample, batch_size=64)
    embed_per_s = len(sample) / (time.perf_counter() - t0)
    noise = np.random.default_rng(0)
    written, write_s = store.vectors.count(), 1e-9  # a kept store (--store) is topped up, not redone
    start = written
    while written < args.entries:
        n = min(args.batch, args.entries - written)
        idx = noise.integers(0, len(sample), n)
        vecs = seeds[idx] + noise.normal(0, 0.02, (n, seeds.shape[1])).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        entries = [mem._new_entry(f"{sample[j]} (note {written + k})", user_id=f"user{(written + k) % args.users}",
                                  session_id=None, kind="turn", role=None, speaker=None, timestamp=None, tags=None,
                                  ttl=None, metadata=None) for k, j in enumerate(idx)]
        # as remember() with consolidation does: each row carries its text's unit vector (recall's conflict check)
        mem._consolidator.attach_vectors([e.row for e in entries], vecs)
        t0 = time.perf_counter()
        store.add(entries, vectors=vecs.astype(np.float32))
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


def breakdown(mem: Any, args: argparse.Namespace, rng: random.Random, n: int = 50) -> dict[str, float]:
    """Median milliseconds of each retrieval part, called one by one (recall runs lexical beside the embedding)."""
    store, parts = mem._store, {"embed": [], "lexical": [], "dense": [], "context": [], "lexical_exhaustive": []}
    for _ in range(n):
        a, b = rng.sample(WORDS, 2)
        query, user = f"when did I see the {a} with my {b}?", f"user{rng.randrange(args.users)}"
        t0 = time.perf_counter()
        vec = store.embed_query(query)  # recall's own query path (int8 feed-forward MiniLM)
        t1 = time.perf_counter()
        lexical = store.catalog.lexical_search(query, user_id=user, limit=store.config.candidate_pool)
        t2 = time.perf_counter()
        dense = store.vectors.query(vec, user_id=user, n=store.config.candidate_pool)
        t3 = time.perf_counter()
        store.catalog.turn_context([i for i, _ in dense] + [i for i, _ in lexical])
        t4 = time.perf_counter()
        # side by side: the same lexical search scoring every match (no early termination, lexical_bounds)
        saved, store.catalog.prune_min_docs = store.catalog.prune_min_docs, 10**12
        try:
            full = store.catalog.lexical_search(query, user_id=user, limit=store.config.candidate_pool)
            assert _rounded(full) == _rounded(lexical), "early-terminated lexical scores differ from exhaustive"
        finally:
            store.catalog.prune_min_docs = saved
        t5 = time.perf_counter()
        for name, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            parts[name].append(1000 * dt)
    out = {name: round(statistics.median(v), 1) for name, v in parts.items()}
    out["lexical_speedup"] = round(statistics.median(parts["lexical_exhaustive"]) / max(statistics.median(parts["lexical"]), 1e-9), 2)
    return out


def _rounded(hits: list[tuple[str, float]]) -> list[float]:
    """The scores of ``hits``, rounded so an equality check ignores the last bits (sums taken in another order)."""
    return [round(s, 9) for _, s in hits]


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
            parts = breakdown(mem, args, rng)
    # a kept store that already held --entries wrote nothing this run: no write rate to report (null)
    ingest_rate = None if write_per_s != write_per_s else round(1 / (1 / write_per_s + 1 / embed_per_s), 1)
    print(json.dumps({"backend": args.backend, "entries": args.entries, "ingest_per_s": ingest_rate,
                      "p50_ms": round(statistics.median(lat), 1), "p95_ms": round(lat[int(0.95 * len(lat)) - 1], 1),
                      "users": args.users, "write_per_s": None if ingest_rate is None else round(write_per_s, 1), "embed_per_s": round(embed_per_s, 1),
                      "parts_p50_ms": parts}))


if __name__ == "__main__":
    main()
