"""One attention call with grouped key/value heads: transformers' SDPA (heads copied by ``repeat_kv`` whenever a
mask is given) against agentmem's ``grouped_sdpa_attention_forward`` (heads read in place, ``enable_gqa``).

Shapes are SmolLM2-135M's (9 query heads over 3 key/value heads of 64 dims, bfloat16 by default); the keys and
values are views into a buffer with spare room, as the engine's ``BufferedCache`` hands them to the attention. For
each (cached, new) pair, ``new`` query tokens attend to ``cached + new`` keys under a causal tail mask (a question on
mounted memories, a session turn, a decode step). Reports the median microseconds of each, the ratio, and whether the
outputs are identical. Last line JSON.

    python research/grouped_sdpa_attention.py --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import SimpleNamespace

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from agentmem.kv.grouped_sdpa import grouped_sdpa_attention_forward


def _median_us(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e6, 1)


def compare(cached: int, new: int, *, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
            repeats: int) -> dict:
    """Time both attention functions on one layer's shapes; check their outputs agree bit for bit."""
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True, training=False)
    total = cached + new
    query = torch.randn(1, new, heads, head_dim, dtype=dtype).transpose(1, 2)  # as the model's projection makes it
    buffer = torch.randn(2, 1, kv_heads, total + 256, head_dim, dtype=dtype)  # spare room, like BufferedCache
    key, value = buffer[0, ..., :total, :], buffer[1, ..., :total, :]
    mask = (torch.arange(total)[None, :] <= (cached + torch.arange(new))[:, None])[None, None]

    def stock():
        return sdpa_attention_forward(module, query, key, value, mask, scaling=head_dim ** -0.5)[0]

    def grouped():
        return grouped_sdpa_attention_forward(module, query, key, value, mask, scaling=head_dim ** -0.5)[0]

    stock_us, grouped_us = _median_us(stock, repeats), _median_us(grouped, repeats)
    return {"cached": cached, "new_tokens": new, "stock_us": stock_us, "grouped_us": grouped_us,
            "speedup": round(stock_us / grouped_us, 3), "identical": bool(torch.equal(stock(), grouped()))}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", nargs="+", default=["800:33", "2048:20", "2048:128", "2048:1"],
                    help="cached:new token counts")
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for pair in args.pairs:
        cached, new = (int(x) for x in pair.split(":"))
        rows.append(compare(cached, new, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                            dtype=getattr(torch, args.dtype), repeats=args.repeats))
        print(rows[-1], flush=True)
    result = {"threads": args.threads, "dtype": args.dtype, "rows": rows}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
