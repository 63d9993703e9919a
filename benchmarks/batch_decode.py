"""Batched decoding across requests, in process: ``--requests`` answers (each with its own mounted memories) run one
after another, then all at once from as many threads; the engine batches the concurrent ones' decode steps
(:mod:`agentmem.kv.batch`). Reports both wall times, the speedup, the decode steps and the largest batch, and
whether every concurrent answer equals its sequential one token for token (SmolLM2 on CPU by default).

Then, unless ``--long-prompt-tokens 0``, the long-prompt phase: while ``--long-decoders`` answers decode, one
text-mode request with about ``--long-prompt-tokens`` tokens of memories arrives. Reported: the longest gap between
two tokens of the decoding answers while that prompt is prefilled (``max_gap_s``; the prompt's whole prefill when
it holds the model, one packed step's share when it is fed in chunks beside them), their median gap otherwise, the
long request's time to first token beside them and alone, and whether its answer equals its answer alone.

    python benchmarks/batch_decode.py --requests 16 --tokens 8 --long-prompt-tokens 2000

``--torch-dtype`` picks the model's dtype (default ``auto``, as ``MemoryConfig``: bfloat16 on a CPU with AMX).

Last line: {"sequential_s": ..., "concurrent_s": ..., "speedup": ..., "steps": ..., "max_batch": ..., "same": true,
            "long_prompt": {"max_gap_s": ..., "median_gap_s": ..., "ttft_beside_s": ..., "same": true, ...}}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
    ap.add_argument("--long-prompt-tokens", type=int, default=2000, help="memory tokens of the text-mode request "
                    "of the long-prompt phase (0: skip the phase)")
    ap.add_argument("--long-decoders", type=int, default=4, help="answers decoding while the long prompt arrives")
    ap.add_argument("--torch-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                    help="the model's dtype; auto is MemoryConfig's default (agentmem/kv/device.py)")
    args = ap.parse_args()
    model, tokenizer = load_model(args.model, dtype=args.torch_dtype)
    engine = KVEngine(model, tokenizer)
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
    out = {"requests": args.requests, "tokens": args.tokens, "sequential_s": round(sequential_s, 2),
           "concurrent_s": round(concurrent_s, 2), "speedup": round(sequential_s / concurrent_s, 2),
           "steps": engine.decoder.steps - steps_before, "max_batch": engine.decoder.max_batch_seen,
           "same": together == sequential}
    if args.long_prompt_tokens > 0:
        out["long_prompt"] = long_prompt_phase(engine, items, args.long_prompt_tokens, args.long_decoders)
    machine = {"cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps({**out, "torch_dtype": str(model.dtype).removeprefix("torch."), **machine}))
    plot(out, Path(__file__).resolve().parent.parent / "docs" / "batch-decode-long-prompt.png")


def long_prompt_phase(engine: KVEngine, items: list, memory_tokens: int, decoders: int) -> dict:
    """The longest stall of ``decoders`` decoding answers while a text-mode prompt of ~``memory_tokens`` tokens of
    memories is prefilled (see the module doc)."""
    notes, used = [], 0
    while used < memory_tokens:  # distinct notes, as long as asked, mounted as text
        note = f"Note {len(notes)}: " + " ".join(f"the {THINGS[(len(notes) + j) % 8]} stays in the "
                                                 f"{PLACES[(len(notes) * 3 + j) % 8]}" for j in range(6)) + "."
        notes.append(MemoryItem(f"n{len(notes)}", note, lambda: None))
        used += len(engine.tokenizer(note)["input_ids"])
    question = "Where does the lamp stay?"
    alone = engine.generate(question, notes, mode="text", max_new_tokens=4)
    stop = threading.Event()
    stamps: list[list[float]] = [[] for _ in range(decoders)]

    def decode(i: int) -> None:
        engine.generate(PLACES[i] + " and " + THINGS[i] + ", again and again:", items[i % 4: i % 4 + 4],
                        max_new_tokens=4000, cancel=stop, on_text=lambda _piece: stamps[i].append(time.perf_counter()))

    threads = [threading.Thread(target=decode, args=(i,)) for i in range(decoders)]
    for t in threads:
        t.start()
    time.sleep(3.0)  # every answer is decoding
    t0 = time.perf_counter()
    beside = engine.generate(question, notes, mode="text", max_new_tokens=4)
    t1 = time.perf_counter()
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join()
    gaps_in, gaps_out = [], []
    for times in stamps:
        for a, b in zip(times, times[1:]):
            (gaps_in if a < t1 and b > t0 else gaps_out).append(b - a)
    return {"memory_tokens": used, "prompt_tokens": beside.prompt_tokens, "decoders": decoders,
            "max_gap_s": round(max(gaps_in), 3), "median_gap_s": round(statistics.median(gaps_out), 3),
            "ttft_beside_s": round(beside.timings["ttft"], 3), "ttft_alone_s": round(alone.timings["ttft"], 3),
            "same": beside.token_ids == alone.token_ids, "step_tokens": getattr(engine.decoder, "step_tokens", None)}


def plot(out: dict, path: Path) -> None:
    """Bars: the decoding answers' median gap between tokens and their longest gap while the long prompt runs."""
    if "long_prompt" not in out:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lp = out["long_prompt"]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(["median gap", "longest gap\nduring the long prompt"], [lp["median_gap_s"], lp["max_gap_s"]])
    ax.set_ylabel("seconds between two tokens")
    ax.set_title(f"{lp['decoders']} answers decoding, a {lp['prompt_tokens']}-token prompt arrives", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
