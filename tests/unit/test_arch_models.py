"""Architectures beyond Llama/Qwen2: mounting is exact where the family allows it, refused with the reason where not.

Tiny random-initialised configs (agentmem.kv.testing) of Qwen3 (q/k norm), Mistral, Phi-3 (partial rotary),
scaled RoPE (llama3, yarn), and Gemma 2 / Gemma 3 / sliding-window Mistral, which must be refused.
"""

from __future__ import annotations

import pytest
import torch

from agentmem.errors import UnsupportedModelError
from agentmem.kv import KVEngine, MemoryItem
from agentmem.kv.cache import new_dynamic_cache, stacked_from_cache
from agentmem.kv.rope import kv_support, rerotate_keys, rotary_inv_freq
from agentmem.kv.runner import prefill
from agentmem.kv.testing import TINY_ARCHS, tiny_causal_lm

EXACT = ["qwen3", "mistral", "phi3", "llama3", "yarn"]
REFUSED = {
    "gemma2": "sliding-window attention layers",
    "gemma3": "different RoPE settings per layer type",
    "mistral-sliding": "sliding-window attention (window 32)",
}
MEMORY = "[8 May 2023] Caroline: I researched adoption agencies in Lyon last week."
QUESTION = "What did Caroline research?"


def _keys_at(model, ids: list[int], first: int) -> torch.Tensor:
    cache = new_dynamic_cache()
    prefill(model, cache, ids, position_ids=torch.arange(first, first + len(ids))[None])
    return stacked_from_cache(cache)[0]


def test_every_listed_family_builds():
    assert set(EXACT) | set(REFUSED) | {"llama", "qwen2", "gpt2"} == set(TINY_ARCHS)


@pytest.mark.parametrize("arch", EXACT)
def test_rerotated_keys_match_encoding_at_the_new_position(arch):
    model, tok = tiny_causal_lm(arch)
    assert kv_support(model) is None
    ids = tok("Caroline went to a support group.", add_special_tokens=False).input_ids
    inv_freq = rotary_inv_freq(model)
    if arch == "phi3":  # partial rotary: 8 of 16 head dims rotate, the rest carry no position
        assert 2 * inv_freq.numel() == 8
    base, target = _keys_at(model, ids, 5), _keys_at(model, ids, 5 + 300)
    moved = rerotate_keys(base, 300, inv_freq, start=5)
    assert (moved - target).abs().max().item() <= 1e-5
    assert (base - target).abs().max().item() > 1e-2  # not vacuous


# The device path (pinned staging, async uploads, rotation as torch ops on the device) runs wherever a GPU is
# present; on this CPU-only machine the CPU path is what runs.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", EXACT)
def test_a_mounted_entry_answers_like_text_reencoding(arch, device):
    model, tok = tiny_causal_lm(arch)
    engine = KVEngine(model.to(device), tok)
    first, second = engine.encode_many([MEMORY, "Melanie paints sunsets."])
    blobs = [engine.to_bytes(first), engine.to_bytes(second)]
    items = [MemoryItem(f"m{i}", t, lambda b=b: engine.from_bytes(b))
             for i, (t, b) in enumerate(zip([MEMORY, "Melanie paints sunsets."], blobs))]
    # one entry: nothing differs but the positions, so mounted KV must equal re-encoding
    kv, ids = engine.answer_logits(QUESTION, items[:1], "adoption agencies", mode="kv")
    text, _ = engine.answer_logits(QUESTION, items[:1], "adoption agencies", mode="text")
    assert (kv - text).abs().max().item() <= 1e-4
    # the second entry is re-rotated (it was encoded at the preamble's end, mounted after the first)
    out = engine.generate(QUESTION, items[::-1], mode="kv", max_new_tokens=4)
    assert out.mounted == ["m1", "m0"] and out.fallbacks == []


@pytest.mark.parametrize("arch", sorted(REFUSED))
def test_families_that_cannot_mount_are_refused_with_the_reason(arch):
    model, tok = tiny_causal_lm(arch)
    reason = kv_support(model)
    assert reason is not None and REFUSED[arch] in reason and "mode='text'" in reason
    engine = KVEngine(model, tok)
    with pytest.raises(UnsupportedModelError, match=REFUSED[arch].split(" (")[0]):
        engine.encode(MEMORY)
    # text mode still answers
    assert engine.generate(QUESTION, [MemoryItem("m0", MEMORY)], mode="text", max_new_tokens=3).mounted == ["m0"]
