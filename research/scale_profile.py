"""Where one recall's time goes on a kept scale store, stage by stage (timers around each store call, cProfile).

    python research/scale_profile.py --backend embedded|postgres --store /work/scale/emb100k [--queries 60]

Opens a store built by ``benchmarks/scale.py --store DIR`` (no writes), reads its files once into the page cache,
runs the benchmark's questions through
the public ``recall`` and wraps each part with a timer: query embedding, lexical search (it runs in a worker
thread beside the embedding, so ``lexical_wait`` is what recall actually waits for it), dense ANN, context-vector
ANN, turn context, catalog row fetches, the conflict check, version following, the whole search, and
fusion with the head and re-ranking (``rank_candidates``). cProfile's top functions by own time (main thread only) go to stderr.

Last line: {"backend", "entries", "recalls", "p50_ms", "p95_ms", "stages_ms_per_recall": {...}, "calls_per_recall": {...},
"parts_p50_ms": {...}} (the last, measured before the timers go in and until round 3 part of ``benchmarks/scale.py``'s
line: median ms of the query embedding, lexical search, dense search and turn context, each called alone;
``lexical_exhaustive`` is the same lexical search scoring every match, as before early termination, timed beside it
with equal scores checked, and ``lexical_speedup`` their ratio).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import pstats
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' helpers
from _backends import BACKENDS, backend_urls  # noqa: E402
from scale import WORDS, warm_page_cache  # noqa: E402

TOTAL: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)


def _timed(name: str, fn: Any, *, by_space: bool = False) -> Any:
    """``fn`` wrapped so each call adds its wall time to TOTAL[name] (vector queries split by their space)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        key = f"{name}_{kwargs.get('space') or 'entries'}" if by_space else name
        if by_space and kwargs.get("ids") is not None:
            key += "_by_ids"
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TOTAL[key] += time.perf_counter() - t0
            CALLS[key] += 1
    return wrapper


def instrument(mem: Any) -> None:
    """Wrap the store's parts (instance attributes: nothing outside this process changes)."""
    import agentmem.memory as memory_mod
    import agentmem.entries.store as entries_mod

    store = mem._store
    store.embedder.encode = _timed("embed", store.embedder.encode)
    store.catalog.lexical_search = _timed("lexical", store.catalog.lexical_search)
    store.catalog.turn_context = _timed("turn_context", store.catalog.turn_context)
    store.catalog.get = _timed("row_fetch", store.catalog.get)
    store.vectors.query = _timed("ann", store.vectors.query, by_space=True)
    mem._consolidator.conflicts = _timed("conflict_check", mem._consolidator.conflicts)
    store.search = _timed("search_total", store.search)  # one search, version following inside it
    mem._recaller._search = store.search  # the recall pipeline holds the search it was built with
    # fusion, the head and re-ranking: one call since recall/head.py (rank_scores and rerank are inside it)
    entries_mod.rank_candidates = _timed("fusion_and_rerank", entries_mod.rank_candidates)
    for mod in (memory_mod, entries_mod):  # wherever version following lives in this version of the code
        if hasattr(mod, "follow_versions"):
            mod.follow_versions = _timed("follow_versions", mod.follow_versions)
    submit = store._lexical_worker.submit

    def timed_submit(*args: Any, **kwargs: Any) -> Any:
        future = submit(*args, **kwargs)
        original = future.result
        future.result = _timed("lexical_wait", original)
        return future
    store._lexical_worker.submit = timed_submit


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
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--users", type=int, default=1)
    args = ap.parse_args()
    from agentmem import AgentMemory

    rng = random.Random(0)
    with backend_urls(args.backend, args.store, keep=True) as urls, \
            AgentMemory(args.store / "store", kv_encoding="off", **urls) as mem:
        entries = mem._store.vectors.count()
        warm_page_cache(args.store)  # as scale.py does for a kept store: the OS cache holds it, as when serving
        questions = [(f"when did I see the {a} with my {b}?", f"user{rng.randrange(args.users)}")
                     for a, b in (rng.sample(WORDS, 2) for _ in range(args.queries + 10))]
        for q, u in questions[:10]:  # warm-up, untimed
            mem.recall(q, user_id=u, k=5)
        parts = breakdown(mem, args, rng)  # before the timers go in
        instrument(mem)
        prof, lat = cProfile.Profile(), []
        for q, u in questions[10:]:
            t0 = time.perf_counter()
            prof.enable()
            mem.recall(q, user_id=u, k=5)
            prof.disable()
            lat.append(1000 * (time.perf_counter() - t0))
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print(out.getvalue(), file=sys.stderr)
    n, lat = len(lat), sorted(lat)
    print(json.dumps({"backend": args.backend, "entries": entries, "recalls": n,
                      "p50_ms": round(statistics.median(lat), 1), "p95_ms": round(lat[int(0.95 * n) - 1], 1),
                      "stages_ms_per_recall": {k: round(1000 * v / n, 2) for k, v in sorted(TOTAL.items())},
                      "calls_per_recall": {k: round(v / n, 2) for k, v in sorted(CALLS.items())},
                      "parts_p50_ms": parts}))


if __name__ == "__main__":
    main()
