"""The 3-bit Hadamard value kernel is compiled with LLVM's SLP vectorizer, which numba leaves off by default.

Without it every add of the kernel's straight-line 8-lane code (``fwht8`` over eight columns) was scalar; with it
the kernel writes the same floats, bit for bit, in less time (docs/kv-compression.md, session 6). The switch must
hold only for the kernels that ask for it (``_fused_kernels._slp``), never leak into the rest of the process.
"""

from __future__ import annotations

import numba
import numpy as np
from numba.core import config

from agentmem.kv import _fused_kernels as kernels


def _value_kernel(slp: bool):
    """A fresh (uncached) compile of the 3-bit value kernel, with or without the SLP switch."""
    fresh = numba.njit(fastmath=True, boundscheck=False, nogil=True)(kernels.dequant_values3.py_func)
    return kernels._slp(fresh) if slp else fresh


def _ir(dispatcher) -> str:
    out = np.zeros(64, dtype=np.float32)
    dispatcher(out, np.zeros(1, np.int64), np.zeros((1, 1, 24), np.uint8), np.ones((1, 1, 1), np.float32),
               np.zeros((1, 1, 1), np.float32), True)
    return next(iter(dispatcher.inspect_llvm().values()))


def test_slp_vectorises_the_value_kernel_that_numba_alone_leaves_scalar():
    before = config.SLP_VECTORIZE
    plain, slp = _ir(_value_kernel(False)), _ir(_value_kernel(True))
    assert "x float>" not in plain  # numba's default: no SLP, every float op scalar
    assert "<8 x float>" in slp or "<4 x float>" in slp
    assert config.SLP_VECTORIZE == before  # switched on for that compile only
    assert kernels.dequant_values3.compile.__qualname__.startswith("_slp.")  # the mount's kernel asks for it


def test_the_vectorised_value_kernel_writes_what_the_scalar_one_wrote_bit_for_bit():
    rng = np.random.default_rng(3)
    blocks, tokens = 6, 37
    codes = rng.integers(0, 256, (blocks, tokens, 24), dtype=np.uint8)
    scale = rng.standard_normal((blocks, tokens, 1)).astype(np.float32)
    zero = rng.standard_normal((blocks, tokens, 1)).astype(np.float32)
    bases = (np.arange(blocks, dtype=np.int64) * (tokens + 3) * 64)[::-1].copy()  # gaps, blocks out of order
    scalar = _value_kernel(False)
    for hadamard in (True, False):
        want = np.full(blocks * (tokens + 3) * 64, 7.0, dtype=np.float32)
        got = want.copy()
        scalar(want, bases, codes, scale, zero, hadamard)
        kernels.dequant_values3(got, bases, codes, scale, zero, hadamard)
        np.testing.assert_array_equal(got, want)
        assert (got == 7.0).sum() == blocks * 3 * 64  # the gaps between blocks are left as they were
