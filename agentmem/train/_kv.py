"""The small seam between training and the KV engine.

Everything trained-entry code needs from "the KV side" goes through these few functions: run the frozen model
over ids on top of a cache *with gradients flowing into the cache* (the engine's runner is inference-only, so this
part talks to transformers directly), build a cache from plain tensors, read a cache back, and name the model
(delegated to :mod:`agentmem.kv.fingerprint` / :mod:`agentmem.kv.rope`, so trained entries are bound to the same
fingerprint as every other KV blob).

KV layout used throughout ``agentmem.train``: one tensor per kind stacked over layers,
``keys``/``values`` of shape ``(layers, kv_heads, tokens, head_dim)`` (no batch dimension).

Example:
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> model, tok = tiny_causal_lm("llama")
    >>> k, v = encode(model, torch.tensor([1, 2, 3]))
    >>> tuple(k.shape)                      # 2 layers, 2 KV heads, 3 tokens, head dim 16
    (2, 2, 3, 16)
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "buffered_cache", "cache_from", "check_rope_model", "empty", "encode", "forward_hidden", "model_fingerprint",
    "stack_cache",
]


def check_rope_model(model: Any) -> None:
    """Refuse models whose cached keys cannot be re-positioned exactly (a trained prefix must mount anywhere)."""
    from agentmem.kv.rope import require_kv_support

    require_kv_support(model)


def cache_from(keys: torch.Tensor, values: torch.Tensor, batch: int = 1) -> Any:
    """A transformers ``DynamicCache`` holding ``keys``/``values`` ``(L, H, T, D)``, broadcast to ``batch`` rows.

    ``expand`` is a view: gradients flow back into ``keys``/``values``, which is how the prefix is trained.
    """
    from transformers import DynamicCache

    data = [(keys[i].unsqueeze(0).expand(batch, -1, -1, -1), values[i].unsqueeze(0).expand(batch, -1, -1, -1))
            for i in range(keys.shape[0])]
    return DynamicCache(ddp_cache_data=data)


def buffered_cache(keys: torch.Tensor, values: torch.Tensor, batch: int, capacity: int) -> Any:
    """An inference cache with ``keys``/``values`` ``(L, H, T, D)`` copied into ``batch`` rows and room to grow.

    The engine's buffered cache appends in place; a stock ``DynamicCache`` re-copies everything on each decoded
    token, which dominates sampling with a 1k-token document in context.
    """
    from agentmem.kv.cache import cache_from_stacked

    expand = (-1, batch, -1, -1, -1)
    return cache_from_stacked(keys.unsqueeze(1).expand(*expand), values.unsqueeze(1).expand(*expand),
                              capacity=capacity)


def stack_cache(cache: Any, row: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keys, values)`` of one batch row of a transformers cache, as ``(L, H, T, D)`` tensors."""
    keys = torch.stack([layer.keys[row] for layer in cache.layers])
    values = torch.stack([layer.values[row] for layer in cache.layers])
    return keys, values


def forward_hidden(model: Any, input_ids: torch.Tensor, cache: Any = None, *,
                   attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, Any]:
    """Run the decoder stack only and return ``(last_hidden_state, cache)``.

    Callers apply the output head to the positions they need: the vocabulary projection is a quarter of a small
    model's compute, and training only scores question/answer tokens.
    """
    out = model.base_model(input_ids=input_ids, cache=cache, use_cache=True, attention_mask=attention_mask,
                           position_ids=position_ids)
    return out.last_hidden_state, out.cache


def encode(model: Any, ids: torch.Tensor, prefix: tuple[torch.Tensor, torch.Tensor] | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """KV of ``ids`` (1-D) encoded after ``prefix`` (its KV, or nothing); returns only the new tokens' KV.

    The new tokens sit at positions ``len(prefix) ..``, exactly as a mounted entry after the shared preamble.
    """
    cache = cache_from(*prefix) if prefix is not None and prefix[0].shape[2] > 0 else None
    start = 0 if cache is None else prefix[0].shape[2]
    with torch.no_grad():
        _, cache = forward_hidden(model, ids.view(1, -1), cache)
    keys, values = stack_cache(cache)
    return keys[:, :, start:].clone(), values[:, :, start:].clone()


def empty(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-token KV ``(L, H, 0, D)`` in the model's dtype: the "no preamble" prefix."""
    cfg = model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dtype = next(model.parameters()).dtype
    shape = (cfg.num_hidden_layers, heads, 0, head_dim)
    return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


def model_fingerprint(model: Any, tokenizer: Any) -> str:
    """The KV engine's fingerprint digest of ``(model, tokenizer)``: what every KV blob is bound to."""
    from agentmem.kv.fingerprint import model_fingerprint as kv_fingerprint

    return kv_fingerprint(model, tokenizer).digest
