"""Grouped key/value heads read in place (agentmem/kv/grouped_sdpa.py): an engine's model gives transformers' SDPA
results bit for bit, and a prompt on a non-empty cache no longer copies the heads (transformers' ``repeat_kv``)."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers.integrations.sdpa_attention as transformers_sdpa

from agentmem.kv import KVEngine
from agentmem.kv.cache import empty_cache
from agentmem.kv.grouped_sdpa import grouped_sdpa_attention_forward
from agentmem.kv.runner import prefill
from agentmem.kv.testing import tiny_causal_lm


@pytest.fixture
def repeat_kv_calls(monkeypatch) -> list[int]:
    """Counts transformers' head copies (``repeat_kv``) while the test runs."""
    calls: list[int] = []
    original = transformers_sdpa.repeat_kv

    def counted(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
        calls.append(n_rep)
        return original(hidden_states, n_rep)

    monkeypatch.setattr(transformers_sdpa, "repeat_kv", counted)
    return calls


def _prompt_on_a_cache(model, cached: list[int], prompt: list[int]) -> torch.Tensor:
    config = model.config
    cache = empty_cache(config.num_hidden_layers, config.num_key_value_heads,
                        config.hidden_size // config.num_attention_heads, capacity=64, dtype=model.dtype)
    with torch.inference_mode():
        prefill(model, cache, cached)  # the "mounted memories"
        return prefill(model, cache, prompt, logits_to_keep=0)  # the question: a masked prompt on the cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_engine_model_answers_a_prompt_on_a_cache_like_stock_sdpa_without_copying_heads(
        dtype: torch.dtype, repeat_kv_calls: list[int]) -> None:
    model, tokenizer = tiny_causal_lm("llama")  # 4 query heads over 2 key/value heads
    model = model.to(dtype)
    stock = copy.deepcopy(model)
    KVEngine(model, tokenizer)  # an engine sets its model's attention (agentmem.kv.batch)
    assert model.config._attn_implementation != stock.config._attn_implementation == "sdpa"
    cached, prompt = list(range(5, 26)), list(range(30, 39))

    stock_logits = _prompt_on_a_cache(stock, cached, prompt)
    assert repeat_kv_calls, "stock SDPA copies grouped heads for a masked prompt (what this change removes)"
    repeat_kv_calls.clear()
    engine_logits = _prompt_on_a_cache(model, cached, prompt)

    assert torch.equal(engine_logits, stock_logits)
    assert repeat_kv_calls == []


def test_calls_it_does_not_take_go_to_transformers_unchanged() -> None:
    attention = tiny_causal_lm("llama")[0].model.layers[0].self_attn
    q1, q3 = torch.randn(1, 4, 1, 16), torch.randn(1, 4, 3, 16)
    k, v = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    mask = torch.ones(1, 1, 3, 8, dtype=torch.bool).tril(5)
    cases = [(q1, None), (q3, None), (q1, mask[:, :, :1])]  # one query token, or no mask: transformers' own path
    for query, attention_mask in cases:
        mine, _ = grouped_sdpa_attention_forward(attention, query, k, v, attention_mask, scaling=0.25)
        stock, _ = transformers_sdpa.sdpa_attention_forward(attention, query, k, v, attention_mask, scaling=0.25)
        assert torch.equal(mine, stock)
    with pytest.raises(ValueError, match="softcap"):  # what SDPA cannot do still fails as transformers fails it
        grouped_sdpa_attention_forward(attention, q3, k, v, mask, scaling=0.25, softcap=30.0)
