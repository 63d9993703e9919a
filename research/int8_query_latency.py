"""What the int8 query embedding saves: recall with the query embedded by the float MiniLM graph vs the default
(int8 feed-forward weights), interleaved query by query on the store ``benchmarks/recall_latency.py`` fills.

    python research/int8_query_latency.py --entries 10000 [--queries 200] [--store DIR]

Research, not a product claim: the switch (``MiniLMEmbedder.int8_queries``) is internal, with no setting, so this
script reaches the store's embedder (moved here from benchmarks/recall_latency.py, whose ``float_query`` variant it
was). ``--store DIR`` reuses a store kept by ``recall_latency.py --store DIR`` (the same generator and seed).

Last line: {"entries", "queries", "p50_ms", "p95_ms", "float_query_p50_ms", "float_query_p95_ms",
"int8_query_p95_ratio", "context_vectors", "load_avg": [before, after]}
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmark's store and queries
from recall_latency import filled_store, parse_args, queries_of  # noqa: E402

from agentmem import AgentMemory  # noqa: E402
from agentmem.ports.vectors import CONTEXT_SPACE  # noqa: E402


def measure(mem: AgentMemory, queries: list[str], k: int) -> dict[str, list[float]]:
    """Milliseconds of each query's recall with the int8 and the float query graph, interleaved."""
    embedder = mem._store.embedder  # the internal switch this script is about
    times: dict[str, list[float]] = {"int8": [], "float": []}
    for q in queries[:5]:  # warm-up: both graphs loaded, first HNSW touch
        for int8 in (True, False):
            embedder.int8_queries = int8
            mem.recall(q, user_id="u", k=k)
    for q in queries:
        for name in times:
            embedder.int8_queries = name == "int8"
            t = time.perf_counter()
            mem.recall(q, user_id="u", k=k)
            times[name].append(1000 * (time.perf_counter() - t))
    embedder.int8_queries = True
    return {name: sorted(v) for name, v in times.items()}


def main() -> None:
    args = parse_args(__doc__)
    with filled_store(args) as (mem, rng, _):
        queries = queries_of(rng, args.queries)
        load_before = os.getloadavg()[0]
        times = measure(mem, queries, args.k)
        context_vectors = len(mem._store.vectors.user_ids("u", space=CONTEXT_SPACE))
    p95 = {name: v[int(0.95 * (len(v) - 1))] for name, v in times.items()}
    print(json.dumps({
        "entries": args.entries, "queries": len(queries),
        "p50_ms": round(statistics.median(times["int8"]), 2), "p95_ms": round(p95["int8"], 2),
        "float_query_p50_ms": round(statistics.median(times["float"]), 2),
        "float_query_p95_ms": round(p95["float"], 2),
        "int8_query_p95_ratio": round(p95["int8"] / p95["float"], 3),
        "context_vectors": context_vectors,
        "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }), flush=True)


if __name__ == "__main__":
    main()
