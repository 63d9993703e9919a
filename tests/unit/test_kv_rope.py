"""Re-rotation of cached keys is exact, and models that cannot be re-positioned are refused."""

from __future__ import annotations

import pytest
import torch

from agentmem.errors import UnsupportedModelError
from agentmem.kv.cache import new_dynamic_cache, stacked_from_cache
from agentmem.kv import rope, rope_kernel
from agentmem.kv.rope import kv_support, require_kv_support, rerotate_keys, rerotate_keys_into, rotary_inv_freq
from agentmem.kv.runner import prefill
from agentmem.kv.testing import tiny_causal_lm


def _keys_at(model, ids: list[int], first_position: int) -> torch.Tensor:
    """Stacked keys [L, 1, H, T, D] of ``ids`` encoded with positions starting at ``first_position``."""
    cache = new_dynamic_cache()
    positions = torch.arange(first_position, first_position + len(ids))[None]
    prefill(model, cache, ids, position_ids=positions)
    return stacked_from_cache(cache)[0]


@pytest.fixture(params=["fused", "torch"])
def rotation_path(request, monkeypatch):
    """Run a test on the fused CPU kernel and on the torch reference path."""
    if request.param == "torch":
        monkeypatch.setattr(rope, "fused_rotation_applies", lambda out, keys: False)
    else:
        assert rope_kernel.fused_rotation_applies(torch.empty(1, 4), torch.empty(1, 4))
    return request.param


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("delta", [1, 37, 300])
def test_rerotated_keys_equal_encoding_at_the_new_offset_in_every_layer(arch, delta, rotation_path):
    model, tok = tiny_causal_lm(arch)
    ids = tok("Caroline went to a support group.", add_special_tokens=False).input_ids
    start = 5
    base = _keys_at(model, ids, start)
    # Shifting every position keeps all relative distances, so each layer's keys differ only by the rotation.
    target = _keys_at(model, ids, start + delta)
    moved = rerotate_keys(base, delta, rotary_inv_freq(model), start=start)
    assert moved.shape == target.shape
    assert (moved - target).abs().max().item() <= 1e-4
    # Without re-rotation the keys are far off: the check above is not vacuous.
    assert (base - target).abs().max().item() > 1e-2


def test_plain_delta_rotation_is_close_and_composes(rotation_path):
    model, tok = tiny_causal_lm("llama")
    ids = tok("hello world", add_special_tokens=False).input_ids
    inv = rotary_inv_freq(model)
    base = _keys_at(model, ids, 0)
    moved = rerotate_keys(base, 40, inv)  # exact float64 angle, no start
    assert (moved - _keys_at(model, ids, 40)).abs().max().item() <= 1e-4
    back = rerotate_keys(moved, -40, inv)
    assert torch.allclose(back, base, atol=1e-5)


def test_rerotate_never_modifies_its_input():
    model, _ = tiny_causal_lm("llama")
    keys = torch.randn(2, 1, 2, 7, 16)
    before = keys.clone()
    out = rerotate_keys(keys, 9, rotary_inv_freq(model), start=3)
    assert torch.equal(keys, before)
    assert out.data_ptr() != keys.data_ptr()
    assert torch.equal(rerotate_keys(keys, 0, rotary_inv_freq(model)), keys)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rope_models_are_supported(arch):
    model, _ = tiny_causal_lm(arch)
    assert kv_support(model) is None
    require_kv_support(model)


def test_gpt2_learned_positions_are_refused_with_a_reason():
    model, _ = tiny_causal_lm("gpt2")
    reason = kv_support(model)
    assert reason is not None and "absolute position" in reason
    with pytest.raises(UnsupportedModelError, match="mode='text'"):
        require_kv_support(model)


def test_dynamic_rope_and_sliding_windows_are_refused():
    model, _ = tiny_causal_lm("llama")
    model.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    assert "dynamic" in kv_support(model)
    model, _ = tiny_causal_lm("qwen2")
    model.config.layer_types = ["full_attention", "sliding_attention", "full_attention"]
    assert "sliding_attention" in kv_support(model)


def test_rotation_tables_are_memoised_exactly_and_within_their_byte_budget():
    from agentmem.kv.rope import _cached_tables, _TableMemo, rotation_tables

    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    cos2, sin = _cached_tables(37, inv_freq, torch.float32, torch.device("cpu"), 14, 9)
    again = _cached_tables(37, inv_freq, torch.float32, torch.device("cpu"), 14, 9)
    assert again[0] is cos2 and again[1] is sin  # reused, not rebuilt
    cos, want_sin = rotation_tables(37, inv_freq, torch.float32, start=14, length=9)
    assert torch.equal(cos2, torch.cat((cos, cos), dim=-1)) and torch.equal(sin, want_sin)
    other = _cached_tables(37, inv_freq * 2, torch.float32, torch.device("cpu"), 14, 9)  # another model's freqs
    assert not torch.equal(other[1], sin)

    memo = _TableMemo(max_bytes=1000)
    for i in range(20):  # each item is 2 x 100 floats = 800 bytes: at most one fits
        memo.get(i, lambda: (torch.zeros(100), torch.zeros(100)))
    assert memo._bytes <= 1000 and len(memo._items) == 1


@pytest.mark.parametrize("start", [None, 11])
@pytest.mark.parametrize("rotary_half", [8, 6])  # 6 of 8 pairs: partial rotary, the tail dims are copied
def test_fused_kernel_matches_the_torch_path_inside_a_larger_buffer(start, rotary_half, monkeypatch):
    torch.manual_seed(0)
    inv = 1.0 / (10000 ** (torch.arange(rotary_half, dtype=torch.float32) / rotary_half))
    keys = torch.randn(3, 2, 9, 16)  # [layers, heads, tokens, head_dim]
    # The mount's destination: a token span of a stacked buffer [L, 1, H, capacity, D], rows contiguous.
    fused_buf = torch.full((3, 1, 2, 40, 16), 7.0)
    torch_buf = fused_buf.clone()
    fused_dst, torch_dst = fused_buf[:, 0, :, 20:29, :], torch_buf[:, 0, :, 20:29, :]
    assert rope_kernel.fused_rotation_applies(fused_dst, keys)
    rerotate_keys_into(fused_dst, keys, 23, inv, start=start)
    monkeypatch.setattr(rope, "fused_rotation_applies", lambda out, keys: False)
    rerotate_keys_into(torch_dst, keys, 23, inv, start=start)
    assert (fused_buf - torch_buf).abs().max().item() <= 1e-6
    assert (fused_buf[..., 20:29, :] - 7.0).abs().min().item() > 0  # the span was written
    assert torch.equal(fused_buf[..., :20, :], torch.full_like(fused_buf[..., :20, :], 7.0))  # neighbours kept
    assert torch.equal(fused_buf[..., 29:, :], torch.full_like(fused_buf[..., 29:, :], 7.0))
    if rotary_half < 8:
        assert torch.equal(fused_dst[..., 2 * rotary_half :], keys[..., 2 * rotary_half :])


def test_fused_kernel_is_skipped_where_it_does_not_apply():
    keys = torch.randn(2, 5, 8)
    assert rope_kernel.fused_rotation_applies(torch.empty(2, 5, 8), keys)
    assert not rope_kernel.fused_rotation_applies(torch.empty(2, 5, 8, dtype=torch.float16), keys)
    assert not rope_kernel.fused_rotation_applies(torch.empty(2, 5, 8), keys.half())
    assert not rope_kernel.fused_rotation_applies(torch.empty(2, 8, 5).transpose(-1, -2), keys)  # rows strided
    assert not rope_kernel.fused_rotation_applies(torch.empty(2, 5, 8), keys.clone().requires_grad_())
    assert not rope_kernel.fused_rotation_applies(torch.empty(2, 0, 8), torch.empty(2, 0, 8))  # no tokens
    assert rerotate_keys(torch.empty(2, 0, 8), 3, torch.ones(4), start=1).shape == (2, 0, 8)
    # fp16 storage still re-rotates correctly, on the torch path.
    inv = 1.0 / (10000 ** (torch.arange(4, dtype=torch.float32) / 4))
    wide = rerotate_keys(keys, 5, inv, start=2)
    narrow = rerotate_keys_into(torch.empty(2, 5, 8), keys.half(), 5, inv, start=2)
    assert (wide - narrow).abs().max().item() < 1e-2


def test_fused_kernel_handles_keys_without_leading_dims(monkeypatch):
    inv = 1.0 / (10000 ** (torch.arange(4, dtype=torch.float32) / 4))
    keys = torch.randn(6, 8)  # [tokens, head_dim]
    fused = rerotate_keys(keys, -3, inv, start=9)
    monkeypatch.setattr(rope, "fused_rotation_applies", lambda out, keys: False)
    assert (fused - rerotate_keys(keys, -3, inv, start=9)).abs().max().item() <= 1e-6
    assert (fused - keys).abs().max().item() > 1e-3
