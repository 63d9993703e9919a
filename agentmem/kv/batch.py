"""Continuous batching across requests: many answers advance one token each per model step, and the prompts
waiting to be prefilled ride in the same steps.

Requests that answer at the same time each mount their own memories, so their caches differ in content and length.
:class:`DecodeBatch` runs their decode steps together on one worker thread: a step feeds every active sequence's
last token as one ``[B, 1]`` batch, so the weights are read once per step for all of them (on CPU a step costs
about the same for 1 sequence as for 8). A prompt (a request's question and the chat template's end, on top of its
mounted memories) is handed to the same worker (:meth:`DecodeBatch.prefill`) and fed in the next step beside the
decoding rows: the step is then one row of tokens, each sequence's last token followed by each prompt's next chunk
(at most ``step_tokens`` in all, so a long text-mode prompt is fed over several steps and the answers beside it wait
one such step at most for their next token, never the whole prefill). A prompt fed to its end gets its next-token
logits back; its caller chooses the first token and joins the decoding rows. Sequences leave when they end, hit
their limit, or are cancelled: no answer waits for another to finish.

How the batch attends without padding: each sequence keeps its own cache. The model's attention implementation is set
once, when the batch is made, to ``agentmem_ragged`` (registered here through ``transformers.AttentionInterface`` and
``AttentionMaskInterface``, the hooks its own continuous batching uses for paged attention). For every ordinary
forward (a lone prompt, an encode, a one-sequence step, a forward by other code on the same model) it gives
transformers' SDPA attention's results with SDPA's causal mask (grouped key/value heads are read in place where
transformers would copy them: :mod:`agentmem.kv.grouped_sdpa`). Only a batched step is different, and it says so by
the cache it passes: in a decode step :class:`_RaggedCache` appends row ``b``'s new key/value to sequence ``b``'s
cache and hands the attention each row's keys alone; in a packed step (prompts in it) :class:`_PackedCache` does the
same for each sequence's span of the row, and the attention runs SDPA per span, causal within a prompt's chunk.
Projections, MLPs and the output head run over every token at once; each token gets explicit position ids (its own
sequence's cache length onward), so RoPE positions are exact, and no token ever sees another sequence's keys or a
padded slot. The output head runs on each span's last token only (``logits_to_keep`` as indices). A step with one
sequence, or a lone prompt with nothing decoding, runs the plain model forward, so a lone request answers exactly as
unbatched.

Why set once rather than per step: the attention is chosen from ``model.config`` on every forward, and the config
is shared by every thread using the model. Switching it for the length of a batched step (as this module once did)
let a prefill that ran meanwhile attend without its causal mask (issue #40: a turn's first token 239 where the
reference gave 92). Nothing here changes the model's config after the batch is made. A model whose attention is not
SDPA (e.g. eager for Gemma 2's soft-capping) is left as loaded; its answers decode one forward per sequence per step,
and its prompts prefill one at a time under the model's lock.

Why packed rather than padded: a prompt of 19 tokens beside 16 one-token rows would pad those rows to 19 columns;
packed, the step computes 35 tokens and reads the weights once for both jobs (this replaced a separate left-padded
prefill forward, ``kv/prefill.py``, which held the model for a whole long prompt).

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
import itertools
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from agentmem.kv.grouped_sdpa import grouped_sdpa_attention_forward
from agentmem.kv.runner import LogitsProcessor, Sampling, next_token, prefill, processed

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

    @property
    def busy(self) -> bool:
        """Whether any thread holds the lock or waits for it."""
        with self._cond:
            return self._owner is not None or bool(self._waiting)

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


class _Segments(_Rows):
    """The keys (or values) of a packed step: ``rows[j]`` is sequence ``j``'s whole cache once this step's tokens
    are in it, and ``spans[j]`` the step's columns that are sequence ``j``'s queries."""

    def __init__(self, rows: list[torch.Tensor], spans: list[tuple[int, int]]) -> None:
        super().__init__(rows)
        self.spans = spans


class _PackedCache(_RaggedCache):
    """What the model sees as the cache of a packed step (one row of tokens from many sequences): the step's
    columns ``spans[j]`` append to, and read, sequence ``j``'s cache."""

    def __init__(self, caches: Sequence, lengths: Sequence[int]) -> None:
        super().__init__(caches)
        ends = list(itertools.accumulate(lengths))
        self.spans = [(end - n, end) for end, n in zip(ends, lengths)]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = [], []
        for cache, (start, end) in zip(self.caches, self.spans):
            k, v = cache.layers[layer_idx].update(key_states[:, :, start:end], value_states[:, :, start:end])
            keys.append(k)
            values.append(v)
        return _Segments(keys, self.spans), _Segments(values, self.spans)


def _tail_causal_mask(queries: int, keys: int, device) -> torch.Tensor:
    """``[1, 1, queries, keys]``: the last ``queries`` positions of a ``keys``-long sequence, each seeing the keys
    up to itself (SDPA's own ``is_causal`` aligns to the top left, which is wrong on a non-empty cache)."""
    last_seen = keys - queries + torch.arange(queries, device=device)
    return (torch.arange(keys, device=device)[None, :] <= last_seen[:, None])[None, None]


def _ragged_attention(module, query: torch.Tensor, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention (grouped key/value heads read in place where a mask allows it on the CPU:
    :mod:`agentmem.kv.grouped_sdpa`, same results); in a batched step (its keys come as :class:`_Rows`), row by
    row, each row on its own sequence's keys and values; in a packed step (:class:`_Segments`), segment by segment,
    causal within a segment of several tokens."""
    if isinstance(key, _Segments):
        outs = []
        for (start, end), k, v in zip(key.spans, key.rows, value.rows):
            mask = None if end - start == 1 else _tail_causal_mask(end - start, k.shape[2], query.device)
            outs.append(grouped_sdpa_attention_forward(module, query[:, :, start:end], k, v, mask, **kwargs)[0])
        return torch.cat(outs, dim=1), None
    if not isinstance(key, _Rows):  # any ordinary forward: the stock SDPA path's results
        return grouped_sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    outs = [grouped_sdpa_attention_forward(module, query[b : b + 1], k, v, None, **kwargs)[0]
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


@dataclass(eq=False)
class _Prompt:
    """A prompt to prefill in the worker's steps: fed in chunks beside the decoding rows, its last position's
    logits handed back when the whole of it is in its cache."""

    cache: object
    ids: list[int]
    fed: int = 0  # ids already in the cache
    logits: torch.Tensor | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def left(self) -> int:
        return len(self.ids) - self.fed


class DecodeBatch:
    """Decodes every submitted sequence together, one token each per step, on one worker thread; prompts submitted
    through :meth:`prefill` are fed in the same steps.

    ``lock`` is the model's lock (a :class:`FairRLock`): each step holds it, so other model work (an encode, a
    session turn's mount) runs between two steps, in arrival order. ``step_tokens`` caps the tokens of one packed
    step (decoding rows plus prompt chunks): a long prompt is fed over several steps, so the answers decoding
    beside it wait at most one such step for their next token.
    """

    def __init__(self, model, lock: FairRLock, *, step_tokens: int = 256) -> None:
        self.model = model
        self.lock = lock
        self.step_tokens = step_tokens
        self.device = next(model.parameters()).device
        _use_ragged_attention(model)  # once, here: never switched per step (see the module docstring)
        # prompts ride in the decode steps only on the ragged attention (an SDPA model); others prefill alone
        self.packs_prompts = model.config._attn_implementation == RAGGED_ATTENTION
        self._cond = threading.Condition()
        self._joining: list[_Sequence] = []
        self._prompts: list[_Prompt] = []
        self._pending = 0
        self._worker: threading.Thread | None = None
        self.steps = 0  # model steps run (for tests and metrics)
        self.max_batch_seen = 0
        self.max_prompts_seen = 0  # the most prompts fed in one step

    @property
    def pending(self) -> int:
        """Prompts submitted whose logits are not back yet (queued, or in a step)."""
        with self._cond:
            return self._pending

    def prefill(self, cache, ids: Sequence[int]) -> torch.Tensor:
        """Append ``ids`` to ``cache`` in the worker's next steps, beside the sequences decoding then; the last
        position's logits ``[1, vocab]``. Call without holding ``lock``. A model not on the ragged attention
        prefills here, alone, under the lock.

        Example:
            >>> from agentmem.kv.engine import KVEngine
            >>> from agentmem.kv.testing import tiny_causal_lm
            >>> engine = KVEngine(*tiny_causal_lm("llama"))
            >>> prep = engine.prepare("Where does Alice live?", [])     # the cached preamble; the question pending
            >>> logits = engine.decoder.prefill(prep.cache, prep.pending_ids)
            >>> logits.shape == (1, len(engine.tokenizer)), prep.cache.get_seq_length() == prep.prompt_tokens
            (True, True)
        """
        job = _Prompt(cache, list(ids))
        if not job.ids:
            raise ValueError("nothing to prefill")
        if not self.packs_prompts:
            with self.lock:
                return prefill(self.model, cache, job.ids)[-1:]
        with self._cond:
            self._prompts.append(job)
            self._pending += 1
            self._ensure_worker()
            self._cond.notify_all()
        job.done.wait()
        with self._cond:
            self._pending -= 1
        if job.error is not None:
            raise job.error
        assert job.logits is not None
        return job.logits

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
        """The worker: admit the sequences and prompts that joined, run one step for all, hand each its token (or
        its logits, once a prompt is all fed); repeat."""
        active: list[_Sequence] = []
        prompts: list[_Prompt] = []
        while True:
            with self._cond:
                while not active and not prompts and not self._joining and not self._prompts:
                    self._cond.wait()
                active, self._joining = active + self._joining, []
                prompts, self._prompts = prompts + self._prompts, []
            cancelled = [s for s in active if s.cancel is not None and s.cancel.is_set()]
            for s in cancelled:  # stopped before this step: nothing more is decoded for them
                s.inbox.put(None)
            active = [s for s in active if s not in cancelled]
            if not active and not prompts:
                continue
            try:
                self._step(active, prompts)
            except BaseException as exc:  # the step failed for every sequence and prompt in it
                for s in active:
                    s.inbox.put(exc)
                for p in prompts:
                    p.error = exc
                    p.done.set()
                active, prompts = [], []
                continue
            for p in prompts:
                if p.left == 0:
                    p.done.set()
            prompts = [p for p in prompts if p.left > 0]
            active = self._hand_tokens(active)

    def _hand_tokens(self, active: list[_Sequence]) -> list[_Sequence]:
        """Give each sequence its chosen token; the sequences that go on decoding."""
        still = []
        for s in active:
            if self._take(s):
                s.inbox.put(s.token)
                if len(s.out) < s.max_new_tokens:
                    still.append(s)
                    continue
            s.inbox.put(None)
        return still

    @torch.no_grad()
    def _step(self, active: list[_Sequence], prompts: list[_Prompt]) -> None:
        """One model step for every active sequence (feed its last token, choose its next one) and the next chunk
        of each waiting prompt, as far as ``step_tokens`` allows."""
        self.steps += 1
        self.max_batch_seen = max(self.max_batch_seen, len(active))
        with self.lock:
            if prompts and not active and len(prompts) == 1:  # a lone prompt: the plain forward, as unbatched
                lone = prompts[0]  # what is left of it: an earlier packed step may have fed its first chunk
                lone.logits = prefill(self.model, lone.cache, lone.ids[lone.fed:])[-1:]
                lone.fed = len(lone.ids)
                logits = None
            elif prompts:
                logits = self._packed_forward(active, prompts)
            else:
                logits = self._decode_forward(active)
        for b, s in enumerate(active):
            row = logits[b : b + 1]
            s.token = next_token(processed(row, s.logits_processor, s.out), s.sampling, s.generator, s.out)

    def _decode_forward(self, active: list[_Sequence]) -> torch.Tensor:
        """``[len(active), vocab]``: each sequence's next-token logits after its last token."""
        ids = torch.tensor([[s.out[-1]] for s in active], dtype=torch.long, device=self.device)
        if len(active) == 1:
            return self.model(input_ids=ids, cache=active[0].cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        if self.model.config._attn_implementation == RAGGED_ATTENTION:
            positions = torch.tensor([[s.position()] for s in active], dtype=torch.long, device=self.device)
            return self.model(input_ids=ids, position_ids=positions, cache=_RaggedCache([s.cache for s in active]),
                              use_cache=True, logits_to_keep=1).logits[:, -1]
        # not an SDPA model: one forward per sequence, still one token each per step
        return torch.cat([self.model(input_ids=ids[b : b + 1], cache=s.cache, use_cache=True,
                                     logits_to_keep=1).logits[:, -1] for b, s in enumerate(active)])

    def _packed_forward(self, active: list[_Sequence], prompts: list[_Prompt]) -> torch.Tensor:
        """One forward over a single row of tokens: each active sequence's last token, then the next chunk of each
        prompt (in arrival order, up to ``step_tokens`` in all). Every token gets its own sequence's position and
        attends to its own sequence's cache alone (:class:`_PackedCache`), so nothing pads and the weights are read
        once for decoding and prefilling both. Returns the active sequences' logits ``[len(active), vocab]``; a
        prompt fed to its end gets its own in ``logits``."""
        budget = max(1, self.step_tokens - len(active))
        chunks: list[tuple[_Prompt, int]] = []
        for p in prompts:
            n = min(p.left, budget)
            if n == 0:
                break
            chunks.append((p, n))
            budget -= n
        self.max_prompts_seen = max(self.max_prompts_seen, len(chunks))
        ids = [s.out[-1] for s in active] + [t for p, n in chunks for t in p.ids[p.fed : p.fed + n]]
        starts = [s.position() for s in active] + [int(p.cache.get_seq_length()) for p, _ in chunks]
        lengths = [1] * len(active) + [n for _, n in chunks]
        positions = torch.cat([torch.arange(a, a + n) for a, n in zip(starts, lengths)]).to(self.device)
        cache = _PackedCache([s.cache for s in active] + [p.cache for p, _ in chunks], lengths)
        keep = torch.tensor([end - 1 for _, end in cache.spans], device=self.device)  # each span's last token
        logits = prefill(self.model, cache, torch.tensor([ids], device=self.device), position_ids=positions[None],
                         logits_to_keep=keep)
        for j, (p, n) in enumerate(chunks):
            p.fed += n
            if p.left == 0:
                p.logits = logits[len(active) + j : len(active) + j + 1]
        return logits[: len(active)]
