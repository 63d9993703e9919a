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
    >>> from agentmem.kv.rope import rerotate_keys, rotation_tables
    >>> keys, inv_freq = torch.randn(2, 5, 64), 1.0 / 10000 ** (torch.arange(0, 64, 2) / 64)
    >>> cos, sin = rotation_tables(17, inv_freq, torch.float32, start=0, length=5)   # move 17 positions on
    >>> out = torch.empty_like(keys)
    >>> if fused_rotation_applies(out, keys):       # False where numba is missing: then the torch path runs
    ...     rotate_into(out, keys, torch.cat((cos, cos), dim=-1), sin)
    ... else:
    ...     out = rerotate_keys(keys, 17, inv_freq, start=0)
    >>> torch.allclose(out, rerotate_keys(keys, 17, inv_freq, start=0), atol=1e-5)
    True
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

import numpy as np
import torch

__all__ = ["dequant_into", "dequant_runs_into", "fused_dequant_applies", "fused_rotation_applies",
           "kernels_available", "rotate_into"]

log = logging.getLogger(__name__)

_state: dict[str, object] = {}  # "kernel": the compiled function, or "failed": the reason it is unavailable
_lock = threading.Lock()


def _build_kernel(cache: bool = True):
    """The compiled kernels (rotation, key dequantization, value dequantization), from ``_fused_kernels``."""
    import importlib

    if not cache:  # no writable place for numba's cache: compile in memory
        os.environ["AGENTMEM_NUMBA_CACHE"] = "0"
    from agentmem.kv import _fused_kernels  # heavy (numba, ~0.3 s): imported on the first mount only

    if not cache and _fused_kernels._CACHE:
        _fused_kernels = importlib.reload(_fused_kernels)
    return (_fused_kernels.rotate_rows, _fused_kernels.dequant_keys, _fused_kernels.dequant_values,
            _fused_kernels.dequant_keys4, _fused_kernels.dequant_values3)


def _kernel(which: int = 0):
    """A compiled kernel (0: rotation, 1: key dequantization, 2: value dequantization, 3: 4-bit keys with full
    rotary, 4: 3-bit values of 64 channels), or ``None`` if numba is missing/disabled/failed (then the reason is
    logged once)."""
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
            base = np.zeros(1, dtype=np.int64)
            kernels[1](probe, base, codes, 4, scale, scale, 1, cos2, sin, True)
            kernels[2](probe, base, codes, 4, scale, scale, 1, False)
            kernels[3](probe, base, np.zeros((1, 1, 2), np.uint8), scale, scale, 1, cos2, sin)
            kernels[4](np.zeros(64, np.float32), base, np.zeros((1, 1, 24), np.uint8),
                       np.ones((1, 1, 1), np.float32), np.zeros((1, 1, 1), np.float32), True)
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


def kernels_available() -> bool:
    """Whether the fused kernels can run: False when numba is missing or disabled (the torch paths then serve). The
    first call compiles them, or loads them from numba's on-disk cache (~1 s in a new process); ``KVEngine.warmup``
    makes it, so no request pays for it.

    Example:
        >>> kernels_available() == (_kernel(1) is not None)
        True
    """
    return _kernel(0) is not None


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


# Memos for _storage (a mount writes dozens of entries into the same two buffers): float32 arrays over a storage,
# keyed by its address and size, and the block offsets of a view layout. The arrays hold no reference to the
# storage (built from its address), so a released workspace is freed; they are only used while a tensor that
# owns exactly that address and size is being written, so a reused address is the same memory, correctly typed.
_ARRAYS: dict[tuple[int, int], np.ndarray] = {}
_GRIDS: dict[tuple, np.ndarray] = {}


def _storage(out: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``out``'s whole storage as a 1-D array, and the storage offset of each of its ``[T, D]`` row blocks (the
    leading dims flattened in order): what the dequantization kernels write through. ``out`` is float32."""
    store = out.untyped_storage()
    key = (store.data_ptr(), store.nbytes())
    array = _ARRAYS.get(key)
    if array is None:
        if len(_ARRAYS) >= 8:
            _ARRAYS.clear()
        array = _ARRAYS[key] = np.ctypeslib.as_array((ctypes.c_float * (key[1] // 4)).from_address(key[0]))
    layout = (out.shape[:-2], out.stride()[:-2])
    grid = _GRIDS.get(layout)
    if grid is None:
        grid = np.zeros(1, dtype=np.int64)
        for size, stride in zip(*layout):
            grid = (grid[:, None] + np.arange(size, dtype=np.int64) * stride).reshape(-1)
        if len(_GRIDS) >= 64:
            _GRIDS.clear()
        _GRIDS[layout] = grid
    return array, grid + out.storage_offset()


def _dequant(storage: np.ndarray, bases: np.ndarray, blocks: np.ndarray, bits: int, s: np.ndarray, z: np.ndarray,
             token_group: int, channel_group: int, cos2: np.ndarray | None, sin: np.ndarray | None,
             hadamard: bool) -> None:
    """:func:`dequant_into` on arrays: codes ``[B, T, W]``, scales ``[B, G, ·]``, one storage offset per block."""
    width = blocks.shape[-1]
    if channel_group == 1:  # keys: per channel, groups of tokens
        if hadamard:
            raise ValueError("only values (per-token groups of channels) carry a Hadamard rotation")
        rotate = cos2 is not None
        if rotate and bits == 4 and sin.shape[-1] == width:  # full rotary (half = D/2): the one-loop 4-bit kernel
            _kernel(3)(storage, bases, blocks, s, z, int(token_group), cos2, sin)
            return
        _kernel(1)(storage, bases, blocks, int(bits), s, z, int(token_group), cos2 if rotate else _NO_TABLE,
                   sin if rotate else _NO_TABLE, rotate)
        return
    if token_group != 1 or cos2 is not None:
        raise ValueError("per-token groups of channels (values) are never rotated and have token_group 1")
    if bits == 3 and width == 24 and s.shape[-1] == 1:  # 3-bit rows of 64, one scale: the one-pass kernel
        _kernel(4)(storage, bases, blocks, s, z, bool(hadamard))
        return
    _kernel(2)(storage, bases, blocks, int(bits), s, z, int(channel_group), bool(hadamard))


def _blocks(a: np.ndarray) -> np.ndarray:
    """``[..., X, Y]`` as ``[B, X, Y]``, C-contiguous (a view for the contiguous arrays a mount reads)."""
    return np.ascontiguousarray(a.reshape(-1, a.shape[-2], a.shape[-1]))


def _table(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else np.ascontiguousarray(t.reshape(-1, t.shape[-1]).numpy())


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
        >>> from agentmem.kv.quant import CODECS, dequantize_kv, quantize_kv
        >>> keys = torch.randn(2, 1, 40, 64)                   # [layers, KV heads, tokens, head dim]
        >>> packed = quantize_kv(keys, keys, CODECS["int4"])    # 4-bit keys: a scale per channel per 32 tokens
        >>> out, (reference, _) = torch.empty_like(keys), dequantize_kv(packed)     # the torch path
        >>> if fused_dequant_applies(out):                    # False where numba is missing
        ...     dequant_into(out, packed.key_codes, 4, packed.key_scales.float(), packed.key_zeros.float(),
        ...                  token_group=32, channel_group=1)
        ... else:
        ...     out = reference
        >>> torch.allclose(out, reference, atol=1e-5)
        True
    """
    _dequant(*_storage(out), _blocks(codes.numpy()), bits, _blocks(scale.numpy()), _blocks(zero.numpy()),
             token_group, channel_group, _table(cos2), _table(sin), hadamard)


def dequant_runs_into(
    dst_keys: torch.Tensor,
    dst_values: torch.Tensor,
    runs: list[tuple[int, int, np.ndarray, int, np.ndarray, np.ndarray, np.ndarray, int, np.ndarray, np.ndarray]],
    *,
    key_group: int,
    value_group: int,
    cos2: torch.Tensor | None,
    sin: torch.Tensor | None,
    hadamard: bool,
) -> None:
    """One entry's keys and values, run by run of layers with one bit width, into ``dst_*`` (``[L, H, T, D]``).

    ``runs``: ``(first, stop, key codes, key bits, key scales, key zeros, value codes, value bits, value scales,
    value zeros)`` as arrays over layers ``first:stop``. The same kernels as :func:`dequant_into`, with each
    buffer's storage and block offsets found once per entry rather than once per run and tensor: a mount places
    a few dozen entries, and that glue cost ~0.2 ms per entry (~10 % of a 2,048-token ``k4v3hsl`` mount).

    Example (one run of 3 layers, 4-bit keys and Hadamard-rotated 4-bit values):
        >>> from agentmem.kv.quant import CODECS, dequantize_kv, quantize_kv
        >>> packed = quantize_kv(torch.randn(3, 1, 8, 64), torch.randn(3, 1, 8, 64), CODECS["int4h"])
        >>> ks, kz, vs, vz = (t.float().numpy() for t in (packed.key_scales, packed.key_zeros, packed.value_scales,
        ...                                               packed.value_zeros))
        >>> run = (0, 3, packed.key_codes.numpy(), 4, ks, kz, packed.value_codes.numpy(), 4, vs, vz)
        >>> kdst, vdst = torch.empty(3, 1, 8, 64), torch.empty(3, 1, 8, 64)
        >>> if fused_dequant_applies(kdst):                   # False where numba is missing
        ...     dequant_runs_into(kdst, vdst, [run], key_group=64, value_group=64, cos2=None, sin=None, hadamard=True)
        ... else:
        ...     kdst, vdst = dequantize_kv(packed)
        >>> all(torch.allclose(a, b, atol=1e-5) for a, b in zip((kdst, vdst), dequantize_kv(packed)))
        True
    """
    kout, kbases = _storage(dst_keys)
    vout, vbases = _storage(dst_values)
    heads = dst_keys.shape[1]
    c2, sn = _table(cos2), _table(sin)
    for lo, hi, kc, kb, ks, kz, vc, vb, vs, vz in runs:
        _dequant(kout, kbases[lo * heads : hi * heads], _blocks(kc), kb, _blocks(ks), _blocks(kz), key_group, 1,
                 c2, sn, False)
        _dequant(vout, vbases[lo * heads : hi * heads], _blocks(vc), vb, _blocks(vs), _blocks(vz), 1, value_group,
                 None, None, hadamard)


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
