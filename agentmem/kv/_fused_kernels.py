"""The numba kernels behind :mod:`agentmem.kv.rope_kernel` (imported only on the first mount: numba is heavy).

Why a module of their own: numba's on-disk cache (``cache=True``) only works for module-level functions. As
closures built inside a function, every process compiled all three kernels again (~6 s on the dev VM, 12 s
loaded) on its first mount of a quantized blob; at module level the compiled code is loaded from ``__pycache__``.
``AGENTMEM_NUMBA_CACHE=0`` compiles in memory (for a read-only install, see ``rope_kernel._kernel``).
"""

from __future__ import annotations

import os

import numba
import numpy as np
from numba.core import config as _numba_config
from numba.core.compiler_lock import global_compiler_lock

_CACHE = os.environ.get("AGENTMEM_NUMBA_CACHE", "1") != "0"


def _slp(dispatcher):
    """Compile ``dispatcher`` (every signature, also on a numba cache miss) with LLVM's SLP vectorizer on.

    numba runs LLVM's loop vectorizer but leaves the SLP (straight-line) vectorizer off by default
    (``numba.core.config.SLP_VECTORIZE = 0``). The 3-bit Hadamard value kernel is straight-line 8-lane code
    (``fwht8`` over eight columns, ``store_column``): without SLP every add was scalar (no ``<8 x float>`` in
    its IR). With SLP, same floats bit for bit, 172,032 rows on one thread: see docs/kv-compression.md
    (session 6). The switch is flipped only around this dispatcher's compiles, under numba's compiler lock, so
    nothing else compiled in the process changes. A kernel loaded from numba's on-disk cache is the machine
    code compiled here, so it is vectorised as well.
    """
    compile_ = dispatcher.compile

    def compile(sig):
        with global_compiler_lock:
            before = _numba_config.SLP_VECTORIZE
            _numba_config.SLP_VECTORIZE = 1
            try:
                return compile_(sig)
            finally:
                _numba_config.SLP_VECTORIZE = before

    dispatcher.compile = compile
    return dispatcher


def _had3_tables() -> np.ndarray:
    """``[3, 256, 8]``: for a byte value v, fwht8 (unnormalised Sylvester H_8) over rows a of the 3-bit codes that
    byte contributes to one column of a 64-value row: [0] low bits of the even rows (a = 0, 2, 4, 6: bits 2 * (a // 2)),
    [1] of the odd rows, [2] the high bits (bit a, weight 4). numba freezes it into the kernel as a constant."""
    v = np.arange(256)[:, None]
    a = np.arange(8)[None, :]
    lo = (v >> (2 * (a // 2))) & 3
    parts = [np.where(a % 2 == 0, lo, 0), np.where(a % 2 == 1, lo, 0), 4 * ((v >> a) & 1)]
    k = np.arange(8)
    sign = (-1.0) ** np.array([[bin(i & j).count("1") for j in range(8)] for i in k])  # H_8[k, a]
    return np.stack([p @ sign.T for p in parts]).astype(np.float32)


_HAD3 = _had3_tables()



@numba.njit(boundscheck=False, nogil=True, cache=_CACHE, inline="always")
def block_base(b, offset, lead_sizes, lead_strides):  # pragma: no cover - compiled
    # block index -> the storage offset of its [T, D] rows, through the output's leading sizes and strides
    base = offset
    rest = b
    for j in range(lead_sizes.shape[0] - 1, -1, -1):
        base += (rest % lead_sizes[j]) * lead_strides[j]
        rest //= lead_sizes[j]
    return base

@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=_CACHE, inline="always")
def rotate_row(dst, src, c, s, half, dim):  # pragma: no cover - compiled
    for i in range(half):
        x1 = src[i]
        x2 = src[i + half]
        dst[i] = x1 * c[i] - x2 * s[i]
        dst[i + half] = x2 * c[i] + x1 * s[i]
    for i in range(2 * half, dim):  # partial rotary: the tail dims carry no position
        dst[i] = src[i]

@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=_CACHE)
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

@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=_CACHE, inline="always")
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

@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=_CACHE, inline="always")
def fwht8(x0, x1, x2, x3, x4, x5, x6, x7):  # pragma: no cover - compiled
    # H_8 (x0..x7), unnormalised, Sylvester order: three butterfly stages on registers
    x0, x1, x2, x3, x4, x5, x6, x7 = x0 + x1, x0 - x1, x2 + x3, x2 - x3, x4 + x5, x4 - x5, x6 + x7, x6 - x7
    x0, x1, x2, x3, x4, x5, x6, x7 = x0 + x2, x1 + x3, x0 - x2, x1 - x3, x4 + x6, x5 + x7, x4 - x6, x5 - x7
    return x0 + x4, x1 + x5, x2 + x6, x3 + x7, x0 - x4, x1 - x5, x2 - x6, x3 - x7

@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=_CACHE, inline="always")
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
        hadamard_pass2_64(dst, row, np.float32(0.125))
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

@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=_CACHE, inline="always")
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

@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=_CACHE)
def dequant_keys(out, bases, codes, bits, scale, zero, group, cos2, sin, rotate):
    # pragma: no cover - compiled. Keys: codes [B, T, W] uint8 -> floats (one scale/zero per channel, per
    # ``group`` tokens: scale/zero [B, ceil(T / group), D]) -> rotated by cos2/sin (as in rotate_rows).
    blocks, tokens, width = codes.shape
    dim = (width * 8) // bits
    half = sin.shape[1]
    per_token = sin.shape[0] > 1
    row = np.empty(dim, dtype=np.float32)
    for b in range(blocks):
        base = bases[b]
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

@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=_CACHE)
def dequant_keys4(out, bases, codes, scale, zero, group, cos2, sin):
    # pragma: no cover - compiled. 4-bit keys with full rotary (D = 2 * half): byte j holds element j (low
    # nibble) and j + D/2 (high nibble), exactly RoPE's pair, so unpacking, scaling and rotating are one loop
    # over the bytes (~2x dequant_keys). Halves are sliced so no index is computed from a runtime width (numba
    # adds a wraparound check to such an index, which stops LLVM vectorising).
    blocks, tokens, width = codes.shape
    per_token = sin.shape[0] > 1
    for b in range(blocks):
        base = bases[b]
        for t in range(tokens):
            src = codes[b, t]
            g = t // group
            s1, s2, z1, z2 = scale[b, g, :width], scale[b, g, width:], zero[b, g, :width], zero[b, g, width:]
            r = t if per_token else 0
            c, sn = cos2[r, :width], sin[r]
            at = base + t * 2 * width
            d1, d2 = out[at : at + width], out[at + width : at + 2 * width]
            for j in range(width):
                v = np.int32(src[j])
                x1 = np.float32(v & 15) * s1[j] + z1[j]
                x2 = np.float32(v >> 4) * s2[j] + z2[j]
                d1[j] = x1 * c[j] - x2 * sn[j]
                d2[j] = x2 * c[j] + x1 * sn[j]

@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=_CACHE, inline="always")
def hadamard_pass2_64(dst, row, scale):  # pragma: no cover - compiled
    # hadamard_row's second pass for D = 64 (on registers, transposed into dst), times ``scale``
    for r in range(8):
        store_column(dst, r, scale, fwht8(row[8 * r], row[8 * r + 1], row[8 * r + 2], row[8 * r + 3],
                                          row[8 * r + 4], row[8 * r + 5], row[8 * r + 6], row[8 * r + 7]))


@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=_CACHE, inline="always")
def store_column(dst, r, scale, y):  # pragma: no cover - compiled
    # dst[8k + r] = y[k] * scale: one column of the 8x8 output
    dst[r] = y[0] * scale
    dst[8 + r] = y[1] * scale
    dst[16 + r] = y[2] * scale
    dst[24 + r] = y[3] * scale
    dst[32 + r] = y[4] * scale
    dst[40 + r] = y[5] * scale
    dst[48 + r] = y[6] * scale
    dst[56 + r] = y[7] * scale

@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=_CACHE, inline="always")
def unpack3_row64(dst, src, sg, zg):  # pragma: no cover - compiled
    # dst = codes * sg + zg for one 3-bit row of 64 (24 bytes), constant trip counts and offsets
    for k in range(4):
        for j in range(16):
            i = k * 16 + j
            c = ((np.int32(src[j]) >> (2 * k)) & 3) | (((np.int32(src[16 + (i & 7)]) >> (i >> 3)) & 1) << 2)
            dst[i] = np.float32(c) * sg + zg

@_slp
@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=_CACHE)
def dequant_values3(out, bases, codes, scale, zero, hadamard):
    # pragma: no cover - compiled. 3-bit values, D = 64, one scale per row (k4v3h, k4v3hs ...): each element's
    # code is built from its two planes in ONE pass (element i = 16k + j: low bits in byte j, the high bit in
    # byte 16 + i % 8), ~2x faster than unpack_row's second read-modify-write pass over the row.
    # Two loop nests, not a branch per row: the branch alone cost ~1.4x (LLVM did not unswitch it).
    blocks, tokens, width = codes.shape
    if not hadamard:
        for b in range(blocks):
            base = bases[b]
            for t in range(tokens):
                at = base + t * 64
                unpack3_row64(out[at : at + 64], codes[b, t], scale[b, t, 0], zero[b, t, 0])
        return
    # With the rotation (hadamard_row's two passes): column c of the row as an 8x8 matrix (elements 8a + c) is
    # bytes c and 8 + c (the low bits of even and odd rows a) and 16 + c (bit a: the high bits), so the first
    # pass over column c is the sum of three table rows, one per byte value (_HAD3); that lays the column out
    # contiguously, so the second pass runs 8 rows side by side and stores 8 contiguous floats per output row.
    # Scale and zero come after the rotation (linear: H(s * c + z) = s * H(c) + z * H(1), H(1) = 8 at element 0).
    # The sums are of small integers, exact in float32: the same floats as hadamard_row computes.
    xt = np.empty((8, 8), dtype=np.float32)
    for b in range(blocks):
        base = bases[b]
        for t in range(tokens):
            src = codes[b, t]
            for c in range(8):
                tp, tq, th = _HAD3[0, src[c]], _HAD3[1, src[8 + c]], _HAD3[2, src[16 + c]]
                col = xt[c]
                for k in range(8):
                    col[k] = tp[k] + tq[k] + th[k]
            sg = scale[b, t, 0] * np.float32(0.125)
            at = base + t * 64
            dst = out[at : at + 64]
            for r in range(8):
                store_column(dst, r, sg, fwht8(xt[0, r], xt[1, r], xt[2, r], xt[3, r], xt[4, r], xt[5, r],
                                               xt[6, r], xt[7, r]))
            dst[0] += zero[b, t, 0] * np.float32(8.0)


@numba.njit(fastmath=True, boundscheck=False, nogil=True, cache=_CACHE)
def dequant_values(out, bases, codes, bits, scale, zero, group, hadamard):
    # pragma: no cover - compiled. Values: codes [B, T, W] uint8 -> floats, one scale/zero per token and
    # ``group`` channels (scale/zero [B, T, ceil(D / group)]), then rotated back by a Hadamard transform when
    # the codec rotated them before quantizing.
    blocks, tokens, width = codes.shape
    dim = (width * 8) // bits
    groups = (dim + group - 1) // group
    row = np.empty(dim, dtype=np.float32)
    tmp = np.empty(dim, dtype=np.float32)
    for b in range(blocks):
        base = bases[b]
        for t in range(tokens):
            unpack_row(row, codes[b, t], bits)
            s = scale[b, t]
            z = zero[b, t]
            at = base + t * dim
            dst = out[at : at + dim]
            if groups == 1:  # one scale per row (every registered codec): a flat loop that LLVM vectorises
                sg = s[0]
                zg = z[0]
                if hadamard:
                    for i in range(dim):
                        row[i] = row[i] * sg + zg
                    hadamard_row(dst, row, tmp, dim)
                else:
                    for i in range(dim):
                        dst[i] = row[i] * sg + zg
                continue
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


__all__ = ["dequant_keys", "dequant_keys4", "dequant_values", "dequant_values3", "rotate_rows"]
