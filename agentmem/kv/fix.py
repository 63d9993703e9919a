"""``kv+fix``: recompute a few tokens of mounted entries in context, so entries see each other again.

Entries encoded alone never attended to each other. Two strategies pick tokens to recompute:

* ``epic`` (after EPIC / LegoLink): the first ``first_tokens`` tokens of every entry after the first.
* ``cacheblend`` (after CacheBlend): run the mounted prompt through layers ``0..check_layer`` only, splice those
  exact early-layer KV in for all tokens, and pick the ``ratio`` share of entry tokens whose KV deviate most there.

Recomputation itself is exact for the selected tokens given everything else: one forward over just those tokens
at their real positions, with a custom attention mask so each attends to (a) cached tokens before it that are not
being recomputed and (b) the recomputed tokens up to itself. Their new KV then replace the stale ones in place.
Attention ignores the order of cache slots (positions live inside the rotated keys), so appending the recomputed
tokens at the end of the cache and masking is equivalent to recomputing them in place. Recomputing *every* entry
token this way reproduces full text encoding, which the tests check.

Measured (docs/kv-engine.md): ``cacheblend`` recovers more per recomputed token than ``epic`` and is the default.

Example (two memories, each encoded alone, then mounted; ``epic`` recomputes the second one's first 8 tokens):
    >>> from agentmem.kv.cache import stacked_from_cache
    >>> from agentmem.kv.engine import KVEngine
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> from agentmem.kv.types import MemoryItem
    >>> engine = KVEngine(*tiny_causal_lm("llama"))
    >>> texts = ["Alice lives in Lisbon.", "She moved there in 2021."]
    >>> prep = engine.prepare("Where?", [MemoryItem(str(i), text) for i, text in enumerate(texts)])
    >>> ids = torch.tensor(engine.layout.preamble_ids + [i for t in texts for i in engine.layout.entry_ids(t)])
    >>> apply_fix(engine.model, prep.cache, ids, prep.spans, FixConfig(strategy="epic"))
    8
    >>> text = new_dynamic_cache()
    >>> _ = prefill(engine.model, text, ids)             # the same tokens encoded together: the reference
    >>> start = prep.spans[1][0]                        # the recomputed tokens now hold their in-context KV
    >>> torch.allclose(stacked_from_cache(prep.cache, start, start + 8)[0], stacked_from_cache(text, start,
    ...                start + 8)[0], atol=1e-4)
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from agentmem.kv.cache import cache_layers, cache_length, crop_cache, new_dynamic_cache, write_positions
from agentmem.kv.runner import forward_prefix_layers, prefill

__all__ = [
    "FixConfig",
    "apply_fix",
    "cacheblend_positions",
    "epic_positions",
    "max_recomputed",
    "recompute_positions",
]

FixStrategy = Literal["epic", "cacheblend"]


@dataclass(frozen=True)
class FixConfig:
    """Which tokens ``kv+fix`` recomputes.

    Default: ``cacheblend`` at 30%. On 200 LoCoMo dev questions (8 memories, ~470 tokens) it halved naive KV's
    KL to text mode (0.203 -> 0.093) where ``epic`` with 8 first tokens (12% of tokens) gave 0.166 and
    ``cacheblend`` at the paper's 15% gave 0.134 (see docs/kv-engine.md). The two candidate shares (15%, 30%)
    were fixed before that run, from an independent corpus (stdlib docstring sentences) where 15% recovered only
    16% of the KL and 30% recovered 42%; the dev run chose between them.
    """

    strategy: FixStrategy = "cacheblend"
    first_tokens: int = 8  # epic: per entry
    ratio: float = 0.30  # cacheblend: share of the tokens of entries after the first
    check_layer: int = 1  # cacheblend: layer whose KV deviation ranks tokens (layer 0 KV never deviate)


def max_recomputed(config: FixConfig, lengths: Sequence[int]) -> int:
    """Upper bound on how many tokens ``config`` recomputes for entries of ``lengths`` (to size the cache)."""
    if config.strategy == "epic":
        return sum(min(n, config.first_tokens) for n in lengths)
    return math.ceil(config.ratio * sum(lengths)) + 1


def _needs_fix(spans: Sequence[tuple[int, int]], exact_end: int | None) -> list[tuple[int, int]]:
    # A span starting right after the preamble was encoded in exactly its mounted context: nothing to fix.
    # Without exact_end, the first span is taken to be that one.
    if exact_end is None:
        return list(spans[1:])
    return [(s, e) for s, e in spans if s != exact_end]


def epic_positions(
    spans: Sequence[tuple[int, int]], first_tokens: int, exact_end: int | None = None
) -> torch.Tensor:
    """First ``first_tokens`` positions of every span that was not encoded in its true context."""
    picks = [torch.arange(s, min(e, s + first_tokens)) for s, e in _needs_fix(spans, exact_end)]
    return torch.cat(picks) if picks else torch.empty(0, dtype=torch.long)


def recompute_positions(model, cache, token_ids: torch.Tensor, positions: torch.Tensor) -> None:
    """Recompute the KV of ``positions`` in context (everything else fixed) and write them into ``cache``.

    ``token_ids`` are the ids of every cached position (1-D, length = cache length).
    """
    if positions.numel() == 0:
        return
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    n = cache_length(cache)
    pos = positions.to(device=device, dtype=torch.long).sort().values
    m = pos.numel()
    cols = torch.arange(n, device=device)
    recomputed = torch.zeros(n, dtype=torch.bool, device=device)
    recomputed[pos] = True
    old_ok = (cols[None, :] < pos[:, None]) & ~recomputed[None, :]  # stale copies of recomputed tokens are hidden
    new_ok = pos[None, :] <= pos[:, None]  # causal among the recomputed tokens
    allowed = torch.cat([old_ok, new_ok], dim=1)
    # Additive float mask works for every attention backend (eager adds it; sdpa accepts it).
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    prefill(
        model,
        cache,
        token_ids.to(device)[pos],
        position_ids=pos[None, :],
        attention_mask=mask[None, None],
        logits_to_keep=1,
    )
    layers = cache_layers(cache)
    new_k = torch.stack([k[..., n : n + m, :] for k, _ in layers])
    new_v = torch.stack([v[..., n : n + m, :] for _, v in layers])
    crop_cache(cache, n)
    write_positions(cache, pos, new_k, new_v)


def cacheblend_positions(
    model,
    cache,
    token_ids: torch.Tensor,
    spans: Sequence[tuple[int, int]],
    ratio: float,
    check_layer: int,
    exact_end: int | None = None,
) -> torch.Tensor:
    """Splice exact KV of layers ``0..check_layer`` into the spans to fix; return their most-deviating positions."""
    todo = _needs_fix(spans, exact_end)
    if not todo:
        return torch.empty(0, dtype=torch.long)
    n = cache_length(cache)
    fresh = new_dynamic_cache()
    forward_prefix_layers(model, fresh, token_ids[:n], check_layer)
    fresh_layers = cache_layers(fresh)
    mounted = cache_layers(cache)
    device = mounted[0][0].device
    candidates = torch.cat([torch.arange(s, e) for s, e in todo]).to(device)
    fk, fv = fresh_layers[check_layer]
    mk, mv = mounted[check_layer]
    dev = ((fk.index_select(-2, candidates) - mk.index_select(-2, candidates)) ** 2).sum(dim=(0, 1, 3))
    dev += ((fv.index_select(-2, candidates) - mv.index_select(-2, candidates)) ** 2).sum(dim=(0, 1, 3))
    for layer in range(check_layer + 1):
        (k, v), (fk_l, fv_l) = mounted[layer], fresh_layers[layer]
        k.index_copy_(-2, candidates, fk_l.index_select(-2, candidates))
        v.index_copy_(-2, candidates, fv_l.index_select(-2, candidates))
    count = min(dev.numel(), max(1, math.ceil(ratio * dev.numel())))
    return candidates[dev.topk(count).indices].cpu()


def apply_fix(
    model,
    cache,
    token_ids: torch.Tensor,
    spans: Sequence[tuple[int, int]],
    config: FixConfig,
    *,
    exact_end: int | None = None,
) -> int:
    """Apply ``config``'s strategy to a freshly mounted ``cache``; returns how many tokens were recomputed.

    ``spans`` are the entries that may be fixed; one starting at ``exact_end`` (the preamble length) is left as
    is, since it was encoded in exactly its mounted context (default: the first span is that one).
    """
    if config.strategy == "epic":
        positions = epic_positions(spans, config.first_tokens, exact_end)
    elif config.strategy == "cacheblend":
        positions = cacheblend_positions(
            model, cache, token_ids, spans, config.ratio, config.check_layer, exact_end
        )
    else:
        raise ValueError(f"unknown fix strategy {config.strategy!r}; use 'epic' or 'cacheblend'")
    recompute_positions(model, cache, token_ids, positions)
    return int(positions.numel())
