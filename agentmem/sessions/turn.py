"""What sessions read off a loaded engine (:class:`EngineContext`), and re-tokenizing a transcript.

The model work of a turn is the engine's (``KVEngine.turn``, :mod:`agentmem.kv.turn`); sessions use this context
for their bookkeeping: the chat layout, the validity key their KV is tagged with, sizes and the position limit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from agentmem.errors import UnsupportedModelError
from agentmem.kv.engine import KVEngine
from agentmem.sessions.layout import ChatLayout
from agentmem.sessions.state import Transcript

__all__ = ["EngineContext", "retokenize"]

log = logging.getLogger(__name__)


@dataclass
class EngineContext:
    """What sessions need from a loaded engine, computed once."""

    engine: KVEngine
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
    def from_engine(cls, engine: KVEngine) -> EngineContext:
        """Read once what sessions need off a loaded engine (its preamble KV is computed now if it was not).

        Example:
            >>> from agentmem.kv.engine import KVEngine
            >>> from agentmem.kv.testing import tiny_causal_lm
            >>> engine = KVEngine(*tiny_causal_lm("llama"))
            >>> ctx = EngineContext.from_engine(engine); ctx.preamble_len == len(engine.layout.preamble_ids)
            True
        """
        pre_k, pre_v = engine.preamble_kv()
        return cls(
            engine=engine,
            chat=ChatLayout.from_prompt_layout(engine.layout),
            pre_k=pre_k,
            pre_v=pre_v,
            preamble_ids=list(engine.layout.preamble_ids),
            fingerprint=engine.fingerprint.digest,
            preamble_digest=engine.layout.preamble_digest,
            inv_freq=engine.inv_freq,
            device=pre_k.device,
            dtype=pre_k.dtype,
            max_positions=int(engine.max_positions),
            margin=int(engine.position_margin),
        )

    @property
    def preamble_len(self) -> int:
        return int(self.pre_k.shape[3])

    @property
    def bytes_per_token(self) -> int:
        L, _, H, _, D = self.pre_k.shape
        return 2 * L * H * D * self.pre_k.element_size()

    def require_kv(self) -> None:
        reason = self.engine.kv_unsupported_reason
        if reason is not None:
            raise UnsupportedModelError(f"{reason} (sessions with mode='kv' need exact RoPE re-rotation)")

    def validity_key(self, kb_version: str | None, epoch: str) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "preamble": self.preamble_digest, "kb": kb_version, "epoch": epoch}


def retokenize(ctx: EngineContext, transcript: Transcript) -> None:
    """Rebuild every id from the stored texts (after a model or template change)."""
    ids: list[int] = []
    for i, turn in enumerate(transcript.turns):
        turn.start = len(ids)
        ids += ctx.chat.turn_ids(turn.user, ctx.chat.content_ids(turn.reply), first=i == 0)
        turn.end = len(ids)
    transcript.ids = ids
    transcript.kv_len = 0
