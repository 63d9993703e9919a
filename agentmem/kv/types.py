"""Value types shared by the KV engine's modules: an encoded entry, a memory to mount, a generation result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

__all__ = ["EncodedEntry", "GenerationResult", "MemoryItem", "Mode", "MountMemory"]

Mode = Literal["kv", "kv+fix", "text"]


@dataclass(frozen=True, eq=False)
class EncodedEntry:
    """One memory's precomputed KV, encoded after the shared preamble.

    ``keys``/``values`` are stacked over layers: ``[layers, kv_heads, tokens, head_dim]`` (batch dim dropped; see
    :meth:`layers` for the per-layer ``[1, H, T, D]`` shape a model cache uses). ``offset`` is the position of the
    first token when it was encoded (= the preamble length). Tensors decoded from a blob may share memory with the
    blob bytes: treat them as read-only (mounting never writes to them).

    Example:
        >>> entry = engine.encode("Alice moved to Lisbon in 2021.")
        >>> entry.num_tokens, entry.offset
        (12, 14)
    """

    token_ids: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    offset: int
    fingerprint: str  # ModelFingerprint.digest of the model that made it
    preamble_digest: str  # sha256 of the preamble token ids it was encoded after

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.numel())

    @property
    def kv_shape(self) -> tuple[int, ...]:
        """``(layers, kv_heads, tokens, head_dim)``; a quantized entry answers without dequantizing."""
        return tuple(self.keys.shape)

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer ``(keys, values)`` views shaped ``[1, kv_heads, tokens, head_dim]``."""
        return [(self.keys[i].unsqueeze(0), self.values[i].unsqueeze(0)) for i in range(self.keys.shape[0])]


class MountMemory(Protocol):
    """What ``KVEngine.generate`` takes per memory: an id, its text, and a way to load its stored KV.

    ``load_kv`` may be ``None`` (no KV stored yet: encoded on the fly) and may raise
    ``FingerprintMismatchError`` / ``BlobCorruptedError`` (falls back to encoding the text). The engine calls the
    loaders in order and places all entries once every one is loaded (on two threads when a CPU is idle), so each
    returned entry must stay valid until then: decode a memory-mapped file or a fresh buffer, never one buffer
    reused for every blob.

    A loader that cannot use the stored KV but re-encodes the text itself (the facade's "hot update") returns the
    fresh entry and sets an optional ``load_fallback`` attribute on the memory to the reason (``None`` otherwise):
    the engine mounts the entry and reports ``(id, load_fallback)`` in ``GenerationResult.fallbacks``.
    """

    id: str
    text: str
    load_kv: Callable[[], EncodedEntry] | None


@dataclass
class MemoryItem:
    """A simple concrete :class:`MountMemory`."""

    id: str
    text: str
    load_kv: Callable[[], EncodedEntry] | None = None


@dataclass
class GenerationResult:
    """The answer plus what was mounted, what was dropped, why anything fell back, and where the time went.

    ``timings`` has seconds for ``retrieve`` (passed in by the caller), ``load``, ``mount``, ``fix``, ``prefill``,
    ``ttft`` (everything up to the first new token), ``decode`` and ``total``.
    """

    text: str
    mounted: list[str]
    dropped: list[str]
    mode: Mode
    timings: dict[str, float]
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)  # generated ids (without the prompt)
    prompt_tokens: int = 0
    max_new_tokens: int = 0  # after clamping to the model's position limit
    notes: list[str] = field(default_factory=list)
    recomputed_tokens: int = 0  # kv+fix: mounted tokens recomputed in context
    spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) cache positions of each mounted entry
