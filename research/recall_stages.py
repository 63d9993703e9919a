"""Where one recall's time goes at 10,000 entries: wall and thread CPU time of each pipeline stage.

    python research/recall_stages.py --entries 10000 --no-consolidate --store DIR [--queries 200]

The store and queries are ``benchmarks/recall_latency.py``'s (same flags, same generator; ``--store`` reuses a kept
store). Each stage is timed by wrapping the method that runs it (the methods are the library's own; nothing else
changes), per recall, on the thread it runs on: the lexical search and its placements run on the store's lexical
worker beside the query embedding and the vector searches (``thr`` rows). ``cpu`` is that thread's CPU time
(``time.thread_time``), which other processes' load inflates far less than wall time; the CPU of Chroma's side
search thread and of ONNX Runtime's kernels is counted where the calling thread waits for them only in wall time.
Table in research/notes/recall-latency.md.

Last line: {"stages": {"<stage> [main|thr]": {"wall_p50": ..., "wall_p10": ..., "cpu_p50": ..., ...}}, "load_avg": [...]}
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import recall_latency as bench  # noqa: E402

from agentmem import memory  # noqa: E402
from agentmem.backends.chroma.index import ChromaVectorIndex  # noqa: E402
from agentmem.backends.sqlite.catalog import SqliteCatalog  # noqa: E402
from agentmem.consolidate.store_parts import ConflictDemotion  # noqa: E402
from agentmem.entries import kb_versions, store  # noqa: E402
from agentmem.recall import head  # noqa: E402

# (owner, method, stage): the stages in pipeline order (indented: inside the stage above)
STAGES = [
    (memory.AgentMemory, "recall", "recall (total)"),
    (kb_versions.KbVersions, "recall_state", "store_info read (KB versions, chain stamp)"),
    (store.EntryStore, "candidates", "candidates"),
    (store.EntryStore, "embed_query", "  embed query (ONNX)"),
    (store.EntryStore, "_lexical_placed", "  lexical + its placements"),
    (SqliteCatalog, "lexical_search", "    BM25 (FTS5)"),
    (store.EntryStore, "_dense", "  dense + turn-context vector searches"),
    (SqliteCatalog, "turn_context", "  placements (catalog.turn_context)"),
    (store.EntryStore, "_ranked", "ranked (head + scores)"),
    (head, "rank_parts", "  fusion, spillover, session boost"),
    (head, "best_first", "  sort"),
    (head, "widen", "  widen head"),
    (store.EntryStore, "_admitted", "  head rows (catalog.get)"),
    (head, "rerank", "  hand-set re-rank"),
    (head, "reorder", "  learned head order"),
    (ChromaVectorIndex, "query", "  cosines of hits outside the dense pool"),
    (ConflictDemotion, "demote", "conflict demotion"),
]


def instrument(per_recall: dict[tuple[str, str], list[float]]) -> None:
    """Wrap every stage's method so that each call adds its wall and thread-CPU ms to ``per_recall``."""
    for owner, name, label in STAGES:
        real = getattr(owner, name)

        def timed(*args: Any, _real: Any = real, _label: str = label, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return _real(*args, **kwargs)
            finally:
                where = "main" if threading.current_thread() is threading.main_thread() else "thr"
                for kind, took in (("wall", time.perf_counter() - wall), ("cpu", time.thread_time() - cpu)):
                    key = (f"{_label} [{where}]", kind)
                    per_recall[key] = per_recall.get(key, 0.0) + 1000 * took

        setattr(owner, name, functools.wraps(real)(timed))


def main() -> None:
    args = bench.parse_args(__doc__)
    per_recall: dict[tuple[str, str], float] = {}
    runs: dict[tuple[str, str], list[float]] = {}
    instrument(per_recall)  # before the store opens: recall binds some stages' methods when it is built
    with bench.filled_store(args) as (mem, rng, _):
        queries = bench.queries_of(rng, args.queries)
        for q in queries[:5]:  # warm-up: model load, first HNSW touch
            mem.recall(q, user_id="u", k=args.k)
        load = os.getloadavg()[0]
        for q in queries:
            per_recall.clear()
            mem.recall(q, user_id="u", k=args.k)
            for key, ms in per_recall.items():
                runs.setdefault(key, []).append(ms)
    stages: dict[str, dict[str, float]] = {}
    for (stage, kind), values in runs.items():
        values.sort()
        row = stages.setdefault(stage, {"calls_in": len(values)})
        row[f"{kind}_p10"] = round(values[len(values) // 10], 2)
        row[f"{kind}_p50"] = round(statistics.median(values), 2)
        row[f"{kind}_p95"] = round(values[int(0.95 * (len(values) - 1))], 2)
    order = [label for _, _, label in STAGES]
    stages = dict(sorted(stages.items(), key=lambda kv: (order.index(kv[0].rsplit(" [", 1)[0]), kv[0])))
    print(json.dumps({"stages": stages, "recalls": len(queries), "load_avg": [round(load, 2),
                                                                             round(os.getloadavg()[0], 2)]}))


if __name__ == "__main__":
    main()
