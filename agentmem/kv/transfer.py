"""Host-to-device copies for mounting on a GPU: pinned staging buffers and asynchronous uploads.

Blobs are read on the host (memory-mapped files, decrypted buffers). On CUDA, copying pageable memory to the GPU is
synchronous and slow; copying from page-locked ("pinned") memory can run asynchronously on the stream, so the
re-rotation kernels queue behind the uploads and the host moves on. :class:`HostStaging` keeps one pinned buffer,
grown on demand and reused; a CUDA event guards reuse, so a buffer is never overwritten while a copy from it is
still in flight. Off CUDA (CPU, MPS) uploads are plain ``.to(device)``.

Not run on a GPU in this repository's CI (no GPU there); the CPU path is what the tests exercise.

Example:
    >>> keys, values = torch.randn(2, 1, 2, 5, 16), torch.randn(2, 1, 2, 5, 16)   # an entry's KV, on the host
    >>> device = torch.device("cuda" if torch.cuda.is_available() else "cpu")    # staged and pinned on CUDA only
    >>> on_device = HostStaging().upload([keys, values], device)
    >>> torch.equal(on_device[0].cpu(), keys), on_device[1].device.type == device.type
    (True, True)
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

__all__ = ["HostStaging", "staging"]

_ALIGN = 256  # bytes: keeps every staged tensor aligned for fast DMA


class HostStaging:
    """A reusable pinned host buffer for asynchronous uploads of several tensors at once."""

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None
        self._event: object | None = None
        self._lock = threading.Lock()

    def upload(self, tensors: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """Copies of ``tensors`` on ``device`` (same dtypes and shapes); asynchronous on CUDA, ordered on its
        current stream, so kernels launched afterwards on that stream see the data."""
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():
            return [t.to(device) for t in tensors]
        sizes = [-(-t.numel() * t.element_size() // _ALIGN) * _ALIGN for t in tensors]
        with self._lock:
            if self._event is not None:
                self._event.synchronize()  # the previous uploads from this buffer have finished reading it
            if self._buf is None or self._buf.numel() < sum(sizes):
                self._buf = torch.empty(int(sum(sizes) * 1.25) + _ALIGN, dtype=torch.uint8, pin_memory=True)
            out, offset = [], 0
            for t, size in zip(tensors, sizes):
                n = t.numel() * t.element_size()
                staged = self._buf[offset : offset + n].view(t.dtype).view(t.shape)
                staged.copy_(t)  # one host memcpy out of the mapped / decrypted blob
                out.append(staged.to(device, non_blocking=True))
                offset += size
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            self._event = event
            return out


_shared = HostStaging()


def staging() -> HostStaging:
    """The process-wide staging buffer mounts use (uploads are serialised by its lock)."""
    return _shared
