"""Do two forwards on two threads run side by side on this CPU? (issue #40, the decode lanes of agentmem/kv/lanes.py)

SmolLM2, one intra-op thread, no cache: a 1,000-token forward timed alone and while another thread spins 4-token
forwards (a small decode step), on the main thread and on a new thread; and two 16-token forwards (a decode step of
16 rows) side by side against one alone.

    python research/parallel_forwards.py

Last line: {"big_alone_s": ..., "big_beside_decode_s": ..., "big_thread_beside_decode_s": ..., "m16_alone_ms": ...,
            "m16_pair_ms": [..., ...]}
Seen on the 2-core machine (round 3, session 7): 3.18 / 3.21 / 3.43 s, 102 ms alone against 115 / 117 ms as a pair:
each runs at ~90 % of its speed alone or better, so a second lane is nearly a second model. (A 2,180-token prefill on top of a
mounted cache, by contrast, ran ~1.8x slower beside a decoding lane in benchmarks/batch_decode.py; unexplained.)
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agentmem.kv import load_model  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    model, _ = load_model(None)

    @torch.no_grad()
    def forward(tokens: int) -> None:
        model(input_ids=torch.randint(100, 1000, (1, tokens)), use_cache=False, logits_to_keep=1)

    def timed(tokens: int, repeats: int = 1) -> float:
        t = time.perf_counter()
        for _ in range(repeats):
            forward(tokens)
        return (time.perf_counter() - t) / repeats

    def on_thread(fn) -> float:
        out: list[float] = []
        thread = threading.Thread(target=lambda: out.append(fn()))
        thread.start()
        thread.join()
        return out[0]

    forward(1000)
    res = {"big_alone_s": timed(1000)}
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: [forward(4) for _ in iter(stop.is_set, True)])
    spinner.start()
    time.sleep(0.5)
    res["big_beside_decode_s"] = timed(1000)
    res["big_thread_beside_decode_s"] = on_thread(lambda: timed(1000))
    stop.set()
    spinner.join()
    res["m16_alone_ms"] = 1000 * timed(16, 10)
    pair: list[float] = []
    threads = [threading.Thread(target=lambda: pair.append(1000 * timed(16, 20))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    res["m16_pair_ms"] = pair
    print(json.dumps({k: [round(x, 1) for x in v] if isinstance(v, list) else round(v, 2) for k, v in res.items()}
                     | {"load_avg_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
