"""The model-facing steps of a turn: build / shift / rebuild a session's KV, mount memories in front of it.

Everything here runs on tensors the caller owns and on the KV engine's public pieces (preamble KV, layout,
``assemble``, ``prefill``, ``decode``, exact RoPE re-rotation). Callers hold the engine lock around model calls.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentmem.errors import UnsupportedModelError
from agentmem.kv.cache import BufferedCache, cache_length, remove_cache_span
from agentmem.kv.runner import prefill
from agentmem.kv.types import EncodedEntry
from agentmem.sessions.layout import ChatLayout
from agentmem.sessions.state import SessionKV, Transcript

__all__ = ["EngineContext", "load_entry", "rebuild_kv", "retokenize", "shift_history"]

log = logging.getLogger(__name__)


@dataclass
class EngineContext:
    """What sessions need from a loaded engine, computed once."""

    engine: Any
    chat: ChatLayout
    pre_k: torch.Tensor  # [L, 1, H, P, D]
    pre_v: torch.Tensor
    preamble_ids: list[int]
    fingerprint: str
    preamble_digest: str
    inv_freq: torch.Tensor | None
    device: torch.device
    dtype: torch.dtype
    max_positions: int
    margin: int

    @classmethod
    def from_engine(cls, engine: Any) -> EngineContext:
        pre_k, pre_v = engine.preamble_kv()
        return cls(
            engine=engine,
            chat=ChatLayout.from_prompt_layout(engine.layout),
            pre_k=pre_k,
            pre_v=pre_v,
            preamble_ids=list(engine.layout.preamble_ids),
            fingerprint=engine.fingerprint.digest,
            preamble_digest=engine.layout.preamble_digest,
            inv_freq=engine._inv_freq,
            device=pre_k.device,
            dtype=pre_k.dtype,
            max_positions=int(engine.max_positions),
            margin=int(getattr(engine, "position_margin", 0)),
        )

    @property
    def preamble_len(self) -> int:
        return int(self.pre_k.shape[3])

    @property
    def bytes_per_token(self) -> int:
        L, _, H, _, D = self.pre_k.shape
        return 2 * L * H * D * self.pre_k.element_size()

    def require_kv(self) -> None:
        reason = getattr(self.engine, "kv_unsupported_reason", None)
        if reason is not None:
            raise UnsupportedModelError(f"{reason} (sessions with mode='kv' need exact RoPE re-rotation)")

    def validity_key(self, kb_version: str | None, epoch: str) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "preamble": self.preamble_digest, "kb": kb_version, "epoch": epoch}

    def fresh_kv(self, capacity: int) -> SessionKV:
        """Buffers for ``capacity`` tokens holding just the preamble."""
        L, B, H, P, D = self.pre_k.shape
        cap = max(capacity, P)
        keys = torch.empty((L, B, H, cap, D), dtype=self.dtype, device=self.device)
        values = torch.empty_like(keys)
        keys[..., :P, :].copy_(self.pre_k)
        values[..., :P, :].copy_(self.pre_v)
        return SessionKV(keys, values, P)

    def history_entry(self, kv: SessionKV, ids: Sequence[int], n: int) -> EncodedEntry:
        """The first ``n`` history tokens of ``kv`` as a mountable entry encoded at the preamble offset."""
        P = self.preamble_len
        return EncodedEntry(
            token_ids=torch.as_tensor(list(ids[:n]), dtype=torch.long),
            keys=kv.keys[:, 0, :, P : P + n, :],
            values=kv.values[:, 0, :, P : P + n, :],
            offset=P,
            fingerprint=self.fingerprint,
            preamble_digest=self.preamble_digest,
        )


def rebuild_kv(ctx: EngineContext, transcript: Transcript, capacity: int) -> SessionKV:
    """Re-encode the whole history after the preamble (caller holds the engine lock)."""
    kv = ctx.fresh_kv(capacity)
    if transcript.ids:
        cache = kv.cache()
        prefill(ctx.engine.model, cache, transcript.ids)
        kv = _adopt(kv, cache)
    transcript.kv_len = kv.length - ctx.preamble_len
    return kv


def _adopt(kv: SessionKV, cache: BufferedCache) -> SessionKV:
    """``kv`` with the cache's new length (or a copy of the cache, had it outgrown the buffers)."""
    if kv.owns(cache):
        kv.length = cache_length(cache)
        return kv
    from agentmem.kv.cache import stacked_from_cache

    keys, values = stacked_from_cache(cache)
    return SessionKV(keys, values, keys.shape[3])


def shift_history(ctx: EngineContext, kv: SessionKV, cut: int, old_kv_len: int) -> None:
    """Drop the first ``cut`` history tokens of ``kv`` in place; the rest moves ``cut`` positions back exactly."""
    P = ctx.preamble_len
    cache = kv.cache()
    remove_cache_span(cache, P, P + min(cut, old_kv_len), ctx.inv_freq)
    kv.length = cache_length(cache)


def retokenize(ctx: EngineContext, transcript: Transcript) -> None:
    """Rebuild every id from the stored texts (after a model or template change)."""
    ids: list[int] = []
    for i, turn in enumerate(transcript.turns):
        turn.start = len(ids)
        ids += ctx.chat.turn_ids(turn.user, ctx.chat.content_ids(turn.reply), first=i == 0)
        turn.end = len(ids)
    transcript.ids = ids
    transcript.kv_len = 0


def load_entry(ctx: EngineContext, memory: Any, ids: list[int], strict: bool) -> tuple[EncodedEntry, str | None]:
    """A recalled memory's stored entry, or its text encoded now (with the reason) when it cannot be mounted.

    Sessions place every memory by its text's ids, so a trained entry's learned KV is refused here too.
    """
    entry, reason = ctx.engine.load_stored(memory, ids, strict, mount_trained=False)
    if entry is not None:
        return entry, reason  # reason: why the bank's loader re-encoded it, if it had to
    log.warning("memory %s: mounting from text (%s)", memory.id, reason)
    return ctx.engine.encode(memory.text), reason
