"""The one adapter to transformers' cache API (v5: ``cache.layers[i].keys``/``.values``, ``DynamicCache``).

Everything else in agentmem handles KV as plain tensors: **stacked** ``[layers, batch, kv_heads, tokens, head_dim]``
keys and values. This module turns those into a cache a model forward accepts and back.

``BufferedCache`` is a ``DynamicCache`` whose layers write into preallocated buffers instead of concatenating on
every update: mounting writes entries straight into the buffer, the suffix prefill and each decoded token append in
place, and nothing is copied per step. (A stock ``DynamicCache`` re-copies the whole cache for every new token.)

Example:
    >>> keys = torch.zeros(2, 1, 2, 5, 16); values = torch.zeros_like(keys)
    >>> cache = cache_from_stacked(keys, values, capacity=64)
    >>> cache_length(cache)
    5
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from agentmem.kv.rope import rerotate_keys

__all__ = [
    "BufferedCache",
    "allocate_stacked",
    "cache_from_layers",
    "cache_from_stacked",
    "cache_layers",
    "cache_length",
    "crop_cache",
    "empty_cache",
    "new_dynamic_cache",
    "remove_cache_span",
    "rerotate_cache",
    "stacked_from_cache",
    "write_positions",
]


class _BufferLayer(DynamicLayer):
    """A DynamicLayer backed by a buffer with spare capacity along the token axis; grows by doubling."""

    def __init__(self, kbuf: torch.Tensor, vbuf: torch.Tensor, length: int) -> None:
        super().__init__()
        self._adopt(kbuf, vbuf, length)

    def _adopt(self, kbuf: torch.Tensor, vbuf: torch.Tensor, length: int) -> None:
        self._kbuf, self._vbuf, self._len = kbuf, vbuf, length
        self.device = kbuf.device
        self.is_initialized = True
        self._sync()

    def _sync(self) -> None:
        self.keys = self._kbuf[..., : self._len, :]
        self.values = self._vbuf[..., : self._len, :]

    @property
    def capacity(self) -> int:
        return self._kbuf.shape[-2]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass  # buffers exist from construction

    def _grow(self, needed: int) -> None:
        cap = max(needed, 2 * self.capacity, 16)
        shape = (*self._kbuf.shape[:-2], cap, self._kbuf.shape[-1])
        kbuf = self._kbuf.new_empty(shape)
        vbuf = self._vbuf.new_empty((*self._vbuf.shape[:-2], cap, self._vbuf.shape[-1]))
        kbuf[..., : self._len, :].copy_(self.keys)
        vbuf[..., : self._len, :].copy_(self.values)
        self._kbuf, self._vbuf = kbuf, vbuf

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n = key_states.shape[-2]
        if self._len + n > self.capacity:
            self._grow(self._len + n)
        self._kbuf[..., self._len : self._len + n, :].copy_(key_states)
        self._vbuf[..., self._len : self._len + n, :].copy_(value_states)
        self._len += n
        self._sync()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._len

    def set_length(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot set cache length {length} (have {self._len})")
        self._len = length
        self._sync()

    def crop(self, tokens_to_remove: int) -> None:
        # Same contract as DynamicLayer.crop: a negative count of tokens to drop from the end.
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        self.set_length(max(0, self._len + tokens_to_remove))

    def reset(self) -> None:
        self.set_length(0)

    # Batch reshaping replaces the tensors; re-adopt the result as a full buffer so later appends still work.
    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._adopt(self.keys.contiguous(), self.values.contiguous(), self.keys.shape[-2])

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._adopt(self.keys.contiguous(), self.values.contiguous(), self.keys.shape[-2])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self._adopt(self.keys.contiguous(), self.values.contiguous(), self.keys.shape[-2])


class BufferedCache(DynamicCache):
    """A DynamicCache over stacked buffers ``[L, B, H, capacity, D]``; the first ``length`` tokens are valid."""

    def __init__(self, kbuf: torch.Tensor, vbuf: torch.Tensor, length: int) -> None:
        # Bypass DynamicCache.__init__ (it builds its own layers); Cache.__init__ takes ready layers.
        Cache.__init__(self, layers=[_BufferLayer(kbuf[i], vbuf[i], length) for i in range(kbuf.shape[0])])


def allocate_stacked(
    num_layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int, *, dtype: torch.dtype, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised stacked key/value buffers ``[L, B, H, capacity, D]``."""
    shape = (num_layers, batch, kv_heads, capacity, head_dim)
    return torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device)


def cache_from_stacked(
    keys: torch.Tensor, values: torch.Tensor, *, capacity: int | None = None, length: int | None = None, copy=True
) -> BufferedCache:
    """A cache holding stacked ``keys``/``values`` ``[L, B, H, T, D]``.

    ``copy=True`` copies into fresh buffers of ``capacity`` tokens (default T + 64). ``copy=False`` adopts the given
    tensors as the buffers themselves (zero-copy; their first ``length`` tokens are valid, the rest is spare room),
    so the cache writes into them: pass tensors you own.
    """
    if keys.dim() != 5 or keys.shape != values.shape:
        raise ValueError(f"expected stacked [L,B,H,T,D] keys and values of one shape, got {keys.shape}/{values.shape}")
    n = keys.shape[-2] if length is None else length
    if not copy:
        return BufferedCache(keys, values, n)
    cap = max(capacity if capacity is not None else n + 64, n)
    kbuf, vbuf = allocate_stacked(*keys.shape[:3], cap, keys.shape[-1], dtype=keys.dtype, device=keys.device)
    kbuf[..., :n, :].copy_(keys[..., :n, :])
    vbuf[..., :n, :].copy_(values[..., :n, :])
    return BufferedCache(kbuf, vbuf, n)


def empty_cache(
    num_layers: int, kv_heads: int, head_dim: int, *, capacity: int, dtype: torch.dtype, device=None, batch: int = 1
) -> BufferedCache:
    """An empty cache with room for ``capacity`` tokens (grows beyond if needed)."""
    kbuf, vbuf = allocate_stacked(num_layers, batch, kv_heads, capacity, head_dim, dtype=dtype, device=device)
    return BufferedCache(kbuf, vbuf, 0)


def new_dynamic_cache() -> DynamicCache:
    """An empty stock ``DynamicCache`` whose layers appear as the model fills them."""
    return DynamicCache()


def cache_from_layers(layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A stock ``DynamicCache`` from per-layer ``(keys, values)`` of shape ``[B, H, T, D]``."""
    return DynamicCache(ddp_cache_data=[(k, v) for k, v in layers])


def cache_layers(cache: Cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer ``(keys, values)`` views ``[B, H, T, D]`` of any v5 cache (no copy)."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def cache_length(cache: Cache) -> int:
    """Number of cached tokens (layer 0)."""
    return int(cache.get_seq_length())


def stacked_from_cache(
    cache: Cache, start: int = 0, end: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy tokens ``[start, end)`` of every layer into new contiguous stacked tensors ``[L, B, H, T, D]``."""
    layers = cache_layers(cache)
    keys = torch.stack([k[..., start:end, :] for k, _ in layers])
    values = torch.stack([v[..., start:end, :] for _, v in layers])
    return keys, values


def crop_cache(cache: Cache, length: int) -> None:
    """Keep only the first ``length`` tokens of every layer, in place."""
    current = cache_length(cache)
    if length > current or length < 0:
        raise ValueError(f"cannot crop a cache of {current} tokens to {length}")
    if length == current:
        return
    for layer in cache.layers:
        if isinstance(layer, _BufferLayer):
            layer.set_length(length)
        else:
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def write_positions(cache: Cache, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Overwrite tokens at ``positions`` (1-D long) of every layer with stacked ``keys``/``values`` [L,B,H,n,D]."""
    for i, (k, v) in enumerate(cache_layers(cache)):
        k.index_copy_(-2, positions, keys[i])
        v.index_copy_(-2, positions, values[i])


def rerotate_cache(cache: Cache, start: int, end: int, delta: int, inv_freq: torch.Tensor) -> None:
    """Re-position the keys of tokens ``[start, end)`` by ``delta`` in every layer, in place (slots unchanged)."""
    for layer in cache.layers:
        keys = layer.keys[..., start:end, :]
        keys.copy_(rerotate_keys(keys, delta, inv_freq, start=start))


def remove_cache_span(cache: Cache, start: int, end: int, inv_freq: torch.Tensor) -> None:
    """Delete tokens ``[start, end)`` from every layer; later tokens move left and are re-rotated to match.

    What a session manager needs to evict an old turn without re-encoding the rest. Example:
        >>> keys = torch.randn(2, 1, 2, 100, 16); values = torch.randn_like(keys)   # [L, B, H, T, D]
        >>> cache = cache_from_stacked(keys, values, capacity=128)
        >>> inv_freq = 1.0 / 10000 ** (torch.arange(0, 16, 2) / 16)
        >>> remove_cache_span(cache, 40, 90, inv_freq)   # 50 tokens gone, positions contiguous
        >>> cache_length(cache), torch.equal(cache.layers[0].values[0, :, 40:50], values[0, 0, :, 90:])
        (50, True)
    """
    n = cache_length(cache)
    if not 0 <= start <= end <= n:
        raise ValueError(f"span [{start}, {end}) is outside a cache of {n} tokens")
    width = end - start
    if width == 0:
        return
    for layer in cache.layers:
        tail_k = rerotate_keys(layer.keys[..., end:, :], -width, inv_freq, start=end)  # a new tensor: no aliasing
        tail_v = layer.values[..., end:, :].clone()
        if isinstance(layer, _BufferLayer):
            layer.keys[..., start : n - width, :].copy_(tail_k)
            layer.values[..., start : n - width, :].copy_(tail_v)
            layer.set_length(n - width)
        else:
            layer.keys = torch.cat([layer.keys[..., :start, :], tail_k], dim=-2)
            layer.values = torch.cat([layer.values[..., :start, :], tail_v], dim=-2)
