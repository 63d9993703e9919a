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

__all__ = ["dequant_into", "fused_dequant_applies", "fused_rotation_applies", "rotate_into"]

log = logging.getLogger(__name__)

_state: dict[str, object] = {}  # "kernel": the compiled function, or "failed": the reason it is unavailable
_lock = threading.Lock()


def _build_kernel(cache: bool = True):
    import numba  # heavy (~0.3 s): imported on the first mount, never by a store-only user

    @numba.njit(boundscheck=False, nogil=True, cache=cache, inline="always")
    def block_base(b, offset, lead_sizes, lead_strides):  # pragma: no cover - compiled
        # block index -> the storage offset of its [T, D] rows, through the output's leading sizes and strides
        base = offset
        rest = b
        for j in range(lead_sizes.shape[0] - 1, -1, -1):
            base += (rest % lead_sizes[j]) * lead_strides[j]
            rest //= lead_sizes[j]
        return base

    @numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=cache, inline="always")
    def rotate_row(dst, src, c, s, half, dim):  # pragma: no cover - compiled
        for i in range(half):
            x1 = src[i]
            x2 = src[i + half]
            dst[i] = x1 * c[i] - x2 * s[i]
            dst[i + half] = x2 * c[i] + x1 * s[i]
        for i in range(2 * half, dim):  # partial rotary: the tail dims carry no position
            dst[i] = src[i]

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
            base = block_base(b, offset, lead_sizes, lead_strides)
            for t in range(tokens):
                row = base + t * dim
                dst = out[row : row + dim]
                src = keys[b, t]
                r = t if per_token else 0
                rotate_row(dst, src, cos2[r], sin[r], half, dim)

    @numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=cache, inline="always")
    def unpack_row(row, src, bits):  # pragma: no cover - compiled
        # Codes of one row as floats. Planar packing (quant._pack: element i at byte i % W, bit (i // W) * bits)
        # keeps every loop a contiguous stream, and widening through int32 lets LLVM vectorise (uint8 arithmetic
        # widens to int64, which it does not).
        width = src.shape[0]
        if bits == 8:
            for i in range(width):
                row[i] = np.float32(np.int32(src[i]))
        elif bits == 4:
            for j in range(width):
                row[j] = np.float32(np.int32(src[j]) & 15)
            for j in range(width):
                row[width + j] = np.float32(np.int32(src[j]) >> 4)
        elif bits == 2:
            for k in range(4):
                for j in range(width):
                    row[k * width + j] = np.float32((np.int32(src[j]) >> (2 * k)) & 3)
        elif width == 24:  # 3 bits, D = 64 (SmolLM2, Llama 3.2 1B): constant trip counts, so LLVM vectorises
            for k in range(4):
                for j in range(16):
                    row[k * 16 + j] = np.float32((np.int32(src[j]) >> (2 * k)) & 3)
            for k in range(8):
                for j in range(8):
                    row[k * 8 + j] += np.float32(((np.int32(src[16 + j]) >> k) & 1) * 4)
        else:  # 3 bits: a 2-bit plane (low bits, D/4 bytes) then a 1-bit plane (high bit, D/8 bytes)
            lo = (width * 2) // 3
            hi = width - lo
            for k in range(4):
                for j in range(lo):
                    row[k * lo + j] = np.float32((np.int32(src[j]) >> (2 * k)) & 3)
            for k in range(8):
                for j in range(hi):
                    row[k * hi + j] += np.float32(((np.int32(src[lo + j]) >> k) & 1) * 4)

    @numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=cache, inline="always")
    def fwht8(x0, x1, x2, x3, x4, x5, x6, x7):  # pragma: no cover - compiled
        # H_8 (x0..x7), unnormalised, Sylvester order: three butterfly stages on registers
        x0, x1, x2, x3, x4, x5, x6, x7 = x0 + x1, x0 - x1, x2 + x3, x2 - x3, x4 + x5, x4 - x5, x6 + x7, x6 - x7
        x0, x1, x2, x3, x4, x5, x6, x7 = x0 + x2, x1 + x3, x0 - x2, x1 - x3, x4 + x6, x5 + x7, x4 - x6, x5 - x7
        return x0 + x4, x1 + x5, x2 + x6, x3 + x7, x0 - x4, x1 - x5, x2 - x6, x3 - x7

    @numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=cache, inline="always")
    def hadamard_row(dst, row, tmp, dim):  # pragma: no cover - compiled
        # dst = row @ quant.hadamard_matrix(dim): the row as an [a, b] matrix X (a*b = dim, a >= b), X <- H_a X,
        # then Y = X^T, Y <- H_b Y, dst = Y / sqrt(dim).
        if dim == 64:
            # a = b = 8 with constant indices: the first pass runs 8 columns side by side (one SIMD vector),
            # the second works on registers and writes the transposed result straight to dst.
            for c in range(8):
                (row[c], row[8 + c], row[16 + c], row[24 + c], row[32 + c], row[40 + c], row[48 + c],
                 row[56 + c]) = fwht8(row[c], row[8 + c], row[16 + c], row[24 + c], row[32 + c], row[40 + c],
                                      row[48 + c], row[56 + c])
            for r in range(8):
                y0, y1, y2, y3, y4, y5, y6, y7 = fwht8(row[8 * r], row[8 * r + 1], row[8 * r + 2], row[8 * r + 3],
                                                       row[8 * r + 4], row[8 * r + 5], row[8 * r + 6], row[8 * r + 7])
                dst[r] = y0 * np.float32(0.125)
                dst[8 + r] = y1 * np.float32(0.125)
                dst[16 + r] = y2 * np.float32(0.125)
                dst[24 + r] = y3 * np.float32(0.125)
                dst[32 + r] = y4 * np.float32(0.125)
                dst[40 + r] = y5 * np.float32(0.125)
                dst[48 + r] = y6 * np.float32(0.125)
                dst[56 + r] = y7 * np.float32(0.125)
            return
        b = 1
        while b * b < dim:
            b *= 2
        if b * b > dim:
            b //= 2
        a = dim // b
        butterflies(row, a, b)
        for r in range(a):
            src = row[r * b : (r + 1) * b]
            for c in range(b):
                tmp[c * a + r] = src[c]
        butterflies(tmp, b, a)
        norm = np.float32(1.0 / np.sqrt(dim))
        for i in range(dim):
            dst[i] = tmp[i] * norm

    @numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=cache, inline="always")
    def butterflies(x, rows, width):  # pragma: no cover - compiled
        # x as [rows, width]: x <- H_rows x (unnormalised Sylvester), whole rows at a time (sliced: vectorises)
        h = 1
        while h < rows:
            for i in range(0, rows, 2 * h):
                for j in range(i, i + h):
                    top = x[j * width : (j + 1) * width]
                    bot = x[(j + h) * width : (j + h + 1) * width]
                    for c in range(width):
                        p = top[c]
                        q = bot[c]
                        top[c] = p + q
                        bot[c] = p - q
            h *= 2

    @numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=cache)
    def dequant_keys(out, offset, lead_sizes, lead_strides, codes, bits, scale, zero, group, cos2, sin, rotate):
        # pragma: no cover - compiled. Keys: codes [B, T, W] uint8 -> floats (one scale/zero per channel, per
        # ``group`` tokens: scale/zero [B, ceil(T / group), D]) -> rotated by cos2/sin (as in rotate_rows).
        blocks, tokens, width = codes.shape
        dim = (width * 8) // bits
        half = sin.shape[1]
        per_token = sin.shape[0] > 1
        row = np.empty(dim, dtype=np.float32)
        for b in range(blocks):
            base = block_base(b, offset, lead_sizes, lead_strides)
            for t in range(tokens):
                unpack_row(row, codes[b, t], bits)
                s = scale[b, t // group]
                z = zero[b, t // group]
                for i in range(dim):
                    row[i] = row[i] * s[i] + z[i]
                at = base + t * dim
                dst = out[at : at + dim]
                if rotate:
                    r = t if per_token else 0
                    rotate_row(dst, row, cos2[r], sin[r], half, dim)
                else:
                    for i in range(dim):
                        dst[i] = row[i]

    @numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=cache)
    def dequant_values(out, offset, lead_sizes, lead_strides, codes, bits, scale, zero, group, hadamard):
        # pragma: no cover - compiled. Values: codes [B, T, W] uint8 -> floats, one scale/zero per token and
        # ``group`` channels (scale/zero [B, T, ceil(D / group)]), then rotated back by a Hadamard transform when
        # the codec rotated them before quantizing.
        blocks, tokens, width = codes.shape
        dim = (width * 8) // bits
        groups = (dim + group - 1) // group
        row = np.empty(dim, dtype=np.float32)
        tmp = np.empty(dim, dtype=np.float32)
        for b in range(blocks):
            base = block_base(b, offset, lead_sizes, lead_strides)
            for t in range(tokens):
                unpack_row(row, codes[b, t], bits)
                s = scale[b, t]
                z = zero[b, t]
                at = base + t * dim
                dst = out[at : at + dim]
                if hadamard:
                    for g in range(groups):
                        sg = s[g]
                        zg = z[g]
                        for i in range(g * group, min((g + 1) * group, dim)):
                            row[i] = row[i] * sg + zg
                    hadamard_row(dst, row, tmp, dim)
                    continue
                for g in range(groups):
                    sg = s[g]
                    zg = z[g]
                    for i in range(g * group, min((g + 1) * group, dim)):
                        dst[i] = row[i] * sg + zg

    return rotate_rows, dequant_keys, dequant_values



def _kernel(which: int = 0):
    """A compiled kernel (0: rotation, 1: key dequantization, 2: value dequantization), or ``None`` if numba is missing/disabled/failed (then
    the reason is logged once)."""
    kernels = _state.get("kernel")
    if kernels is not None or "failed" in _state:
        return kernels[which] if kernels is not None else None
    with _lock:
        if "kernel" in _state or "failed" in _state:
            kernels = _state.get("kernel")
            return kernels[which] if kernels is not None else None
        if os.environ.get("AGENTMEM_FUSED_ROPE", "1") == "0":
            _state["failed"] = "disabled by AGENTMEM_FUSED_ROPE=0"
            return None
        try:
            try:
                kernels = _build_kernel()
            except RuntimeError:  # numba found no writable place for its on-disk cache: compile in memory
                kernels = _build_kernel(cache=False)
            # Compile (or load numba's on-disk cache) now, on a tiny problem, so a failure surfaces here once.
            probe = np.zeros(8, dtype=np.float32)
            one = np.ones(1, dtype=np.int64)
            cos2, sin = np.ones((1, 4), np.float32), np.zeros((1, 2), np.float32)
            kernels[0](probe, 0, one, one, np.ones((1, 2, 4), np.float32), cos2, sin)
            codes, scale = np.zeros((1, 2, 2), np.uint8), np.ones((1, 2, 4), np.float32)
            kernels[1](probe, 0, one, one, codes, 4, scale, scale, 1, cos2, sin, True)
            kernels[2](probe, 0, one, one, codes, 4, scale, scale, 1, False)
        except Exception as exc:  # ImportError, or a numba/LLVM failure on an unusual platform
            _state["failed"] = f"{type(exc).__name__}: {exc}"
            log.warning("fused key re-rotation unavailable, mounting with torch ops (%s)", _state["failed"])
            return None
        _state["kernel"] = kernels
        return kernels[which]


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
    if not _rows_ok(out):
        return False
    return _kernel(0) is not None


def _rows_ok(out: torch.Tensor) -> bool:
    return out.stride(-1) == 1 and (out.shape[-2] <= 1 or out.stride(-2) == out.shape[-1])


def fused_dequant_applies(out: torch.Tensor) -> bool:
    """Whether :func:`dequant_into` can write into ``out`` (CPU float32, rows contiguous, kernel available)."""
    if out.dtype != torch.float32 or out.device.type != "cpu" or out.dim() < 2 or out.numel() == 0:
        return False
    if out.requires_grad or not _rows_ok(out):
        return False
    return _kernel(1) is not None


def _out_args(out: torch.Tensor):
    storage = torch.as_strided(out, (out.untyped_storage().nbytes() // out.element_size(),), (1,), 0)
    lead = out.dim() - 2
    return (
        storage.numpy(),
        out.storage_offset(),
        np.array(out.shape[:lead] or (1,), dtype=np.int64),
        np.array(out.stride()[:lead] or (0,), dtype=np.int64),
    )


_NO_TABLE = np.zeros((1, 1), np.float32)


def dequant_into(
    out: torch.Tensor,
    codes: torch.Tensor,
    bits: int,
    scale: torch.Tensor,
    zero: torch.Tensor,
    *,
    token_group: int,
    channel_group: int,
    cos2: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    hadamard: bool = False,
) -> None:
    """``out = codes * scale + zero`` (rotated by ``cos2``/``sin`` when given), in one pass over the codes.

    ``hadamard`` (values only): each dequantized row is multiplied by the orthonormal Hadamard matrix, undoing the
    rotation :func:`agentmem.kv.quant.quantize_kv` applied before quantizing.

    ``codes`` ``[..., T, D*bits/8]`` uint8 packed as :mod:`agentmem.kv.quant` packs them; ``scale``/``zero``
    ``[..., ceil(T / token_group), ceil(D / channel_group)]`` float32. Call only where :func:`fused_dequant_applies`.

    Example:
        >>> dequant_into(dst, packed.key_codes, 4, packed.key_scales, packed.key_zeros,
        ...              token_group=32, channel_group=1, cos2=cos2, sin=sin)
    """
    tokens, width = codes.shape[-2], codes.shape[-1]
    blocks = codes.reshape(-1, tokens, width)
    blocks = (blocks if blocks.is_contiguous() else blocks.contiguous()).numpy()
    s = scale.reshape(-1, scale.shape[-2], scale.shape[-1]).contiguous().numpy()
    z = zero.reshape(-1, zero.shape[-2], zero.shape[-1]).contiguous().numpy()
    if channel_group == 1:  # keys: per channel, groups of tokens
        if hadamard:
            raise ValueError("only values (per-token groups of channels) carry a Hadamard rotation")
        rotate = cos2 is not None
        _kernel(1)(
            *_out_args(out), blocks, int(bits), s, z, int(token_group),
            cos2.reshape(-1, cos2.shape[-1]).numpy() if rotate else _NO_TABLE,
            sin.reshape(-1, sin.shape[-1]).numpy() if rotate else _NO_TABLE,
            rotate,
        )
    else:
        if token_group != 1 or cos2 is not None:
            raise ValueError("per-token groups of channels (values) are never rotated and have token_group 1")
        _kernel(2)(*_out_args(out), blocks, int(bits), s, z, int(channel_group), bool(hadamard))


def rotate_into(out: torch.Tensor, keys: torch.Tensor, cos2: torch.Tensor, sin: torch.Tensor) -> None:
    """``out = keys`` rotated by the tables (``cos2 = cat(cos, cos)`` and ``sin``; ``[T, ·]`` or one row for all).

    Call only where :func:`fused_rotation_applies`. ``out`` may be a strided view (rows contiguous) into a larger
    buffer; it must not overlap ``keys``.
    """
    kernel = _kernel(0)
    tokens, dim = keys.shape[-2], keys.shape[-1]
    blocks = keys.reshape(-1, tokens, dim)  # a view for the contiguous keys we mount; a copy otherwise
    if not blocks.is_contiguous():
        blocks = blocks.contiguous()
    kernel(
        *_out_args(out),
        blocks.numpy(),
        cos2.reshape(-1, cos2.shape[-1]).numpy(),
        sin.reshape(-1, sin.shape[-1]).numpy(),
    )
