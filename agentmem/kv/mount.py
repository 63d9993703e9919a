"""Mount planning (what fits) and assembly (stored entries → one model cache at their new positions).

Assembly writes the preamble and each entry straight into stacked buffers ``[L, 1, H, capacity, D]``: values are
copied, keys are re-rotated from their encoded offset to their new offset *while* being copied (one fused pass
per entry over all layers and heads on CPU float32, see :mod:`agentmem.kv.rope_kernel`). The stored entries are
only read, never modified. The buffers then back a :class:`~agentmem.kv.cache.BufferedCache`, whose spare
capacity receives the question and the decoded tokens.

Example:
    >>> plan = plan_mount([40, 35, 90], preamble_len=14, suffix_len=20, max_new_tokens=64, max_positions=8192)
    >>> cache, spans = assemble(preamble_k, preamble_v, [e0, e1], inv_freq, capacity=400)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from agentmem.kv.cache import BufferedCache, allocate_stacked
from agentmem.kv.rope import rerotate_keys_into
from agentmem.kv.types import EncodedEntry

__all__ = ["Mount", "MountPlan", "Workspace", "assemble", "plan_mount"]


@dataclass
class MountPlan:
    """Indices (into the relevance-ordered input) to mount and to drop, and the new-token allowance."""

    keep: list[int]
    drop: list[int]
    max_new_tokens: int
    notes: list[str] = field(default_factory=list)
    memory_tokens: int = 0


def plan_mount(
    lengths: Sequence[int],
    *,
    preamble_len: int,
    suffix_len: int,
    max_new_tokens: int,
    max_positions: int,
    margin: int = 0,
    budget_tokens: int | None = None,
) -> MountPlan:
    """Keep the most relevant entries (a prefix of ``lengths``) that fit; drop the rest, least relevant first.

    Two limits apply: ``budget_tokens`` caps the mounted memory tokens, and the whole sequence (preamble + memories
    + suffix + ``max_new_tokens``) must stay within ``max_positions - margin``. If even the prompt without any
    memory leaves no room for ``max_new_tokens``, that allowance is reduced (and noted) rather than overflowing.
    """
    limit = max_positions - margin
    fixed = preamble_len + suffix_len
    notes: list[str] = []
    if fixed + max_new_tokens > limit:
        room = max(0, limit - fixed)
        notes.append(
            f"max_new_tokens reduced from {max_new_tokens} to {room}: the prompt alone nearly fills the context"
        )
        max_new_tokens = room
    room = limit - fixed - max_new_tokens
    if budget_tokens is not None:
        room = min(room, budget_tokens)
    keep: list[int] = []
    used = 0
    for i, n in enumerate(lengths):
        if used + n > room:
            break  # everything from here on (the less relevant tail) is dropped
        keep.append(i)
        used += n
    drop = list(range(len(keep), len(lengths)))
    if drop:
        notes.append(f"dropped {len(drop)} least relevant memories to fit {room} memory tokens")
    return MountPlan(keep=keep, drop=drop, max_new_tokens=max_new_tokens, notes=notes, memory_tokens=used)


class Workspace:
    """Reusable stacked KV buffers, grown on demand.

    Fresh large allocations cost page faults (~1 ms/MB measured on a shared CPU VM, i.e. ~90 ms for the 94 MB of a
    2,048-token SmolLM2 mount), which would dwarf the mount itself. ``KVEngine.generate`` reuses one workspace
    because its caches never outlive the call; caches handed to callers use fresh buffers.
    """

    def __init__(self) -> None:
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def get(self, num_layers: int, kv_heads: int, capacity: int, head_dim: int, *, dtype, device):
        want = (num_layers, 1, kv_heads, head_dim)
        k = self._k
        if (
            k is None
            or (k.shape[0], k.shape[1], k.shape[2], k.shape[4]) != want
            or k.shape[3] < capacity
            or k.dtype != dtype
            or k.device != torch.device(device)
        ):
            # Round up so a slightly longer prompt next time does not reallocate.
            cap = max(capacity, int(capacity * 1.25) + 64)
            self._k, self._v = allocate_stacked(num_layers, 1, kv_heads, cap, head_dim, dtype=dtype, device=device)
        return self._k[..., :capacity, :], self._v[..., :capacity, :]

    def release(self) -> None:
        self._k = self._v = None


class Mount:
    """A cache being assembled: the preamble first, then entries placed one at a time at the next positions.

    Placing an entry copies it (values) or re-rotates it while copying (keys); nothing keeps a reference to the
    entry afterwards, so a caller may load the next entry into the same buffer it used for the last one.
    """

    def __init__(
        self,
        preamble_keys: torch.Tensor,
        preamble_values: torch.Tensor,
        inv_freq: torch.Tensor | None,
        *,
        capacity: int,
        workspace: Workspace | None = None,
    ) -> None:
        num_layers, _, kv_heads, pre_len, head_dim = preamble_keys.shape
        self.shape = (num_layers, kv_heads, head_dim)
        self.dtype, self.device = preamble_keys.dtype, preamble_keys.device
        capacity = max(capacity, pre_len)
        if workspace is not None:
            kbuf, vbuf = workspace.get(num_layers, kv_heads, capacity, head_dim, dtype=self.dtype, device=self.device)
        else:
            kbuf, vbuf = allocate_stacked(
                num_layers, 1, kv_heads, capacity, head_dim, dtype=self.dtype, device=self.device
            )
        kbuf[..., :pre_len, :].copy_(preamble_keys)
        vbuf[..., :pre_len, :].copy_(preamble_values)
        self.kbuf, self.vbuf, self.pos, self.inv_freq = kbuf, vbuf, pre_len, inv_freq
        self.spans: list[tuple[int, int]] = []

    def place(self, entry: EncodedEntry) -> tuple[int, int]:
        """Put ``entry`` at the next free positions; returns its ``(start, end)`` span."""
        num_layers, kv_heads, head_dim = self.shape
        n, pos = entry.num_tokens, self.pos
        if tuple(entry.keys.shape) != (num_layers, kv_heads, n, head_dim):
            raise ValueError(f"entry KV shape {tuple(entry.keys.shape)} does not match the model's cache layout")
        if pos + n > self.kbuf.shape[3]:
            raise ValueError(f"mount capacity {self.kbuf.shape[3]} exceeded; plan the capacity before placing")
        # Same device: keep the stored dtype, the copy/rotation below casts while writing (no extra pass).
        keys = entry.keys.to(device=self.device)
        dst_k = self.kbuf[:, 0, :, pos : pos + n, :]
        delta = pos - entry.offset
        if delta == 0:
            dst_k.copy_(keys)
        else:
            if self.inv_freq is None:
                raise ValueError("entries need re-rotation but the model has no rotary frequencies")
            rerotate_keys_into(dst_k, keys, delta, self.inv_freq, start=entry.offset)
        self.vbuf[:, 0, :, pos : pos + n, :].copy_(entry.values)
        self.spans.append((pos, pos + n))
        self.pos = pos + n
        return pos, pos + n

    def cache(self) -> BufferedCache:
        """The cache over everything placed so far (its spare capacity receives later tokens)."""
        return BufferedCache(self.kbuf, self.vbuf, self.pos)


def assemble(
    preamble_keys: torch.Tensor,
    preamble_values: torch.Tensor,
    entries: Sequence[EncodedEntry],
    inv_freq: torch.Tensor | None,
    *,
    capacity: int,
    workspace: Workspace | None = None,
) -> tuple[BufferedCache, list[tuple[int, int]]]:
    """Build a cache: preamble ``[L, 1, H, P, D]`` then each entry at the next free positions.

    Returns the cache and each entry's ``(start, end)`` span. ``inv_freq`` may be ``None`` only if no entry needs
    moving. Raises ``ValueError`` if an entry's shape does not match the preamble's.
    """
    total = preamble_keys.shape[3] + sum(e.num_tokens for e in entries)
    mount = Mount(preamble_keys, preamble_values, inv_freq, capacity=max(capacity, total), workspace=workspace)
    for entry in entries:
        mount.place(entry)
    return mount.cache(), mount.spans
