"""Is one padded attention per layer cheaper than the batched decode step's row-by-row attention? (issue #40)

A decode step of 16 answers attends each row to its own cache (``agentmem/kv/batch.py``). The alternative: one
``scaled_dot_product_attention`` over the rows' keys and values padded to the longest, with a boolean mask. This
times, per layer and on one thread (CPU time): SmolLM2-135M's shapes (9 query heads on 3 KV heads, head size 64),
16 rows of 100-235 cached tokens, the row-by-row calls, the padded call alone (a persistent padded cache), and the
padded call with its per-step gather; and whether the padded output equals the row-by-row one bit for bit.

    python research/padded_attention.py

Last line: {"rowwise_ms": ..., "padded_ms": ..., "padded_with_gather_ms": ..., "max_abs_diff": ..., "bit_equal": ...}
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.nn.functional as F  # noqa: N812


def main(rows: int = 16, kv_heads: int = 3, group: int = 3, dim: int = 64, repeats: int = 200) -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    lens = [100 + 9 * i for i in range(rows)]
    keys = [torch.randn(1, kv_heads, n, dim, generator=gen) for n in lens]
    values = [torch.randn(1, kv_heads, n, dim, generator=gen) for n in lens]
    query = torch.randn(rows, kv_heads * group, 1, dim, generator=gen)
    width = max(lens)
    mask = (torch.arange(width)[None, :] < torch.tensor(lens)[:, None])[:, None, None, :]
    padded_k, padded_v = torch.zeros(rows, kv_heads, width, dim), torch.zeros(rows, kv_heads, width, dim)

    def rowwise() -> torch.Tensor:
        return torch.cat([F.scaled_dot_product_attention(query[b : b + 1], keys[b], values[b], enable_gqa=True)
                          for b in range(rows)])

    def padded(gather: bool) -> torch.Tensor:
        if gather:
            for b, n in enumerate(lens):
                padded_k[b, :, :n], padded_v[b, :, :n] = keys[b][0], values[b][0]
        return F.scaled_dot_product_attention(query.reshape(rows, kv_heads, group, dim), padded_k, padded_v,
                                              attn_mask=mask).reshape(rows, kv_heads * group, 1, dim)

    def per_call_ms(fn) -> float:
        for _ in range(5):
            fn()
        t = time.thread_time()
        for _ in range(repeats):
            fn()
        return round(1000 * (time.thread_time() - t) / repeats, 3)

    out = {"rowwise_ms": per_call_ms(rowwise), "padded_ms": per_call_ms(lambda: padded(False)),
           "padded_with_gather_ms": per_call_ms(lambda: padded(True))}
    a, b = rowwise(), padded(True)
    out |= {"max_abs_diff": float((a - b).abs().max()), "bit_equal": bool(torch.equal(a, b)), "rows": rows,
            "cached_tokens": [min(lens), max(lens)], "load_avg_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
