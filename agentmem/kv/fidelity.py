"""How far mounted KV drifts from re-encoding the same memories as text, on the first tokens of an answer.

The fidelity monitor scores a share of live answers twice, teacher-forced: once with the memories mounted as
stored KV and once with them re-encoded as text (the reference). The mean KL(text ‖ kv) over the first answer
tokens is near zero when mounting is exact; a bad blob, a model swap or a broken re-rotation shows up as a jump.

Example:
    >>> from agentmem.kv.engine import KVEngine
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> from agentmem.kv.types import MemoryItem
    >>> engine = KVEngine(*tiny_causal_lm("llama"))
    >>> entry = engine.encode("I moved to Lyon.")
    >>> kv_memories = [MemoryItem("m1", "I moved to Lyon.", lambda: entry)]
    >>> text_memories = [MemoryItem("m1", "I moved to Lyon.")]
    >>> report = mode_kl(engine, "Where do I live?", kv_memories, text_memories, "In Lyon.", tokens=4)
    >>> report["kl"] < 1e-3, report["tokens"]    # mounting is exact: the two modes agree
    (True, 4)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from agentmem.errors import InvalidInputError

__all__ = ["mode_kl"]


def mode_kl(engine: Any, question: str, kv_memories: Sequence[Any], text_memories: Sequence[Any], answer: str,
            *, tokens: int = 8) -> dict[str, float | int]:
    """``{"kl", "top1_agree", "tokens"}``: KL(text ‖ kv) averaged over the first ``tokens`` answer tokens.

    ``top1_agree`` is the share of those positions where both modes' most likely next token is the same.
    """
    if tokens <= 0:
        raise InvalidInputError("tokens must be > 0")
    ids = engine.layout.content_ids(answer)[:tokens]
    if not ids:
        raise InvalidInputError("answer must have at least one token")
    head = engine.tokenizer.decode(ids, skip_special_tokens=True) or answer
    ref, _ = engine.answer_logits(question, text_memories, head, mode="text")
    got, _ = engine.answer_logits(question, kv_memories, head, mode="kv")
    n = min(len(ref), len(got))
    ref_lp, got_lp = torch.log_softmax(ref[:n], -1), torch.log_softmax(got[:n], -1)
    kl = float((ref_lp.exp() * (ref_lp - got_lp)).sum(-1).mean().clamp_min(0.0))
    agree = float((ref_lp.argmax(-1) == got_lp.argmax(-1)).float().mean())
    return {"kl": kl, "top1_agree": agree, "tokens": n}
