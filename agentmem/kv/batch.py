"""Batched decoding across requests (continuous batching): many answers advance one token each per model step.

Requests that answer at the same time each mount their own memories, so their caches differ in content and length.
:class:`DecodeBatch` runs their decode steps together on one worker thread: a step feeds every active sequence's
last token as one ``[B, 1]`` batch, so the weights are read once per step for all of them (on CPU a step costs
about the same for 1 sequence as for 8). Sequences join as soon as their prompt is prefilled (on the caller's
thread, between two steps) and leave when they end, hit their limit, or are cancelled: prefills interleave with
decode steps, and no answer waits for another to finish.

How the batch attends without padding: each sequence keeps its own cache. The model's attention implementation is
set once, when the batch is made, to ``agentmem_ragged`` (registered here through ``transformers.AttentionInterface``
and ``AttentionMaskInterface``, the hooks its own continuous batching uses for paged attention). For every ordinary
forward (a prefill, an encode, a one-sequence step, a forward by other code on the same model) it *is* transformers'
SDPA attention with SDPA's causal mask. Only a batched step is different, and it says so by the cache it passes:
:class:`_RaggedCache` appends row ``b``'s new key/value to sequence ``b``'s cache and hands the attention each
row's keys alone, and the attention runs SDPA for each row on those. Projections, MLPs and the output head run
batched; each row gets explicit position ids (its own cache length), so RoPE positions are exact, and no row ever
sees another's keys or a padded slot. A step with one sequence runs the plain model forward, so a lone request
decodes exactly as it did unbatched.

Why set once rather than per step: the attention is chosen from ``model.config`` on every forward, and the config
is shared by every thread using the model. Switching it for the length of a batched step (as this module once did)
let a prefill that ran meanwhile attend without its causal mask (issue #40: a turn's first token 239 where the
reference gave 92). Nothing here changes the model's config after the batch is made. A model whose attention is not
SDPA (e.g. eager for Gemma 2's soft-capping) is left as loaded; its answers decode one forward per sequence per step.

Why not transformers' ``ContinuousBatchingManager`` / ``PagedAttentionCache``: it prefills every prompt itself into
its own paged blocks, and has no way to adopt a request's mounted, re-rotated memory KV; its scheduler also owns
generation end to end (no per-request cancel event, logits processors on our token ids, streaming callbacks on the
caller's thread). What it offers that fits — the attention-interface hook — is what this module uses.

Example (a caller that stops its answer after two tokens, from the streaming callback):
    >>> import threading
    >>> from agentmem.kv.cache import cache_from_stacked
    >>> from agentmem.kv.runner import prefill
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> model, _ = tiny_causal_lm("llama")
    >>> cache = cache_from_stacked(torch.zeros(2, 1, 2, 0, 16), torch.zeros(2, 1, 2, 0, 16), capacity=64)
    >>> stop, streamed = threading.Event(), []
    >>> def on_token(token_id):                       # runs on the caller's thread, as each id is chosen
    ...     streamed.append(token_id)
    ...     if len(streamed) == 2:
    ...         stop.set()
    >>> batch = DecodeBatch(model, FairRLock())
    >>> first = int(prefill(model, cache, [5, 6, 7]).argmax())
    >>> ids = batch.decode(cache, first, max_new_tokens=32, eos_ids={257}, on_token=on_token, cancel=stop)
    >>> ids == streamed, len(ids) < 32               # cancelled before the limit: what was decoded so far
    (True, True)
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from agentmem.kv.runner import LogitsProcessor, Sampling, next_token, processed

__all__ = ["DecodeBatch", "FairRLock"]

RAGGED_ATTENTION = "agentmem_ragged"


class FairRLock:
    """A re-entrant lock granted in arrival order.

    The model's lock: a decode worker that releases it after a step and asks again at once queues behind a request
    waiting to prefill, instead of winning the race every time (``threading.RLock`` makes no such promise).

    Example:
        >>> lock = FairRLock()
        >>> with lock:
        ...     with lock:          # re-entrant
        ...         lock.held_by_me()
        True
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._count = 0
        self._waiting: collections.deque[int] = collections.deque()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._count += 1
                return True
            if self._owner is None and not self._waiting:
                self._owner, self._count = me, 1
                return True
            if not blocking:
                return False
            self._waiting.append(me)
            granted = self._cond.wait_for(lambda: self._owner is None and self._waiting[0] == me,
                                          None if timeout < 0 else timeout)
            self._waiting.remove(me)
            if granted:
                self._owner, self._count = me, 1
            self._cond.notify_all()  # the next in line may now be first
            return granted

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("cannot release a lock held by another thread")
            self._count -= 1
            if self._count == 0:
                self._owner = None
                self._cond.notify_all()

    def held_by_me(self) -> bool:
        """Whether the calling thread holds the lock."""
        return self._owner == threading.get_ident()

    def __enter__(self) -> FairRLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Rows:
    """The per-row keys (or values) of a ragged batch: row ``b`` is a ``[1, H, T_b, D]`` tensor."""

    def __init__(self, rows: list[torch.Tensor]) -> None:
        self.rows = rows


class _RaggedCache:
    """What the model sees as the cache of a batched step: row ``b`` appends to, and reads, sequence ``b``'s cache.

    It answers transformers' mask questions (sizes and offsets) for the longest row: the mask they build for a
    one-token step is none at all (SDPA's skip), and the ragged attention attends each row to its own keys anyway.
    """

    def __init__(self, caches: Sequence) -> None:
        self.caches = list(caches)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = [], []
        for b, cache in enumerate(self.caches):
            k, v = cache.layers[layer_idx].update(key_states[b : b + 1], value_states[b : b + 1])
            keys.append(k)
            values.append(v)
        return _Rows(keys), _Rows(values)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(int(c.get_seq_length(layer_idx)) for c in self.caches)

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.get_seq_length(layer_idx)

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.get_seq_length(layer_idx) + query_length, 0


def _ragged_attention(module, query: torch.Tensor, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention; in a batched step (its keys come as :class:`_Rows`), row by row, each row on
    its own sequence's keys and values."""
    if not isinstance(key, _Rows):  # any ordinary forward: exactly the stock SDPA path
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    outs = [sdpa_attention_forward(module, query[b : b + 1], k, v, None, **kwargs)[0]
            for b, (k, v) in enumerate(zip(key.rows, value.rows))]
    return torch.cat(outs, dim=0), None


# Registered once, at import: the attention and the mask an "agentmem_ragged" model gets (SDPA's own mask).
AttentionInterface.register(RAGGED_ATTENTION, _ragged_attention)
AttentionMaskInterface.register(RAGGED_ATTENTION, sdpa_mask)


def _use_ragged_attention(model) -> None:
    """Set ``model``'s attention to ``agentmem_ragged`` once, if it runs SDPA (the same results for every forward
    but a batched step); any other implementation is left as loaded."""
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(RAGGED_ATTENTION)


@dataclass(eq=False)
class _Sequence:
    """One answer being decoded: its cache, limits, sampling, and the channel its tokens go back through."""

    cache: object
    token: int  # the last chosen id, not yet in the cache
    max_new_tokens: int
    eos_ids: set[int] | frozenset[int]
    sampling: Sampling
    generator: torch.Generator | None
    logits_processor: LogitsProcessor | None
    cancel: threading.Event | None
    out: list[int] = field(default_factory=list)
    inbox: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)  # ids, then None (done) or an exception

    def position(self) -> int:
        return int(self.cache.get_seq_length())


class DecodeBatch:
    """Decodes every submitted sequence together, one token each per step, on one worker thread.

    ``lock`` is the model's lock (a :class:`FairRLock`): each step holds it, so other model work (a prefill, an
    encode) runs between two steps, in arrival order.
    """

    def __init__(self, model, lock: FairRLock) -> None:
        self.model = model
        self.lock = lock
        self.device = next(model.parameters()).device
        _use_ragged_attention(model)  # once, here: never switched per step (see the module docstring)
        self._cond = threading.Condition()
        self._joining: list[_Sequence] = []
        self._worker: threading.Thread | None = None
        self.steps = 0  # model steps run (for tests and metrics)
        self.max_batch_seen = 0

    def decode(
        self,
        cache,
        first_token: int,
        *,
        max_new_tokens: int,
        eos_ids: set[int] | frozenset[int] = frozenset(),
        sampling: Sampling = Sampling(),
        generator: torch.Generator | None = None,
        on_token: Callable[[int], None] | None = None,
        logits_processor: LogitsProcessor | None = None,
        cancel: threading.Event | None = None,
    ) -> list[int]:
        """Like :func:`agentmem.kv.runner.decode` from an already chosen ``first_token``, but batched with every
        other sequence decoding now; ``on_token`` runs on the calling thread. Call without holding ``lock``.

        Example:
            >>> from agentmem.kv.cache import cache_from_stacked
            >>> from agentmem.kv.runner import prefill
            >>> from agentmem.kv.testing import tiny_causal_lm
            >>> model, _ = tiny_causal_lm("llama")
            >>> cache = cache_from_stacked(torch.zeros(2, 1, 2, 0, 16), torch.zeros(2, 1, 2, 0, 16), capacity=64)
            >>> first = int(prefill(model, cache, [5, 6, 7]).argmax())     # the prompt's next token
            >>> ids = DecodeBatch(model, FairRLock()).decode(cache, first, max_new_tokens=4)
            >>> len(ids) == 4 and ids[0] == first            # no end-of-sequence ids given: all 4 are decoded
            True
        """
        seq = _Sequence(cache, first_token, max_new_tokens, eos_ids, sampling, generator, logits_processor, cancel)
        if not self._take(seq):  # the first token already ends it
            return []
        if on_token is not None:
            on_token(first_token)
        if len(seq.out) >= max_new_tokens:
            return list(seq.out)
        with self._cond:
            self._joining.append(seq)
            self._ensure_worker()
            self._cond.notify_all()
        delivered = len(seq.out)
        while (item := seq.inbox.get()) is not None:  # until the worker lets go of the sequence
            if isinstance(item, BaseException):
                raise item
            if cancel is not None and cancel.is_set():
                continue  # cancelled: what is still queued is never delivered (nor returned)
            delivered += 1
            if on_token is not None:
                on_token(item)
        return seq.out[:delivered]

    @staticmethod
    def _take(seq: _Sequence) -> bool:
        """Add the chosen ``seq.token`` to the answer, unless it ends the answer or the sequence was cancelled."""
        if seq.token in seq.eos_ids or (seq.cancel is not None and seq.cancel.is_set()):
            return False
        seq.out.append(seq.token)
        return True

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._run, name="agentmem-decode", daemon=True)
            self._worker.start()

    def _run(self) -> None:
        """The worker: admit the sequences that joined, run one step for all, hand each its token; repeat."""
        active: list[_Sequence] = []
        while True:
            with self._cond:
                while not active and not self._joining:
                    self._cond.wait()
                active, self._joining = active + self._joining, []
            cancelled = [s for s in active if s.cancel is not None and s.cancel.is_set()]
            for s in cancelled:  # stopped before this step: nothing more is decoded for them
                s.inbox.put(None)
            active = [s for s in active if s not in cancelled]
            if not active:
                continue
            try:
                self._step(active)
            except BaseException as exc:  # the step failed for every sequence in it
                for s in active:
                    s.inbox.put(exc)
                active = []
                continue
            still = []
            for s in active:
                if self._take(s):
                    s.inbox.put(s.token)
                    if len(s.out) < s.max_new_tokens:
                        still.append(s)
                        continue
                s.inbox.put(None)
            active = still

    @torch.no_grad()
    def _step(self, active: list[_Sequence]) -> None:
        """One model step for every active sequence: feed its last token, choose its next one."""
        self.steps += 1
        self.max_batch_seen = max(self.max_batch_seen, len(active))
        ids = torch.tensor([[s.out[-1]] for s in active], dtype=torch.long, device=self.device)
        with self.lock:
            if len(active) == 1:
                logits = self.model(input_ids=ids, cache=active[0].cache, use_cache=True, logits_to_keep=1).logits
            elif self.model.config._attn_implementation == RAGGED_ATTENTION:
                positions = torch.tensor([[s.position()] for s in active], dtype=torch.long, device=self.device)
                logits = self.model(input_ids=ids, position_ids=positions, cache=_RaggedCache([s.cache for s in active]),
                                    use_cache=True, logits_to_keep=1).logits
            else:  # not an SDPA model: one forward per sequence, still one token each per step
                logits = torch.cat([self.model(input_ids=ids[b : b + 1], cache=s.cache, use_cache=True,
                                               logits_to_keep=1).logits for b, s in enumerate(active)])
        for b, s in enumerate(active):
            row = logits[b : b + 1, -1]
            s.token = next_token(processed(row, s.logits_processor, s.out), s.sampling, s.generator, s.out)
