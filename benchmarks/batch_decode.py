"""Batched decoding across requests, in process: ``--requests`` answers (each with its own mounted memories) run one
after another, then all at once from as many threads; the engine batches the concurrent ones' decode steps
(:mod:`agentmem.kv.batch`). Reports both wall times, the speedup, the decode steps and the largest batch, and
whether every concurrent answer equals its sequential one token for token (SmolLM2 on CPU by default).

    python benchmarks/batch_decode.py --requests 16 --tokens 8

Last line: {"sequential_s": ..., "concurrent_s": ..., "speedup": ..., "steps": ..., "max_batch": ..., "same": true}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentmem.kv import KVEngine, MemoryItem, load_model  # noqa: E402

PLACES = "kitchen school museum train island library forest market".split()
THINGS = "garden boat piano river lamp coffee winter mountain".split()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=8, help="max new tokens per answer")
    ap.add_argument("--model", default=None, help="local HF model dir (default: embedded SmolLM2)")
    args = ap.parse_args()
    engine = KVEngine(*load_model(args.model))
    engine.warmup()
    facts = [f"Fact {i}: the {t} is in the {p}." for i, (t, p) in enumerate(zip(THINGS, PLACES))]
    items = [MemoryItem(f"m{i}", f, (lambda e=e: e)) for i, (f, e) in enumerate(zip(facts, engine.encode_many(facts)))]
    questions = [f"What is in the {PLACES[i % len(PLACES)]}?" for i in range(args.requests)]

    def answer(i: int) -> list[int]:  # a different set of mounted memories per request
        return engine.generate(questions[i], items[i % 4: i % 4 + 4], max_new_tokens=args.tokens).token_ids

    t0 = time.perf_counter()
    sequential = [answer(i) for i in range(args.requests)]
    sequential_s = time.perf_counter() - t0
    steps_before = engine.decoder.steps
    together: list = [None] * args.requests
    barrier = threading.Barrier(args.requests)

    def run(i: int) -> None:
        barrier.wait()
        together[i] = answer(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.requests)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    concurrent_s = time.perf_counter() - t0
    print(json.dumps({"requests": args.requests, "tokens": args.tokens, "sequential_s": round(sequential_s, 2),
                      "concurrent_s": round(concurrent_s, 2), "speedup": round(sequential_s / concurrent_s, 2),
                      "steps": engine.decoder.steps - steps_before, "max_batch": engine.decoder.max_batch_seen,
                      "same": together == sequential, "cpus": os.cpu_count(),
                      "load_avg_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
