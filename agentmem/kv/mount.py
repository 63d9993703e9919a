"""Mount planning (what fits) and assembly (stored entries → one model cache at their new positions).

Assembly writes the preamble and each entry straight into stacked buffers ``[L, 1, H, capacity, D]``: values are
copied, keys are re-rotated from their encoded offset to their new offset *while* being copied (one fused pass
per entry over all layers and heads on CPU float32, see :mod:`agentmem.kv.rope_kernel`). The stored entries are
only read, never modified. The buffers then back a :class:`~agentmem.kv.cache.BufferedCache`, whose spare
capacity receives the question and the decoded tokens.

Example:
    >>> from agentmem.kv.engine import KVEngine
    >>> from agentmem.kv.rope import rotary_inv_freq
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> engine = KVEngine(*tiny_causal_lm("llama"))
    >>> e0, e1 = engine.encode("Alice likes tea."), engine.encode("Bob likes coffee.")
    >>> preamble_k = preamble_v = torch.zeros(2, 1, 2, e0.offset, 16)   # [L, B, H, preamble tokens, D]
    >>> cache, spans = assemble(preamble_k, preamble_v, [e0, e1], rotary_inv_freq(engine.model), capacity=400)
    >>> spans == [(e0.offset, e0.offset + e0.num_tokens), (spans[0][1], spans[0][1] + e1.num_tokens)]
    True
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from agentmem.kv.cache import BufferedCache, allocate_stacked
from agentmem.kv.quant import QuantizedEntry, place_packed
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
    """Keep entries in relevance order (``lengths`` is best first) while they fit; an entry that does not fit in
    the room left is dropped and the next ones are still tried, so one long memory (a 3,000-token tool result
    against the default 2,048-token budget) does not keep every shorter one out.

    Two limits apply: ``budget_tokens`` caps the mounted memory tokens, and the whole sequence (preamble + memories
    + suffix + ``max_new_tokens``) must stay within ``max_positions - margin``. If even the prompt without any
    memory leaves no room for ``max_new_tokens``, that allowance is reduced (and noted) rather than overflowing.

    Example:
        >>> plan = plan_mount([3000, 12, 40], preamble_len=20, suffix_len=30, max_new_tokens=256,
        ...                   max_positions=8192, budget_tokens=2048)
        >>> plan.keep, plan.drop, plan.memory_tokens
        ([1, 2], [0], 52)
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
    drop: list[int] = []
    used = 0
    for i, n in enumerate(lengths):
        if used + n > room:
            drop.append(i)
        else:
            keep.append(i)
            used += n
    if drop:
        notes.append(f"dropped {len(drop)} memories that did not fit in {room} memory tokens")
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


# Below this many key elements in all, a mount stays on one thread: handing work over costs more than it saves.
_SPLIT_MIN_ELEMENTS = 1 << 20
_helper: dict[int, ThreadPoolExecutor] = {}
_helper_lock = threading.Lock()


def _idle_cpus() -> int:
    """CPUs this process may run on that torch's intra-op threads leave free."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return cpus - torch.get_num_threads()


def _helper_thread() -> ThreadPoolExecutor | None:
    """One extra thread that places every other entry, or ``None`` when no CPU is idle.

    Placing KV is memory-bound and one core does not saturate the memory bus: on the dev VM two threads placed the
    94 MB of a 2,048-token mount in 10.4 ms instead of 15.5 ms. Only used when torch runs fewer intra-op threads than
    we have CPUs (e.g. ``torch.set_num_threads(1)`` on a 2-core machine); otherwise torch's own copies already use
    every core. ``AGENTMEM_MOUNT_THREADS=1`` turns it off. The fused rotation and torch's copies release the GIL.
    """
    if os.environ.get("AGENTMEM_MOUNT_THREADS", "") == "1" or _idle_cpus() < 1:
        return None
    pid = os.getpid()
    with _helper_lock:
        # Keyed by process: a forked child inherits the pool object but not its thread, and would wait forever.
        if pid not in _helper:
            _helper.clear()
            _helper[pid] = ThreadPoolExecutor(1, thread_name_prefix="agentmem-mount")
        return _helper[pid]


def _uploaded(jobs: list[tuple[EncodedEntry, int]], device: torch.device) -> list[tuple[EncodedEntry, int]]:
    """The jobs with host-side KV uploaded to ``device`` through pinned staging (:mod:`agentmem.kv.transfer`)."""
    from dataclasses import replace

    from agentmem.kv.transfer import staging

    # Quantized entries upload their codes (a fraction of the floats) and are dequantized on the device.
    host = [i for i, (e, _) in enumerate(jobs) if not isinstance(e, QuantizedEntry) and e.keys.device != device]
    if not host:
        return jobs
    moved = staging().upload([t for i in host for t in (jobs[i][0].keys, jobs[i][0].values)], device)
    out = list(jobs)
    for n, i in enumerate(host):
        entry, pos = jobs[i]
        out[i] = (replace(entry, keys=moved[2 * n], values=moved[2 * n + 1]), pos)
    return out


class Mount:
    """A cache being assembled: the preamble first, then entries at the next free positions.

    Placing an entry copies it (values) or re-rotates it while copying (keys); nothing keeps a reference to the
    entry afterwards. :meth:`place_all` places several at once, on two threads when a CPU is idle.
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
        return self.place_all([entry])[0]

    def place_all(self, entries: Sequence[EncodedEntry]) -> list[tuple[int, int]]:
        """Put ``entries`` at the next free positions, in order; returns their spans.

        Entries are independent once their positions are known, so when a CPU is idle a helper thread places
        every other entry (see :func:`_helper_thread`). The entries' tensors must stay valid until this returns.
        """
        num_layers, kv_heads, head_dim = self.shape
        jobs: list[tuple[EncodedEntry, int]] = []
        pos = self.pos
        for entry in entries:
            n = entry.num_tokens
            if tuple(entry.kv_shape) != (num_layers, kv_heads, n, head_dim):
                raise ValueError(f"entry KV shape {tuple(entry.kv_shape)} does not match the model's cache layout")
            if pos != entry.offset and self.inv_freq is None:
                raise ValueError("entries need re-rotation but the model has no rotary frequencies")
            jobs.append((entry, pos))
            pos += n
        if pos > self.kbuf.shape[3]:
            raise ValueError(f"mount capacity {self.kbuf.shape[3]} exceeded; plan the capacity before placing")
        if self.device.type != "cpu":  # GPU: one pinned staging pass, async uploads, rotation on the device
            jobs = _uploaded(jobs, self.device)
        big = sum(math.prod(e.kv_shape) for e, _ in jobs) >= _SPLIT_MIN_ELEMENTS
        helper = _helper_thread() if len(jobs) > 1 and big and self.device.type == "cpu" else None
        if helper is None:
            self._write(jobs)
        else:
            job = helper.submit(self._write, jobs[1::2])
            try:
                self._write(jobs[0::2])
            finally:
                job.result()  # wait even if this half failed: nothing may write into the buffers after we return
        spans = [(start, start + e.num_tokens) for e, start in jobs]
        self.spans += spans
        self.pos = pos
        return spans

    def _write(self, jobs: Sequence[tuple[EncodedEntry, int]]) -> None:
        """Copy each entry's values and re-rotate its keys while copying them, at its start position."""
        for entry, pos in jobs:
            n = entry.num_tokens
            if isinstance(entry, QuantizedEntry):  # codes in, floats out: dequantized (and rotated) while placed
                place_packed(self.kbuf[:, 0, :, pos : pos + n, :], self.vbuf[:, 0, :, pos : pos + n, :],
                             entry.packed, delta=pos - entry.offset, inv_freq=self.inv_freq, start=entry.offset)
                continue
            # Same device: keep the stored dtype, the copy/rotation below casts while writing (no extra pass).
            keys = entry.keys.to(device=self.device)
            dst_k = self.kbuf[:, 0, :, pos : pos + n, :]
            if pos == entry.offset:
                dst_k.copy_(keys)
            else:
                rerotate_keys_into(dst_k, keys, pos - entry.offset, self.inv_freq, start=entry.offset)
            self.vbuf[:, 0, :, pos : pos + n, :].copy_(entry.values)

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
    mount.place_all(entries)
    return mount.cache(), mount.spans
