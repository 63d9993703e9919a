"""Where a chat request's seconds go, in process: the server's chat path (``mount_choice`` then ``generate`` with
the chosen ids, 8 new tokens, k=4) on ``CLIENTS`` threads over one user's 40 memories, with every prefill forward
and decode step (``engine.decoder._step``, which also feeds the waiting prompts) timed by its batch size.

    python research/chat_profile.py 16 64        # 16 clients, 64 requests

Last line: {"clients": ..., "req_per_s": ..., "op_ms": {"_step[B]": [count, mean ms]},
            "mean_ms": {"recall": ..., "load": ..., "mount": ..., "prefill": ..., "decode": ...}}
(``prefill`` and ``decode`` per request include waiting for the model's lock and for the batch.)
"""

from __future__ import annotations

import collections
import json
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from agentmem import AgentMemory  # noqa: E402
from server_load import sentence  # noqa: E402  (the load benchmark's own memories and questions)


def main() -> None:
    clients = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    rng = random.Random(0)
    mem = AgentMemory(tempfile.mkdtemp())
    mem.warmup()
    for _ in range(40):
        mem.remember(sentence(rng, 14), user_id="chat-u")
    questions = [sentence(rng, 6) + "?" for _ in range(requests)]
    engine = mem._answer.bank.engine  # research: the engine's batches are timed from inside

    def one(q: str) -> dict[str, float]:
        t0 = time.perf_counter()
        choice = mem.mount_choice(q, user_id="chat-u", k=4)
        t1 = time.perf_counter()
        out = mem.generate(q, user_id="chat-u", entry_ids=[h.id for h in choice.mounted], max_new_tokens=8)
        return {"recall": t1 - t0, "total": time.perf_counter() - t0,
                **{k: out.timings[k] for k in ("load", "mount", "prefill", "decode")}}

    one("warm up question?")
    ops: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    fn = engine.decoder._step
    engine.decoder._step = lambda active, prompts: _timed(ops, "_step", lambda _: fn(active, prompts), active)
    t = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        rows = list(pool.map(one, questions))
    wall = time.perf_counter() - t
    print(json.dumps({"clients": clients, "requests": requests, "req_per_s": round(requests / wall, 2),
                      "op_ms": {f"{k[0]}[{k[1]}]": [len(v), round(1000 * statistics.mean(v), 1)]
                                for k, v in sorted(ops.items())},
                      "mean_ms": {k: round(1000 * statistics.mean(r[k] for r in rows), 1) for k in rows[0]}}))


def _timed(ops, name, fn, batch):
    t = time.perf_counter()
    try:
        return fn(batch)
    finally:
        ops[(name, len(batch))].append(time.perf_counter() - t)


if __name__ == "__main__":
    main()
