"""transformers' SDPA attention, with grouped key/value heads read in place when a mask is given on the CPU.

Models such as SmolLM2 and Llama 3 share each key/value head among several query heads (grouped-query attention).
transformers' SDPA path passes ``enable_gqa=True`` to ``torch.nn.functional.scaled_dot_product_attention`` only
where no mask is given; with a mask (every prompt on top of a non-empty cache: a question after mounted memories,
a session turn, a chunk of a packed step) it first copies each key/value head once per query head (``repeat_kv``),
because on CUDA a masked GQA call falls back to the slow math kernel. On the CPU it does not: torch's flash kernel
takes the mask and the grouped heads as they are, with bit-identical results and no copy. For 20 question tokens
on 2,048 mounted positions of SmolLM2 (bfloat16, one thread) one layer's attention takes 0.64 ms instead of 1.09
(research/notes/grouped_sdpa.md). Before this module the engine got the same path by setting transformers'
``TRANSFORMERS_SDPA_FORCE_GQA`` environment variable around each prefill: process-wide, from whichever thread
prefilled, so every other CPU model in the process changed path meanwhile.

:func:`grouped_sdpa_attention_forward` takes that one case (a mask, several query tokens, grouped heads, a CPU
tensor) to torch's kernel directly and hands every other call to transformers' own ``sdpa_attention_forward``
unchanged. :mod:`agentmem.kv.batch` uses it for every forward of an engine's model.

Example:
    >>> import torch
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> model, _ = tiny_causal_lm("llama")           # 4 query heads share 2 key/value heads
    >>> attention = model.model.layers[0].self_attn
    >>> q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 8, 16)
    >>> mask = torch.ones(1, 1, 3, 8, dtype=torch.bool)
    >>> out, _ = grouped_sdpa_attention_forward(attention, q, k, k, mask, scaling=0.25)
    >>> out.shape                                    # [batch, query tokens, heads, head_dim], as transformers'
    torch.Size([1, 3, 4, 16])
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

__all__ = ["grouped_sdpa_attention_forward"]


def _reads_groups_in_place(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, kwargs: dict) -> bool:
    """Whether this call is the one transformers would serve by copying heads (``repeat_kv``) and torch's CPU
    kernel serves without: a mask, several query tokens, grouped heads, a CPU tensor, nothing SDPA lacks."""
    # transformers reads the grouping the same way (attention modules without it are not grouped)
    groups = getattr(module, "num_key_value_groups", 1)
    return (attention_mask is not None and groups > 1 and query.shape[2] > 1 and query.device.type == "cpu"
            and key.shape[-1] == value.shape[-1]
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
            and not kwargs.get("output_attentions", False))


def grouped_sdpa_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """An attention function with transformers' signature and results (``AttentionInterface``): transformers'
    ``sdpa_attention_forward``, except that a masked call on the CPU over grouped key/value heads reads them in
    place (``enable_gqa``) instead of copying them once per query head.

    ``query`` is ``[batch, heads, q, head_dim]``, ``key``/``value`` ``[batch, kv_heads, kv, head_dim]``; returns
    ``([batch, q, heads, head_dim], None)``.

    Example:
        >>> import torch
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> from transformers.integrations.sdpa_attention import sdpa_attention_forward
        >>> model, _ = tiny_causal_lm("llama")
        >>> attention = model.model.layers[0].self_attn
        >>> q, k, v = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
        >>> mask = torch.ones(1, 1, 3, 8, dtype=torch.bool).tril(5)
        >>> mine, _ = grouped_sdpa_attention_forward(attention, q, k, v, mask, scaling=0.25)
        >>> stock, _ = sdpa_attention_forward(attention, q, k, v, mask, scaling=0.25)
        >>> torch.equal(mine, stock)
        True
    """
    if not _reads_groups_in_place(module, query, key, value, attention_mask, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    # With a mask, transformers' own path sets is_causal False too: the mask carries the causal pattern.
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None
