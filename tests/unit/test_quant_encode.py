"""Encoding speed-ups that must not change a single stored byte: the in-place clip search and layer_bits layers
quantized once."""

from __future__ import annotations

import pytest
import torch

from agentmem.kv import quant
from agentmem.kv.quant import CLIP_GRID, CODECS, FINE_CLIP_GRID, hadamard_matrix, implied_zero, quantize_kv


def _reference_ranges(xg, dim, bits, symmetric, real=None, grid=CLIP_GRID):
    """The clip search as sessions 3-4 wrote it (one expression, fresh tensors per factor), choosing by argmin
    over all factors at once: an independent reference."""
    levels = (1 << bits) - 1
    hi, lo = xg.amax(dim=dim, keepdim=True), xg.amin(dim=dim, keepdim=True)
    amax, mid, half = torch.maximum(hi, -lo), (hi + lo) / 2, (hi - lo) / 2
    scales, zeros, errs = [], [], []
    for c in grid:
        if symmetric:
            scale = (2 * c * amax / levels).to(torch.float16)
            scale = torch.where(scale > 0, scale, torch.full_like(scale, 2.0 ** -24))
            zero = implied_zero(scale, bits)
        else:
            zero = (lo if c == 1.0 else mid - c * half).to(torch.float16).float()
            scale = (((hi if c == 1.0 else mid + c * half) - zero) / levels).to(torch.float16)
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        s = scale.float()
        sq = torch.round((xg - zero) / s).clamp_(0, levels).mul_(s).add_(zero).sub_(xg).square_()
        if real is not None:
            keep = (torch.arange(xg.shape[dim - 1] * xg.shape[dim]) < real).view(xg.shape[dim - 1], xg.shape[dim])
            sq = sq * keep.view(*keep.shape, *([1] * (xg.dim() - dim - 1))).to(sq.dtype)
        scales.append(scale)
        zeros.append(zero)
        errs.append(sq.sum(dim, keepdim=True))
    # the earliest factor with the least error (argmin returns the first of equal minima)
    pick = torch.stack(errs).argmin(dim=0, keepdim=True)
    return (torch.stack(scales).gather(0, pick)[0].squeeze(dim), torch.stack(zeros).gather(0, pick)[0].squeeze(dim))


@pytest.mark.parametrize("tokens", [5, 60, 130, 300])
@pytest.mark.parametrize("grid", [CLIP_GRID, FINE_CLIP_GRID])
def test_the_in_place_clip_search_chooses_bit_for_bit_what_the_expression_chose(tokens, grid):
    g = torch.Generator().manual_seed(tokens)
    keys = torch.randn(4, 3, tokens, 64, generator=g) * torch.rand(1, 1, 1, 64, generator=g) * 3
    keys[..., 7] += 9.0  # an outlier channel
    values = torch.randn(4, 3, tokens, 64, generator=g) @ hadamard_matrix(64).T
    groups = -(-tokens // 128)
    pad = groups * 128 - tokens
    kp = torch.cat([keys, keys[:, :, -1:].expand(-1, -1, pad, -1)], dim=2) if pad and groups > 1 else keys
    cases = [  # keys per channel over token groups (padding masked), values per rotated row, both value styles
        (kp.reshape(4, 3, groups, -1, 64), 3, 4, False, tokens if kp is not keys else None),
        (values.reshape(4, 3, tokens, 1, 64), 4, 3, True, 64),
        (values.reshape(4, 3, tokens, 1, 64), 4, 4, False, 64),
        (values.reshape(4, 3, tokens, 2, 32), 4, 2, False, 64),
    ]
    for xg, dim, bits, symmetric, real in cases:
        want = _reference_ranges(xg, dim, bits, symmetric, real=real, grid=grid)
        got = quant._group_ranges(xg, dim, bits, symmetric, True, real=real, grid=grid)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # an all-constant group and an all-zero group: the degenerate ranges are kept as they were
    flat = torch.zeros(1, 1, 3, 1, 64)
    flat[0, 0, 1] = 2.5
    for symmetric in (False, True):
        want = _reference_ranges(flat, 4, 3, symmetric, real=64, grid=grid)
        got = quant._group_ranges(flat, 4, 3, symmetric, True, real=64, grid=grid)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_a_layer_with_its_own_widths_is_quantized_once_and_every_other_layer_as_the_base_codec(monkeypatch):
    g = torch.Generator().manual_seed(3)
    keys, values = torch.randn(5, 2, 70, 64, generator=g) * 2, torch.randn(5, 2, 70, 64, generator=g)
    rows = []
    real = quant._quantize_layers

    def counting(k, v, codec, key_bits, value_bits):  # the real function; only the layers it is given are noted
        rows.append((k.shape[0], key_bits, value_bits))
        return real(k, v, codec, key_bits, value_bits)

    monkeypatch.setattr(quant, "_quantize_layers", counting)
    packed = quantize_kv(keys, values, CODECS["k4v3hsl"])  # layer 1's values at 4 bits
    assert rows == [(4, 4, 3), (1, 4, 4)]  # 5 layers quantized once each (was 5 + 1)
    base = quantize_kv(keys, values, CODECS["k4v3hsf"])  # the same codec without layer_bits
    shared = [0, 2, 3, 4]
    assert torch.equal(packed.key_codes, base.key_codes[shared])
    assert torch.equal(packed.value_codes, base.value_codes[shared])
    assert torch.equal(packed.key_scales, base.key_scales) and torch.equal(packed.key_zeros, base.key_zeros)
    assert torch.equal(packed.layer_codes[0][1], base.key_codes[1])  # layer 1's keys: 4 bits in both
    assert torch.equal(packed.value_scales[shared], base.value_scales[shared])
    assert not torch.equal(packed.value_scales[1], base.value_scales[1])  # 4-bit values: their own scales
