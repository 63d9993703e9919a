"""A fused, single-pass key re-rotation for CPU float32 (numba), used by :func:`agentmem.kv.rope.rerotate_keys_into`.

Why: mounting re-rotates every key it places. In torch that takes three passes (one full-width multiply, then one
fused multiply-add per half), and the half-width passes walk 32-float rows, so the rotation cost ~3x a plain copy
of the same keys. This kernel reads each key row once and writes the moved row once: the same speed as a copy.
At 2,048 mounted SmolLM2 tokens (47 MB of keys) that is ~8 ms instead of ~20 ms on one core of the dev VM
(``benchmarks/ttft.py``; numbers in docs/kv-engine.md).

It applies only where it is exact and safe: CPU float32 keys and output, no autograd, output rows contiguous
(the mount buffers and fresh tensors always are). Everything else, or a machine where numba cannot compile, takes
the torch path, which stays the reference (the two agree to float rounding; tests compare them).
``AGENTMEM_FUSED_ROPE=0`` turns the kernel off.

Example:
    >>> if fused_rotation_applies(out, keys):
    ...     rotate_into(out, keys, cos2, sin)   # tables from rope._cached_tables
"""

from __future__ import annotations

import logging
import os
import threading

import numpy as np
import torch

__all__ = ["fused_rotation_applies", "rotate_into"]

log = logging.getLogger(__name__)

_state: dict[str, object] = {}  # "kernel": the compiled function, or "failed": the reason it is unavailable
_lock = threading.Lock()


def _build_kernel(cache: bool = True):
    import numba  # heavy (~0.3 s): imported on the first mount, never by a store-only user

    @numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=cache)
    def rotate_rows(out, offset, lead_sizes, lead_strides, keys, cos2, sin):  # pragma: no cover - compiled
        # out: the output's whole storage, 1-D; its [..., T, D] view starts at ``offset`` and has leading sizes and
        # strides ``lead_*`` (rows of D contiguous floats). keys [B, T, D] C-contiguous, B = prod(lead_sizes).
        # cos2 [T or 1, 2*half] (cos twice), sin [T or 1, half].
        # Slicing rows (instead of indexing out[base + i]) lets LLVM vectorise: computed indices get a
        # negative-index wraparound check per element.
        blocks, tokens, dim = keys.shape
        half = sin.shape[1]
        per_token = sin.shape[0] > 1
        for b in range(blocks):
            base = offset
            rest = b
            for j in range(lead_sizes.shape[0] - 1, -1, -1):  # block index -> its place in the leading dims
                base += (rest % lead_sizes[j]) * lead_strides[j]
                rest //= lead_sizes[j]
            for t in range(tokens):
                row = base + t * dim
                dst = out[row : row + dim]
                src = keys[b, t]
                r = t if per_token else 0
                c = cos2[r]
                s = sin[r]
                for i in range(half):
                    x1 = src[i]
                    x2 = src[i + half]
                    dst[i] = x1 * c[i] - x2 * s[i]
                    dst[i + half] = x2 * c[i] + x1 * s[i]
                for i in range(2 * half, dim):  # partial rotary: the tail dims carry no position
                    dst[i] = src[i]

    return rotate_rows


def _kernel():
    """The compiled kernel, or ``None`` if numba is missing/disabled/failed (then the reason is logged once)."""
    kernel = _state.get("kernel")
    if kernel is not None or "failed" in _state:
        return kernel
    with _lock:
        if "kernel" in _state or "failed" in _state:
            return _state.get("kernel")
        if os.environ.get("AGENTMEM_FUSED_ROPE", "1") == "0":
            _state["failed"] = "disabled by AGENTMEM_FUSED_ROPE=0"
            return None
        try:
            try:
                kernel = _build_kernel()
            except RuntimeError:  # numba found no writable place for its on-disk cache: compile in memory
                kernel = _build_kernel(cache=False)
            # Compile (or load numba's on-disk cache) now, on a tiny problem, so a failure surfaces here once.
            probe = np.zeros(8, dtype=np.float32)
            one = np.ones(1, dtype=np.int64)
            kernel(probe, 0, one, one, np.ones((1, 2, 4), np.float32), np.ones((1, 4), np.float32),
                   np.zeros((1, 2), np.float32))
        except Exception as exc:  # ImportError, or a numba/LLVM failure on an unusual platform
            _state["failed"] = f"{type(exc).__name__}: {exc}"
            log.warning("fused key re-rotation unavailable, mounting with torch ops (%s)", _state["failed"])
            return None
        _state["kernel"] = kernel
        return kernel


def fused_rotation_applies(out: torch.Tensor, keys: torch.Tensor) -> bool:
    """Whether :func:`rotate_into` can serve this pair (and the kernel is available)."""
    if out.dtype != torch.float32 or keys.dtype != torch.float32:
        return False
    if out.device.type != "cpu" or keys.device.type != "cpu" or out.shape != keys.shape or keys.dim() < 2:
        return False
    if keys.numel() == 0:  # nothing to move (and no [B, 0, D] view to hand the kernel)
        return False
    if out.requires_grad or keys.requires_grad:
        return False
    if out.stride(-1) != 1 or (out.shape[-2] > 1 and out.stride(-2) != out.shape[-1]):
        return False
    return _kernel() is not None


def rotate_into(out: torch.Tensor, keys: torch.Tensor, cos2: torch.Tensor, sin: torch.Tensor) -> None:
    """``out = keys`` rotated by the tables (``cos2 = cat(cos, cos)`` and ``sin``; ``[T, ·]`` or one row for all).

    Call only where :func:`fused_rotation_applies`. ``out`` may be a strided view (rows contiguous) into a larger
    buffer; it must not overlap ``keys``.
    """
    kernel = _kernel()
    tokens, dim = keys.shape[-2], keys.shape[-1]
    blocks = keys.reshape(-1, tokens, dim)  # a view for the contiguous keys we mount; a copy otherwise
    if not blocks.is_contiguous():
        blocks = blocks.contiguous()
    storage = torch.as_strided(out, (out.untyped_storage().nbytes() // out.element_size(),), (1,), 0)
    lead = out.dim() - 2
    kernel(
        storage.numpy(),
        out.storage_offset(),
        np.array(out.shape[:lead] or (1,), dtype=np.int64),
        np.array(out.stride()[:lead] or (0,), dtype=np.int64),
        blocks.numpy(),
        cos2.reshape(-1, cos2.shape[-1]).numpy(),
        sin.reshape(-1, sin.shape[-1]).numpy(),
    )
