"""Integer KV codecs: quantization error bounds, packing, and the fused mount kernel against the torch reference."""

from __future__ import annotations

import math

import pytest
import torch

from agentmem.kv import rope_kernel
from agentmem.kv.quant import (
    CODECS, Codec, QuantizedEntry, dequantize_kv, hadamard_matrix, packed_width, place_packed, quantize_kv,
)
from agentmem.kv.rope import rerotate_keys_into

INT_CODECS = [name for name, c in CODECS.items() if c.quantized]


def _kv(tokens: int = 45, dim: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(3, 2, tokens, dim, generator=g) * 2
    keys[..., 5] += 12.0  # an outlier channel, as real keys have: per-channel scales must contain it
    values = torch.randn(3, 2, tokens, dim, generator=g)
    return keys, values


def _inv_freq(dim: int, rotary: int | None = None) -> torch.Tensor:
    rotary = rotary or dim
    return 1.0 / (10000 ** (torch.arange(0, rotary, 2).float() / rotary))


def _inside_range(x: torch.Tensor, packed, which: str) -> torch.Tensor:
    """Elements of ``x`` (keys, or values as quantized) inside their group's representable range."""
    tokens, dim = x.shape[2], x.shape[3]
    if which == "key":
        grow = lambda t: t.float().repeat_interleave(packed.codec.key_group, dim=2)[:, :, :tokens]  # noqa: E731
        scale, zero, bits = grow(packed.key_scales), grow(packed.key_zeros), packed.codec.key_bits
    else:
        grow = lambda t: t.float().repeat_interleave(packed.value_group, dim=3)[..., :dim]  # noqa: E731
        scale, zero, bits = grow(packed.value_scales), grow(packed.value_offsets()), packed.codec.value_bits
    # per layer: a codec's layer_bits layers have their own widths
    levels = torch.tensor([(1 << packed.codec.bits(i)[0 if which == "key" else 1]) - 1 for i in range(x.shape[0])])
    slack = 1e-3 * x.abs().amax()
    return (x >= zero - slack) & (x <= zero + scale * levels.view(-1, 1, 1, 1).float() + slack)


@pytest.mark.parametrize("name", INT_CODECS)
def test_error_is_within_half_a_step_of_each_group(name):
    keys, values = _kv()
    codec = CODECS[name]
    packed = quantize_kv(keys, values, codec)
    k2, v2 = dequantize_kv(packed)
    if codec.value_transform == "hadamard":  # the step bound holds where the values were quantized: rotated
        h = hadamard_matrix(keys.shape[3])
        values, v2 = values @ h.T, v2 @ h.T
    tokens = keys.shape[2]
    key_step = packed.key_scales.float().repeat_interleave(codec.key_group, dim=2)[:, :, :tokens]
    value_step = packed.value_scales.float().repeat_interleave(packed.value_group, dim=3)[..., : keys.shape[3]]
    # Half a quantization step, plus the fp16 rounding of the zero point (relative 2**-11 of the group's min).
    k_slack = 1e-3 * keys.abs().amax() + 1e-6
    v_slack = 1e-3 * values.abs().amax() + 1e-6
    k_in, v_in = _inside_range(keys, packed, "key"), _inside_range(values, packed, "value")
    if not codec.clip:  # min/max ranges hold every element
        assert k_in.all() and v_in.all()
    assert k_in.float().mean() > 0.9 and v_in.float().mean() > 0.9  # a clipped range still holds most of them
    assert ((k2 - keys).abs() <= key_step / 2 + k_slack)[k_in].all()
    assert ((v2 - values).abs() <= value_step / 2 + v_slack)[v_in].all()
    # More bits, less error: the outlier channel does not swamp the other channels' precision.
    err = (k2[..., :5] - keys[..., :5]).abs().mean().item()
    assert err < {8: 0.02, 4: 0.3, 3: 0.6, 2: 1.3}[codec.key_bits]


@pytest.mark.parametrize("name", INT_CODECS)
def test_codes_pack_into_the_advertised_bytes(name):
    keys, values = _kv(tokens=128)  # full key groups for every codec
    codec = CODECS[name]
    packed = quantize_kv(keys, values, codec)
    assert packed.key_codes.dtype == torch.uint8 and packed.key_codes.shape[-1] == 64 * codec.key_bits // 8
    assert packed.value_codes.shape[-1] == 64 * codec.value_bits // 8 == packed_width(64, codec.value_bits)
    stored = sum(t.numel() * t.element_size() for t in packed.stored().values())
    assert ("value_zeros" in packed.stored()) != codec.value_symmetric  # symmetric codes imply their zero points
    per_token = stored / 128
    assert per_token == codec.bytes_per_token(num_layers=3, kv_heads=2, head_dim=64)


def test_smollm2_sizes_match_the_docstring_table():
    size = {n: CODECS[n].bytes_per_token(num_layers=30, kv_heads=3, head_dim=64) for n in CODECS}
    assert size["float32"] == 46080 and size["int4"] == 6840 and size["k4v2"] == 5400 and size["int2"] == 3960
    assert size["int4h"] == 6480 and size["k4v3h"] == 5760 and size["k3v3h"] == size["k4v2h"] == 5040
    assert size["k4v3hs"] == 5400 and size["k4v3hs"] < size["float32"] / 8


def test_a_constant_group_is_exact_and_short_entries_work():
    keys = torch.full((1, 1, 3, 16), 2.5)
    values = torch.zeros((1, 1, 3, 16))
    for name in INT_CODECS:
        k2, v2 = dequantize_kv(quantize_kv(keys, values, CODECS[name]))
        assert torch.allclose(k2, keys)
        # (symmetric codes have no exact zero: an all-zero row comes back within the smallest fp16 step)
        exact = not CODECS[name].value_symmetric
        assert torch.equal(v2, values) if exact else torch.allclose(v2, values, rtol=0, atol=1e-6)


def test_head_dim_must_fit_the_packing():
    with pytest.raises(ValueError, match="head dim"):
        quantize_kv(torch.zeros(1, 1, 2, 6), torch.zeros(1, 1, 2, 6), CODECS["int2"])


@pytest.mark.parametrize("bad", [{"name": "x"}, {"name": "int4", "key_bits": 5, "value_bits": 4, "key_group": 32,
                                                 "value_group": 64},
                                 {"name": "int4", "key_bits": 4, "value_bits": 4, "key_group": 32, "value_group": 64,
                                  "value_transform": "fft"}, {"name": "int4", "key_bits": "a"}, None,
                                 {"name": "k4v3hs", "key_bits": 4, "value_bits": 3, "key_group": 128, "value_group": 64,
                                  "value_symmetric": "yes"},
                                 {"name": "k4v3hsf", "key_bits": 4, "value_bits": 3, "key_group": 128,
                                  "value_group": 64, "clip": True, "clip_grid": "finest"},
                                 *({"name": "k4v3hsl", "key_bits": 4, "value_bits": 3, "key_group": 128,
                                    "value_group": 64, "layer_bits": bad} for bad in
                                   ([[1, 4, 5]], [[2, 4, 4], [1, 4, 4]], [[1, 4, 4], [1, 8, 8]], [[1, 4]], [[-1, 4, 4]],
                                    [["a", 4, 4]], 7))])
def test_codec_headers_are_validated(bad):
    with pytest.raises(ValueError):
        Codec.from_dict(bad)


def test_codec_round_trips_through_its_header():
    for codec in CODECS.values():
        assert Codec.from_dict(codec.to_dict()) == codec


@pytest.mark.parametrize("name", INT_CODECS)
@pytest.mark.parametrize("delta", [0, 37, -3])
@pytest.mark.parametrize("rotary", [None, 48])  # full and partial rotary
def test_fused_kernel_equals_the_torch_reference(name, delta, rotary):
    if rope_kernel._kernel(1) is None:
        pytest.fail("numba kernel unavailable: the fused mount path is not exercised")
    keys, values = _kv(tokens=70)
    packed = quantize_kv(keys, values, CODECS[name])
    inv_freq = _inv_freq(64, rotary)
    # Write into strided views of a larger buffer, as the mount does ([L, 1, H, capacity, D]).
    results = []
    for fused in (True, False):
        kbuf = torch.full((3, 1, 2, 100, 64), float("nan"))
        vbuf = torch.full((3, 1, 2, 100, 64), float("nan"))
        place_packed(kbuf[:, 0, :, 20:90], vbuf[:, 0, :, 20:90], packed, delta=delta, inv_freq=inv_freq, start=14,
                     fused=fused)
        results.append((kbuf, vbuf))
    (fk, fv), (rk, rv) = results
    assert torch.isnan(fk[..., :20, :]).all() and torch.isnan(fk[..., 90:, :]).all()  # nothing outside its span
    torch.testing.assert_close(fk, rk, rtol=1e-6, atol=1e-5, equal_nan=True)
    exact = CODECS[name].value_transform is None  # the kernel's butterflies and a matmul round differently
    torch.testing.assert_close(fv, rv, rtol=0 if exact else 1e-5, atol=0 if exact else 1e-5, equal_nan=True)
    # and the reference is "dequantize, then the ordinary rotation"
    k2, v2 = dequantize_kv(packed)
    want = torch.empty_like(k2)
    if delta:
        rerotate_keys_into(want, k2, delta, inv_freq, start=14)
    else:
        want.copy_(k2)
    torch.testing.assert_close(rk[:, 0, :, 20:90], want, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(rv[:, 0, :, 20:90], v2, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["int4", "k4v3hsl"])
def test_half_precision_targets_get_the_float32_result_rounded_once(dtype, name):
    # a model run in bfloat16 mounts into bfloat16 buffers: the fused kernels fill a float32 stage, cast once
    keys, values = _kv(tokens=10, dim=64)
    packed = quantize_kv(keys, values, CODECS[name])
    kbuf = torch.full((3, 1, 2, 40, 64), float("nan"), dtype=dtype)
    vbuf = torch.full((3, 1, 2, 40, 64), float("nan"), dtype=dtype)
    place_packed(kbuf[:, 0, :, 20:30], vbuf[:, 0, :, 20:30], packed, delta=5, inv_freq=_inv_freq(64), start=3)
    assert torch.isnan(kbuf[..., :20, :]).all() and torch.isnan(vbuf[..., 30:, :]).all()  # nothing outside its span
    fk, fv = torch.empty(3, 2, 10, 64), torch.empty(3, 2, 10, 64)
    place_packed(fk, fv, packed, delta=5, inv_freq=_inv_freq(64), start=3)  # float32, the fused kernels
    assert torch.equal(kbuf[:, 0, :, 20:30], fk.to(dtype)) and torch.equal(vbuf[:, 0, :, 20:30], fv.to(dtype))
    # and the torch reference in that dtype agrees to its own rounding
    rk, rv = torch.empty(3, 2, 10, 64, dtype=dtype), torch.empty(3, 2, 10, 64, dtype=dtype)
    place_packed(rk, rv, packed, delta=5, inv_freq=_inv_freq(64), start=3, fused=False)
    torch.testing.assert_close(rk.float(), fk, rtol=2e-2, atol=3e-2)
    torch.testing.assert_close(rv.float(), fv, rtol=2e-2, atol=3e-2)


def test_quantized_entry_dequantizes_lazily_and_reports_its_shape():
    keys, values = _kv(tokens=12, dim=16)
    packed = quantize_kv(keys, values, CODECS["int8"])
    entry = QuantizedEntry(token_ids=torch.arange(12), packed=packed, offset=4, fingerprint="f", preamble_digest="p")
    assert entry.kv_shape == (3, 2, 12, 16) and entry.num_tokens == 12
    assert entry._floats is None  # shape and length did not dequantize
    assert math.isclose((entry.keys - keys).abs().max().item(), 0.0, abs_tol=0.1)
    assert entry.keys is entry.keys  # dequantized once, then kept


@pytest.mark.parametrize("dim", [16, 32, 64, 128])
def test_the_value_rotation_is_orthonormal_and_the_kernel_computes_it(dim):
    m = hadamard_matrix(dim)
    torch.testing.assert_close(m @ m.T, torch.eye(dim), atol=1e-6, rtol=0)
    assert torch.allclose(m.abs(), torch.full_like(m, dim ** -0.5))  # every channel spread over every other
    if rope_kernel._kernel(2) is None:
        pytest.fail("numba kernel unavailable")
    keys, values = _kv(tokens=9, dim=dim)
    packed = quantize_kv(keys, values, Codec("t", 8, 8, value_transform="hadamard"))
    out = torch.empty(3, 2, 9, dim)
    rope_kernel.dequant_into(out, packed.value_codes, 8, packed.value_scales.float(), packed.value_zeros.float(),
                             token_group=1, channel_group=packed.value_group, hadamard=True)
    torch.testing.assert_close(out, dequantize_kv(packed)[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, values, rtol=0, atol=0.05)  # 8 bits: close to the original values


def test_three_bit_codes_pack_and_unpack_exactly():
    from agentmem.kv.quant import _pack, _unpack

    codes = torch.randint(0, 8, (2, 5, 64), dtype=torch.uint8)
    packed = _pack(codes, 3)
    assert packed.shape[-1] == 24 and torch.equal(_unpack(packed, 3, 64), codes)


@pytest.mark.parametrize("name", [n for n in INT_CODECS if CODECS[n].clip])
def test_the_clip_search_never_reconstructs_a_group_worse_than_min_max(name):
    import dataclasses

    keys, values = _kv(tokens=70)
    keys[0, 0, 3, 7] = 12.0  # one extreme element: clipping it buys its channel a finer step
    codec = CODECS[name]
    plain = dataclasses.replace(codec, clip=False)
    (ck, cv), (pk, pv) = (dequantize_kv(quantize_kv(keys, values, c)) for c in (codec, plain))
    h = hadamard_matrix(64) if codec.value_transform == "hadamard" else torch.eye(64)
    # per key group (channel x 128 tokens, here one) and per value row (where it was quantized: rotated)
    k_err = lambda k2: ((k2 - keys) ** 2).sum(dim=2)  # noqa: E731
    v_err = lambda v2: (((v2 - values) @ h.T) ** 2).sum(dim=3)  # noqa: E731
    assert codec.key_group >= 70
    assert (k_err(ck) <= k_err(pk) * (1 + 1e-3) + 1e-5).all() and (v_err(cv) <= v_err(pv) * (1 + 1e-3) + 1e-5).all()
    assert k_err(ck)[0, 0, 7] < 0.95 * k_err(pk)[0, 0, 7]  # and the outlier's channel did gain
    assert k_err(ck).sum() < k_err(pk).sum() and v_err(cv).sum() < v_err(pv).sum()


def test_the_fine_clip_grid_contains_the_coarse_one_so_no_group_gets_worse():
    from agentmem.kv.quant import CLIP_GRID, FINE_CLIP_GRID

    assert set(CLIP_GRID) <= set(FINE_CLIP_GRID)
    keys, values = _kv(tokens=70)
    keys[0, 0, 3, 7] = 12.0
    fine, coarse = CODECS["k4v3hsf"], CODECS["k4v3hs"]
    assert fine.to_dict()["clip_grid"] == "fine" and "clip_grid" not in coarse.to_dict()  # old headers unchanged
    (fk, fv), (ck, cv) = (dequantize_kv(quantize_kv(keys, values, c)) for c in (fine, coarse))
    h = hadamard_matrix(64)
    k_err = lambda k2: ((k2 - keys) ** 2).sum(dim=2)  # noqa: E731
    v_err = lambda v2: (((v2 - values) @ h.T) ** 2).sum(dim=3)  # noqa: E731
    assert (k_err(fk) <= k_err(ck) * (1 + 1e-3) + 1e-5).all() and (v_err(fv) <= v_err(cv) * (1 + 1e-3) + 1e-5).all()
    assert k_err(fk).sum() < k_err(ck).sum()


def test_symmetric_values_store_no_zero_points_and_decode_through_blob_and_session_formats():
    from agentmem.kv.quant import PackedKV, implied_zero

    codec = next(c for c in CODECS.values() if c.value_symmetric)
    keys, values = _kv(tokens=20)
    packed = quantize_kv(keys, values, codec)
    assert packed.value_zeros is None and "value_zeros" not in packed.stored()
    torch.testing.assert_close(packed.value_offsets(), implied_zero(packed.value_scales, codec.value_bits))
    again = PackedKV.from_stored(codec, packed.stored(), 64)
    for a, b in zip(dequantize_kv(again), dequantize_kv(packed)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(KeyError):  # an asymmetric codec never falls back to implied zero points
        PackedKV.from_stored(CODECS["int4h"], packed.stored(), 64)


@pytest.mark.parametrize("transform", [None, "hadamard"])
def test_the_kernel_handles_several_value_groups_per_row(transform):
    # Every registered codec has one value group per row (the kernel's flat loop); the general path stays exact.
    if rope_kernel._kernel(2) is None:
        pytest.fail("numba kernel unavailable")
    keys, values = _kv(tokens=9)
    packed = quantize_kv(keys, values, Codec("t", 4, 4, value_group=16, value_transform=transform))
    assert packed.value_scales.shape[-1] == 4
    out = torch.empty(3, 2, 9, 64)
    rope_kernel.dequant_into(out, packed.value_codes, 4, packed.value_scales.float(), packed.value_offsets(),
                             token_group=1, channel_group=16, hadamard=transform == "hadamard")
    torch.testing.assert_close(out, dequantize_kv(packed)[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("dim", [32, 64, 128])
def test_the_one_pass_kernels_match_the_reference_at_every_width_and_head_dim(bits, dim):
    # The kernels have per-width fast paths (3-bit D=64, 4-bit keys with full rotary): every other width/dim
    # takes the general loops; both must equal the torch reference.
    if rope_kernel._kernel(2) is None:
        pytest.fail("numba kernel unavailable")
    keys, values = _kv(tokens=33, dim=dim)
    packed = quantize_kv(keys, values, Codec("t", bits, bits, key_group=16))
    for rotary in (None, dim // 2):
        inv_freq = _inv_freq(dim, rotary)
        got, want = torch.empty(3, 2, 33, dim), torch.empty(3, 2, 33, dim)
        place_packed(got, torch.empty(3, 2, 33, dim), packed, delta=11, inv_freq=inv_freq, start=2)
        place_packed(want, torch.empty(3, 2, 33, dim), packed, delta=11, inv_freq=inv_freq, start=2, fused=False)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    out = torch.empty(3, 2, 33, dim)
    rope_kernel.dequant_into(out, packed.value_codes, bits, packed.value_scales.float(), packed.value_offsets(),
                             token_group=1, channel_group=packed.value_group)
    torch.testing.assert_close(out, dequantize_kv(packed)[1], rtol=0, atol=0)


def test_a_layer_with_its_own_bit_widths_is_stored_apart_and_comes_back_at_its_precision():
    from agentmem.kv.quant import PackedKV

    codec = CODECS["k4v3hsl"]  # layer 1's values at 4 bits, every other layer's at 3
    assert codec.bits(1) == (4, 4) and codec.bits(0) == codec.bits(2) == (4, 3)
    keys, values = _kv(tokens=50)
    values[1] = values[0]  # the same values in layers 0 and 1: only the width differs
    packed = quantize_kv(keys, values, codec)
    assert packed.key_codes.shape[0] == 2 and packed.shape == (3, 2, 50, 64)  # layers 0 and 2 shared
    stored = packed.stored()
    assert stored["values@1"].shape == (2, 50, 32) and stored["values"].shape == (2, 2, 50, 24)
    runs = [(a, b, kb, vb) for a, b, _, kb, _, vb in packed.layer_runs()]
    assert runs == [(0, 1, 4, 3), (1, 2, 4, 4), (2, 3, 4, 3)]
    k2, v2 = dequantize_kv(PackedKV.from_stored(codec, stored, 64))
    err = (v2 - values).square().mean(dim=(1, 2, 3))
    assert err[1] < 0.35 * err[0]  # 4 bits: ~1/4 of the 3-bit error
    assert codec.bytes_per_token(num_layers=30, kv_heads=3, head_dim=64) == CODECS["k4v3hsf"].bytes_per_token(
        num_layers=30, kv_heads=3, head_dim=64) + 3 * 64 / 8
    # a model with fewer layers than the codec names: the layer does not exist, the rest is the base codec
    small = quantize_kv(keys[:1], values[:1], codec)
    assert small.layer_codes == () and small.shape == (1, 2, 50, 64)
    torch.testing.assert_close(dequantize_kv(small)[1], dequantize_kv(quantize_kv(keys[:1], values[:1],
                               CODECS["k4v3hsf"]))[1], rtol=0, atol=0)
