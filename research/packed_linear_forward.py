"""One forward pass of the model with and without packed bfloat16 linear weights (agentmem/kv/packed_linear.py).

For each count of new tokens (a decode step is 1, a session turn ~33, a question with a preamble ~128) the forward
runs on a cache of ``--cached`` positions, alternately on the plain bfloat16 model and on a copy whose linear
layers are packed; then a whole prompt of ``--cached`` + 34 tokens with no cache (text mode). Reports the median and
minimum of ``--repeats`` runs each, the ratio, and whether the last-position logits are identical. Last line JSON.

    python research/packed_linear_forward.py --threads 1
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
from transformers import DynamicCache

from agentmem.kv import load_model, prepack_linear_layers


def _timed_forward(model, ids: torch.Tensor, cached: int, new: int) -> tuple[float, torch.Tensor]:
    cache = DynamicCache()
    if cached:
        model(input_ids=ids[:, :cached], cache=cache, use_cache=True)
    start = time.perf_counter()
    out = model(input_ids=ids[:, cached:cached + new], cache=cache, use_cache=True, logits_to_keep=1)
    return time.perf_counter() - start, out.logits


def compare(plain, packed, ids: torch.Tensor, cached: int, new: int, repeats: int) -> dict:
    """Time ``new`` tokens after ``cached`` positions on both models, alternating; check the logits agree."""
    times: dict[str, list[float]] = {"plain": [], "packed": []}
    logits = {}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, model in (("plain", plain), ("packed", packed)):
                seconds, logits[name] = _timed_forward(model, ids, cached, new)
                times[name].append(seconds)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    return {"cached": cached, "new_tokens": new,
            "plain_ms": round(med["plain"] * 1000, 1), "packed_ms": round(med["packed"] * 1000, 1),
            "plain_min_ms": round(min(times["plain"]) * 1000, 1), "packed_min_ms": round(min(times["packed"]) * 1000, 1),
            "speedup": round(med["plain"] / med["packed"], 3),
            "identical_logits": bool(torch.equal(logits["plain"], logits["packed"]))}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a local model directory (default: the embedded SmolLM2)")
    ap.add_argument("--cached", type=int, default=800)
    ap.add_argument("--new", type=int, nargs="+", default=[1, 33, 128])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, _ = load_model(args.model, device="cpu", dtype="float32")  # float32 loads are never packed
    plain = model.to(torch.bfloat16).eval()
    packed = copy.deepcopy(plain)
    layers = prepack_linear_layers(packed)
    ids = torch.randint(100, plain.config.vocab_size - 1, (1, args.cached + max(max(args.new), 34)))
    rows = [compare(plain, packed, ids, args.cached, new, args.repeats) for new in args.new]
    rows.append(compare(plain, packed, ids, 0, args.cached + 34, max(3, args.repeats // 2)))
    for row in rows:
        print(f"{row['cached']:5d} cached + {row['new_tokens']:4d} new: {row['plain_ms']:7.1f} ms plain, "
              f"{row['packed_ms']:7.1f} ms packed ({row['speedup']:.2f}x), identical {row['identical_logits']}")
    result = {"experiment": "packed_linear_forward", "packed_layers": layers, "threads": args.threads,
              "dtype": "bfloat16", "rows": rows}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
