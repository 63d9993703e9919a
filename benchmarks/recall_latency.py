"""recall() latency at scale, embedding of the query included.

    python benchmarks/recall_latency.py --entries 10000 [--queries 200] [--store DIR] [--no-consolidate]

Fills one user's store with N short memories (in batches), then times ``recall`` on fresh queries, everything
included (query embedding, both retrievers, fusion, the head's re-ranking, calibration, loading rows). Side by
side in the same run, interleaved query by query, the same recall without the head re-ranking step (the ranking
as before it existed: a ``MemoryConfig(ranking=<weights file>)`` setting speaker_boost 0, temporal_boost 0,
rerank_depth 10, the store opened a second time with it), so the ratio
shows what re-ranking costs on this machine whatever its load; and, the same way, recall without the turn
context vector search (a weights file with ``context_vector_weight`` 0: one vector search fewer), for what that search costs; and
recall without the lifecycle's version following (``MemoryConfig(recall_follows_versions=False)``): the generator's
templated sentences make local consolidation supersede about a third of the store, so this is its worst case.
What the int8 query embedding saves over the float MiniLM graph (an internal switch, no setting) is research:
``research/int8_query_latency.py``.
``--store DIR`` keeps the filled store in DIR and reuses it when it is already there (the same generator and
seed: the same entries and queries), for profiling runs; without it the store lives in a temporary folder.
``--no-consolidate`` writes the entries with ``remember_many(..., consolidate=False)``, as LangGraph's
``AgentMemStore`` does (keys decide identity there, not similarity): nothing is superseded, and each entry carries
its text vector, so recall's conflict check embeds nothing.
Last line: {"entries": N, "consolidate": true|false, "p50_ms": ..., "p95_ms": ..., "mean_ms": ..., "no_rerank_p95_ms": ..., "p95_ratio": ...,
"no_context_p95_ms": ..., "context_p95_ratio": ..., "no_follow_p95_ms": ..., "follow_p95_ratio": ...,
"superseded": ..., "load_avg": [before, after]}
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

from agentmem import AgentMemory

SUBJECTS = ["my sister", "the dog", "our landlord", "my manager", "the dentist", "grandma", "the neighbour", "Tom",
            "the bakery", "my bike", "the garden", "our team", "the kids", "my doctor", "the car", "Lisa"]
VERBS = ["moved to", "asked about", "talked about", "fixed", "bought", "visited", "forgot", "planned", "painted",
         "recommended", "cancelled", "booked", "cooked", "lost", "found", "called about"]
OBJECTS = ["Lyon", "a red kayak", "the tax forms", "a birthday party", "the broken heater", "a new laptop",
           "the concert tickets", "a trip to Porto", "the vet appointment", "a lemon cake", "the old piano",
           "the marathon", "a job interview", "the wedding", "the insurance claim", "a camping weekend"]


def sentence(rng: random.Random, i: int) -> str:
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} (note {i})"


def parse_args(doc: str | None) -> argparse.Namespace:
    """The store's size and seed, the queries and ``--store`` (shared with research/int8_query_latency.py)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--store", type=Path, default=None, help="keep (or reuse) the filled store in this folder")
    ap.add_argument("--no-consolidate", dest="consolidate", action="store_false",
                    help="write with consolidate=False (LangGraph's AgentMemStore): no supersession, text vectors kept")
    return ap.parse_args()


@contextmanager
def filled_store(args: argparse.Namespace) -> Iterator[tuple[AgentMemory, random.Random, Path]]:
    """The store filled with ``args.entries`` (or the one kept in ``args.store``), the generator where the queries
    start, and a scratch folder."""
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.store if args.store is not None else Path(tmp) / "store"
        with AgentMemory(root) as mem:
            fill_once(mem, root, rng, args.entries, consolidate=args.consolidate)
            yield mem, rng, Path(tmp)


def queries_of(rng: random.Random, n: int) -> list[str]:
    return [f"what did {rng.choice(SUBJECTS)} {rng.choice(VERBS)}?" for _ in range(n)]


def main() -> None:
    args = parse_args(__doc__)
    with filled_store(args) as (mem, rng, scratch):
        result = measure(mem, rng, args, scratch)
    print(json.dumps(result), flush=True)


def fill_once(mem: AgentMemory, root: Path, rng: random.Random, entries: int, *, consolidate: bool = True) -> None:
    """Fill the store at ``root`` unless a run kept it filled; either way ``rng`` ends where the queries start.

    A kept store filled another way (another size, or written with the other ``consolidate``) is refused: its
    timings would be another configuration's."""
    marker, made = root / "filled", f"{entries}" + ("" if consolidate else " consolidate=False")
    if not marker.exists():
        fill(mem, rng, entries, consolidate=consolidate)
        marker.write_text(made)
    elif marker.read_text().strip() != made:
        raise SystemExit(f"{root} was filled as {marker.read_text().strip()!r}, not {made!r}: use another --store")
    else:  # the same entries were written: draw them again so the queries are the same
        for i in range(entries):
            sentence(rng, i)


def fill(mem: AgentMemory, rng: random.Random, entries: int, *, consolidate: bool = True) -> None:
    batch = 500
    for start in tqdm(range(0, entries, batch), desc="filling", unit="batch", disable=None):
        n = min(batch, entries - start)
        mem.remember_many([dict(text=sentence(rng, start + j), user_id="u", session_id=f"s{(start + j) // 50}")
                           for j in range(n)], consolidate=consolidate)


def ranking_file(folder: Path, name: str, values: dict) -> str:
    """A weights file (MemoryConfig.ranking) changing only ``values`` of the bundled ranking's "retrieval" group."""
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"retrieval": {"values": values}}))
    return str(path)


def measure(mem: AgentMemory, rng: random.Random, args: argparse.Namespace, folder: Path) -> dict:
    """Times the variants interleaved query by query; the result line's fields.

    The ranking variants are the same store opened again with ``MemoryConfig(ranking=<weights file>)``."""
    queries = queries_of(rng, args.queries)
    config, no_follow = mem.config, mem.config.model_copy(update={"recall_follows_versions": False})
    plain = ranking_file(folder, "no_rerank", {"speaker_boost": 0.0, "temporal_boost": 0.0, "rerank_depth": 10})
    no_context = ranking_file(folder, "no_context", {"context_vector_weight": 0.0})
    with (AgentMemory(mem.path, config=config.model_copy(update={"ranking": plain})) as plain_mem,
          AgentMemory(mem.path, config=config.model_copy(update={"ranking": no_context})) as no_context_mem):
        variants = (("default", mem, config), ("no_rerank", plain_mem, config),
                    ("no_context", no_context_mem, config), ("no_follow", mem, no_follow))
        for q in queries[:5]:  # warm-up: model load, first HNSW touch
            for _, m, _ in variants[:3]:
                m.recall(q, user_id="u", k=args.k)
        times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        load_before = os.getloadavg()[0]
        for q in tqdm(queries, desc="recall", disable=None):
            for name, m, cfg in variants:
                m.config = cfg
                t = time.perf_counter()
                m.recall(q, user_id="u", k=args.k)
                times[name].append(1000 * (time.perf_counter() - t))
    mem.config = config
    superseded = sum(r.status == "superseded" for r in mem.list(user_id="u"))
    for v in times.values():
        v.sort()
    p95 = {name: v[int(0.95 * (len(v) - 1))] for name, v in times.items()}
    result = {
        "entries": args.entries,
        "consolidate": args.consolidate,
        "queries": len(times["default"]),
        "p50_ms": round(statistics.median(times["default"]), 2),
        "p95_ms": round(p95["default"], 2),
        "mean_ms": round(statistics.fmean(times["default"]), 2),
        "no_rerank_p50_ms": round(statistics.median(times["no_rerank"]), 2),
        "no_rerank_p95_ms": round(p95["no_rerank"], 2),
        "p95_ratio": round(p95["default"] / p95["no_rerank"], 3),
        "no_context_p50_ms": round(statistics.median(times["no_context"]), 2),
        "no_context_p95_ms": round(p95["no_context"], 2),
        "context_p95_ratio": round(p95["default"] / p95["no_context"], 3),
        "no_follow_p50_ms": round(statistics.median(times["no_follow"]), 2),
        "no_follow_p95_ms": round(p95["no_follow"], 2),
        "follow_p95_ratio": round(p95["default"] / p95["no_follow"], 3),
        "superseded": superseded,
        "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    return result


if __name__ == "__main__":
    main()
