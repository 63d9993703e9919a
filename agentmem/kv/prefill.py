"""Batched prefill across requests: prompts that wait for the model at the same time run as one padded forward.

Concurrent chat requests each mount their own memories, so their caches differ in content and length, and each
still has its own suffix (the question, the chat template's end) to prefill. One at a time, every prefill reads
all the weights and pays the model's Python overhead once per request; :class:`PrefillBatch` runs the prefills
that are waiting together, like a database's group commit: each caller queues its job and takes the model lock;
whoever gets the lock runs every queued job (up to ``max_tokens`` padded tokens per forward) and the others find
theirs done when their turn comes. Nothing waits for a batch to fill: a lone request prefills at once, exactly as
:func:`agentmem.kv.runner.prefill` does.

How a batch stays exact: each row keeps its own cache. The ids are left-padded to the longest suffix (so every row's
last token is in the last column, and only that column goes through the output head); each row gets explicit
position ids (its own cache length onward), so RoPE positions are exact. The cache the model sees
(:class:`_PaddedCache`) appends only row ``b``'s real tokens to sequence ``b``'s cache, and returns the rows' keys
and values padded to the longest, with a 4-D additive mask (transformers passes a ready 4-D mask to the attention
function unchanged) that lets row ``b``'s token ``i`` see exactly its own cache and its own tokens up to ``i``: no
row sees another's keys, a pad, or a later token. The model's own SDPA attention runs it, so nothing on the model
is switched; a model on another attention (flash, or eager like Gemma 2's) prefills one prompt at a time.
Padded query positions attend to one real key so that they stay finite; their outputs are never read.

Why not transformers' continuous batching (``transformers.generation.continuous_batching``): its paged cache is
filled by its own prefill, with no way to adopt a request's mounted, re-rotated memory KV (see
:mod:`agentmem.kv.batch`).

Example:
    >>> from agentmem.kv.batch import FairRLock
    >>> from agentmem.kv.cache import cache_from_stacked
    >>> from agentmem.kv.runner import prefill
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> model, _ = tiny_causal_lm("llama")                 # 2 layers, 2 KV heads of 16 dims
    >>> def empty_cache():
    ...     return cache_from_stacked(torch.zeros(2, 1, 2, 0, 16), torch.zeros(2, 1, 2, 0, 16), capacity=64)
    >>> batch = PrefillBatch(model, FairRLock())
    >>> logits = batch.prefill(empty_cache(), [5, 6, 7])       # [1, vocab]: the next token's logits
    >>> torch.allclose(logits, prefill(model, empty_cache(), [5, 6, 7]), atol=1e-5)   # as a prefill alone
    True
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentmem.kv.runner import prefill

__all__ = ["PrefillBatch"]

# attention implementations that apply a ready 4-D mask as given and nothing else ("agentmem_ragged" is SDPA outside
# a batched decode step, agentmem/kv/batch.py). Others prefill one prompt at a time: flash attention takes no such
# mask, and a model left on eager attention (Gemma 2: soft-capping, sliding-window layers) builds masks per layer type
_MASKED_ATTENTION = ("sdpa", "agentmem_ragged")


@dataclass(eq=False)
class _Job:
    """One prompt waiting to be prefilled, and what came of it."""

    cache: object
    ids: list[int]
    logits: torch.Tensor | None = None
    error: BaseException | None = None
    done: bool = False


class _PaddedCache:
    """What the model sees as the cache of a batched prefill: row ``b`` appends its last ``lengths[b]`` (real)
    tokens to sequence ``b``'s cache and reads that cache, padded to the longest row."""

    def __init__(self, caches: Sequence, lengths: Sequence[int]) -> None:
        self.caches, self.lengths = list(caches), list(lengths)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        width = key_states.shape[2]
        rows = [cache.layers[layer_idx].update(key_states[b : b + 1, :, width - n :],
                                               value_states[b : b + 1, :, width - n :])
                for b, (cache, n) in enumerate(zip(self.caches, self.lengths))]
        width = max(k.shape[2] for k, _ in rows)
        keys = key_states.new_zeros(len(rows), key_states.shape[1], width, key_states.shape[3])
        values = torch.zeros_like(keys)
        for b, (k, v) in enumerate(rows):
            keys[b, :, : k.shape[2]] = k[0]
            values[b, :, : v.shape[2]] = v[0]
        return keys, values


def padded_mask(starts: Sequence[int], lengths: Sequence[int], device=None) -> torch.Tensor:
    """The ``[B, 1, max(lengths), max(starts + lengths)]`` boolean mask of a left-padded batched prefill: row
    ``b``'s ``i``-th real token (at position ``starts[b] + i``) sees keys ``0 .. starts[b] + i``; a pad sees key 0.

    Example:
        >>> padded_mask([2, 0], [1, 2]).int().tolist()
        [[[[1, 0, 0], [1, 1, 1]]], [[[1, 0, 0], [1, 1, 0]]]]
    """
    width, keys = max(lengths), max(s + n for s, n in zip(starts, lengths))
    key = torch.arange(keys, device=device)
    rows = []
    for start, n in zip(starts, lengths):
        pad = width - n
        last_key = start + torch.arange(width, device=device) - pad  # the last key each query may see
        row = key[None, :] <= last_key[:, None]
        row[:pad] = key[None, :] == 0  # padding: one real key, so its (unread) output stays finite
        rows.append(row)
    return torch.stack(rows)[:, None]


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``allowed`` as an additive float mask: 0 where seen, the dtype's minimum where not (the form every attention
    implementation that takes a 4-D mask adds to its scores)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed,
                                                                                     torch.finfo(dtype).min)


class PrefillBatch:
    """Prefills the prompts that wait for the model together (see the module docs); ``lock`` is the model's lock.

    ``max_tokens`` caps the padded tokens of one forward (rows × the longest suffix), so one long text-mode prompt
    does not make a batch of short ones pay for its padding.
    """

    def __init__(self, model, lock, *, max_tokens: int = 2048) -> None:
        self.model = model
        self.lock = lock
        self.max_tokens = max_tokens
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self._guard = threading.Lock()
        self._queue: list[_Job] = []
        self.forwards = 0  # model forwards run (for tests and metrics)
        self.max_batch_seen = 0

    @property
    def waiting(self) -> int:
        """Prompts queued and not yet taken into a forward."""
        with self._guard:
            return len(self._queue)

    def prefill(self, cache, ids: Sequence[int]) -> torch.Tensor:
        """Append ``ids`` to ``cache`` (batched with every prefill waiting now); the last position's logits ``[1, vocab]``.

        Example:
            >>> from agentmem.kv.cache import cache_length
            >>> from agentmem.kv.engine import KVEngine
            >>> from agentmem.kv.testing import tiny_causal_lm
            >>> engine = KVEngine(*tiny_causal_lm("llama"))
            >>> prep = engine.prepare("Where does Alice live?", [])     # the cached preamble; the question pending
            >>> logits = engine.prefiller.prefill(prep.cache, prep.pending_ids)     # the engine's PrefillBatch
            >>> logits.shape == (1, len(engine.tokenizer)), cache_length(prep.cache) == prep.prompt_tokens
            (True, True)
        """
        job = _Job(cache, list(ids))
        if not job.ids:
            raise ValueError("nothing to prefill")
        with self._guard:
            self._queue.append(job)
        with self.lock:
            while not job.done:  # earlier jobs first; ours is in one of the next batches
                self._run(self._take())
        if job.error is not None:
            raise job.error
        assert job.logits is not None
        return job.logits

    def _take(self) -> list[_Job]:
        """The queued jobs from the front, as many as fit ``max_tokens`` padded tokens (at least one)."""
        with self._guard:
            taken: list[_Job] = []
            for job in self._queue:
                width = max([len(j.ids) for j in taken] + [len(job.ids)])
                if taken and width * (len(taken) + 1) > self.max_tokens:
                    break
                taken.append(job)
            del self._queue[: len(taken)]
            return taken

    @torch.no_grad()
    def _run(self, jobs: list[_Job]) -> None:
        self.forwards += 1
        self.max_batch_seen = max(self.max_batch_seen, len(jobs))
        try:
            if len(jobs) == 1 or self.model.config._attn_implementation not in _MASKED_ATTENTION:
                # a lone prompt (or a model whose attention takes no 4-D mask): the plain forward, as unbatched
                logits = [prefill(self.model, job.cache, job.ids)[-1:] for job in jobs]
            else:
                logits = self._padded_forward(jobs)
            for job, row in zip(jobs, logits):
                job.logits = row
        except BaseException as exc:  # the forward failed for every prompt in it
            for job in jobs:
                job.error = exc
        for job in jobs:
            job.done = True

    def _padded_forward(self, jobs: list[_Job]) -> list[torch.Tensor]:
        lengths = [len(j.ids) for j in jobs]
        starts = [int(j.cache.get_seq_length()) for j in jobs]
        width = max(lengths)
        ids = torch.zeros(len(jobs), width, dtype=torch.long, device=self.device)
        positions = torch.zeros(len(jobs), width, dtype=torch.long, device=self.device)
        for b, (job, start, n) in enumerate(zip(jobs, starts, lengths)):
            ids[b, width - n :] = torch.tensor(job.ids, dtype=torch.long)
            positions[b] = (start - width + n + torch.arange(width)).clamp(min=start)  # pads: any position
        out = prefill(self.model, _PaddedCache([j.cache for j in jobs], lengths), ids, position_ids=positions,
                      attention_mask=additive_mask(padded_mask(starts, lengths, self.device), self.dtype))
        return [out[b, -1:] for b in range(len(jobs))]
