"""Value types shared by the KV engine's modules: an encoded entry, a memory to mount, the engine's mount decision,
a generation result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

__all__ = ["EncodedEntry", "GenerationResult", "MemoryItem", "Mode", "MountChoice", "MountMemory"]

Mode = Literal["kv", "kv+fix", "text"]


@dataclass(frozen=True, eq=False)
class EncodedEntry:
    """One memory's precomputed KV, encoded after the shared preamble.

    ``keys``/``values`` are stacked over layers: ``[layers, kv_heads, tokens, head_dim]`` (batch dim dropped; see
    :meth:`layers` for the per-layer ``[1, H, T, D]`` shape a model cache uses). ``offset`` is the position of the
    first token when it was encoded (= the preamble length). Tensors decoded from a blob may share memory with the
    blob bytes: treat them as read-only (mounting never writes to them).

    Example:
        >>> from agentmem.kv.engine import KVEngine
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> engine = KVEngine(*tiny_causal_lm("llama"))
        >>> entry = engine.encode("Alice moved to Lisbon in 2021.")
        >>> entry.num_tokens == len(entry.token_ids), entry.offset == len(engine.layout.preamble_ids)
        (True, True)
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
    """What ``KVEngine.generate`` takes per memory: an id, its text, a way to load its stored KV, and what the
    engine must know about that KV (:class:`MemoryItem` is the plain concrete one; the facade's is
    ``agentmem.bank.BankMemory``).

    ``load_kv`` may be ``None`` (no KV stored yet: encoded on the fly) and may raise
    ``FingerprintMismatchError`` / ``BlobCorruptedError`` (falls back to encoding the text). The engine calls the
    loaders in order and places all entries once every one is loaded (on two threads when a CPU is idle), so each
    returned entry must stay valid until then: decode a memory-mapped file or a fresh buffer, never one buffer
    reused for every blob.

    ``trained`` marks learned KV (a trained entry): mounted as stored, never compared with its text's ids nor
    recomputed, and it occupies ``kv_tokens`` positions. A loader that cannot use the stored KV but re-encodes
    the text itself (the facade's "hot update") returns the fresh entry and sets ``load_fallback`` to the reason
    (``None`` otherwise): the engine mounts the entry and reports ``(id, load_fallback)`` in
    ``GenerationResult.fallbacks``.

    Example:
        >>> memory: MountMemory = MemoryItem("m1", "Alice moved to Lisbon.", lambda: None)
        >>> memory.trained, memory.load_fallback
        (False, None)
    """

    id: str
    text: str
    load_kv: Callable[[], EncodedEntry] | None
    trained: bool
    kv_tokens: int | None
    load_fallback: str | None


@dataclass
class MemoryItem:
    """A simple concrete :class:`MountMemory`.

    Example:
        >>> item = MemoryItem("m1", "Alice moved to Lisbon.")   # no stored KV: the engine encodes the text
        >>> item.id, item.load_kv, item.trained
        ('m1', None, False)
    """

    id: str
    text: str
    load_kv: Callable[[], EncodedEntry] | None = None
    trained: bool = False  # learned KV (a trained entry): mounted as stored, occupying ``kv_tokens`` positions
    kv_tokens: int | None = None
    load_fallback: str | None = None  # set by ``load_kv`` when it had to re-encode: why


@dataclass
class MountChoice:
    """The engine's one decision for a memory about to be mounted (``KVEngine.mount_entry``).

    One-shot prompts (``generate``, ``prepare``) and conversation turns (``KVEngine.turn``) both take it here.
    """

    entry: EncodedEntry | None  # what to mount; None: left out (a trained entry whose learned KV is unusable)
    reason: str | None  # why the stored KV was not mounted as stored (None: it was)
    load_s: float  # seconds spent loading / checking the stored KV
    encode_s: float  # seconds spent encoding the text instead

    def record(self, memory_id: str, timings: dict[str, float], fallbacks: list[tuple[str, str]]) -> bool:
        """Add this choice's seconds to ``timings`` and its reason (if any) to ``fallbacks``; whether there is an
        entry to mount. The one bookkeeping step of ``prepare``/``generate`` and of conversation turns.

        Example:
            >>> timings, fallbacks = {"load": 0.0, "encode": 0.0}, []
            >>> choice = MountChoice(entry=None, reason="trained KV from another model", load_s=0.01, encode_s=0.0)
            >>> choice.record("m1", timings, fallbacks), fallbacks
            (False, [('m1', 'trained KV from another model')])
        """
        timings["load"] += self.load_s
        timings["encode"] += self.encode_s
        if self.reason is not None:
            fallbacks.append((memory_id, self.reason))
        return self.entry is not None


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
    cancelled: bool = False  # decoding was stopped by the caller's cancel event before it finished
