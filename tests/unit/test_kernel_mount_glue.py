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


def test_warmup_of_a_bfloat16_model_loads_the_kernels_its_first_quantized_mount_needs():
    # In a fresh process (the kernels are process-wide), a bfloat16 engine's warm-up mounts nothing through the fused
    # kernels, yet its later mounts of integer codes use them: warm-up loads them, not the first user's request.
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import torch\n"
        "from agentmem.kv import rope_kernel\n"
        "from agentmem.kv.engine import KVEngine\n"
        "from agentmem.kv.testing import tiny_causal_lm\n"
        "engine = KVEngine(*tiny_causal_lm('llama', dtype=torch.bfloat16))\n"
        "assert 'kernel' not in rope_kernel._state\n"
        "engine.warmup()\n"
        "print('loaded' if 'kernel' in rope_kernel._state else 'not loaded')\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "loaded"
