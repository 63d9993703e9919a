"""Where one recall's time goes on a kept scale store, stage by stage (timers around each store call, cProfile).

    python research/scale_profile.py --backend embedded|postgres --store /work/scale/emb100k [--queries 60]

Opens a store built by ``benchmarks/scale.py --store DIR`` (no writes), reads its files once into the page cache,
runs the benchmark's questions through
the public ``recall`` and wraps each part with a timer: query embedding, lexical search (it runs in a worker
thread beside the embedding, so ``lexical_wait`` is what recall actually waits for it), dense ANN, context-vector
ANN, turn context, catalog row fetches, the conflict check, version following, the whole search, and
fusion (``rank_scores`` + re-ranking). cProfile's top functions by own time (main thread only) go to stderr.

Last line: {"backend", "entries", "recalls", "p50_ms", "p95_ms", "stages_ms_per_recall": {...}, "calls_per_recall": {...}}
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
    entries_mod.rank_scores = _timed("fusion", entries_mod.rank_scores)
    entries_mod.rerank = _timed("rerank", entries_mod.rerank)
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
                      "calls_per_recall": {k: round(v / n, 2) for k, v in sorted(CALLS.items())}}))


if __name__ == "__main__":
    main()
