"""Gold-answer NLL under a mounted context: how much a memory (text, KV or trained) helps the model answer.

The context is a KV cache from position 0 (preamble, then whatever is mounted); each question follows as the
engine's prompt suffix and the answer as the assistant reply. Only the answer's content tokens are scored, as in
:meth:`agentmem.kv.KVEngine.answer_logits`, so numbers are comparable with the engine's own evaluation.

Example:
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> model, tok = tiny_causal_lm("llama")
    >>> layout = PromptLayout.for_tokenizer(tok)
    >>> ctx = context_kv(model, layout.preamble_ids())
    >>> [round(x, 1) > 0 for x, n in answer_nll(model, layout, ctx, [("Where?", "Oslo")])]
    [True]
"""

from __future__ import annotations

from typing import Any

import torch

from agentmem.train import _kv
from agentmem.train.layout import PromptLayout

__all__ = ["answer_logprobs", "answer_nll", "context_kv", "kl", "memory_kv", "mounted_context", "nll"]


def context_kv(model: Any, preamble_ids: list[int], memory_ids: list[int] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """KV of ``preamble_ids + memory_ids`` encoded in one pass (text mode's context)."""
    ids = list(preamble_ids) + list(memory_ids or [])
    return _kv.encode(model, torch.tensor(ids, dtype=torch.long))


def memory_kv(model: Any, preamble_ids: list[int], memory_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """KV of ``memory_ids`` alone, encoded after the preamble (at positions ``len(preamble) ..``), as an entry is
    stored: e.g. an untrained prefix, the real KV of a document's first tokens (what training starts from).

    Example:
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> model, _ = tiny_causal_lm("llama")
        >>> memory_kv(model, [1, 2, 3], [4, 5])[0].shape[2]
        2
    """
    pre = _kv.encode(model, torch.tensor(preamble_ids, dtype=torch.long)) if preamble_ids else None
    return _kv.encode(model, torch.tensor(memory_ids, dtype=torch.long), pre)


def mounted_context(model: Any, preamble_ids: list[int], keys: torch.Tensor, values: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Preamble KV followed by stored/trained KV at positions ``len(preamble) ..`` (KV mode's context)."""
    pre = _kv.encode(model, torch.tensor(preamble_ids, dtype=torch.long)) if preamble_ids else _kv.empty(model)
    return torch.cat([pre[0], keys], 2), torch.cat([pre[1], values], 2)


@torch.no_grad()
def answer_logprobs(model: Any, layout: PromptLayout, context: tuple[torch.Tensor, torch.Tensor],
                    qa: list[tuple[str, str]], *, batch_size: int = 8) -> list[tuple[torch.Tensor, list[int]]]:
    """Per question: ``(log-probs [answer tokens, vocab], answer ids)``, teacher-forced after ``context``."""
    rows = []
    for question, answer in qa:
        q, a = layout.question_ids(question), layout.answer_ids(answer, end=False)
        rows.append((q + a, len(q), len(a)))
    out: list[tuple[torch.Tensor, list[int]]] = []
    for lo in range(0, len(rows), batch_size):
        group = rows[lo:lo + batch_size]
        width = max(len(ids) for ids, _, _ in group)
        ids = torch.zeros((len(group), width), dtype=torch.long)
        for r, (x, _, _) in enumerate(group):
            ids[r, :len(x)] = torch.tensor(x)  # right padding: causal attention never sees it
        hidden, _ = _kv.forward_hidden(model, ids, _kv.cache_from(*context, batch=len(group)))
        for r, (x, nq, na) in enumerate(group):
            # Position j predicts token j + 1; the answer occupies [nq, nq + na).
            h = hidden[r, nq - 1:nq + na - 1]
            out.append((torch.log_softmax(model.get_output_embeddings()(h).float(), -1), x[nq:nq + na]))
    return out


def answer_nll(model: Any, layout: PromptLayout, context: tuple[torch.Tensor, torch.Tensor],
               qa: list[tuple[str, str]], *, batch_size: int = 8) -> list[tuple[float, int]]:
    """``(summed NLL in nats, answer tokens)`` of each gold answer, teacher-forced after ``context``."""
    return [nll(lp, ids) for lp, ids in answer_logprobs(model, layout, context, qa, batch_size=batch_size)]


def nll(logprobs: torch.Tensor, ids: list[int]) -> tuple[float, int]:
    """Summed NLL of ``ids`` under ``logprobs`` ``[n, vocab]``, and ``n``."""
    return float(-logprobs.gather(-1, torch.tensor(ids).unsqueeze(1)).sum()), len(ids)


def kl(reference: torch.Tensor, other: torch.Tensor) -> float:
    """Mean over positions of KL(reference ‖ other), both ``[n, vocab]`` log-probs (full vocabulary)."""
    return float((reference.exp() * (reference - other)).sum(-1).mean())
