"""The mount kernels' glue: buffers written through arrays memoised by address (reused addresses included)."""

from __future__ import annotations

import torch

from agentmem.kv import rope_kernel
from agentmem.kv.quant import CODECS, dequantize_kv, place_packed, quantize_kv


def _packed(tokens: int = 40):
    g = torch.Generator().manual_seed(1)
    return quantize_kv(torch.randn(3, 2, tokens, 64, generator=g), torch.randn(3, 2, tokens, 64, generator=g),
                       CODECS["k4v3hsl"])


def test_buffers_written_through_memoised_arrays_get_exactly_their_rows_even_at_reused_addresses():
    packed = _packed()
    want_k, want_v = dequantize_kv(packed)
    assert rope_kernel.fused_dequant_applies(torch.zeros(3, 2, 40, 64))
    for _ in range(3):  # same-size buffers, allocated and freed in turn: addresses get reused
        kbuf, vbuf = torch.full((3, 1, 2, 100, 64), float("nan")), torch.full((3, 1, 2, 100, 64), float("nan"))
        place_packed(kbuf[:, 0, :, 30:70], vbuf[:, 0, :, 30:70], packed, delta=0, inv_freq=None, start=0)
        torch.testing.assert_close(kbuf[:, 0, :, 30:70], want_k, rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(vbuf[:, 0, :, 30:70], want_v, rtol=1e-5, atol=1e-5)
        assert torch.isnan(kbuf[:, 0, :, :30]).all() and torch.isnan(vbuf[:, 0, :, 70:]).all()  # nothing else
        del kbuf, vbuf
