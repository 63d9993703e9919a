"""The engine's turn operation: one turn of a conversation whose KV is kept and reused (``KVEngine.turn``).

A conversation keeps its working KV as stacked buffers ``[preamble][history]`` with room to grow
(:class:`SessionKV`). A turn mounts this turn's memories between the preamble and the history (the history
re-rotated after them), prefills only the tokens that have no KV yet, decodes, and appends the turn::

    [preamble][this turn's memories][history, re-rotated after them][pending + new user message] -> generate

Two steps, so that a caller can make room between them (sessions move other conversations down a tier):
:func:`plan_turn` fits the memories to the model's positions (what the buffers must hold then follows);
``KVEngine.turn(TurnRequest) -> TurnOutput`` loads the memories (the engine's one "stored KV or re-encode"
decision, :meth:`~agentmem.kv.engine.KVEngine.mount_entry`), then, under the engine lock, builds or grows the
buffers and mounts (:func:`mount_turn`); the message is prefilled in the engine's decode steps beside every other
answer (:func:`prefill_turn` with ``engine.decoder.prefill``), the reply decodes in the same batch
(:func:`decode_turn`), and the turn is appended under the lock again (:func:`end_turn`). :func:`begin_turn` is
mount and prefill inline, for a caller that holds the lock. Nothing here knows about tiers, transcripts or leases:
that bookkeeping is :mod:`agentmem.sessions`'.

Modes, all on the same token ids: ``"kv"`` reuses the history KV; ``"history-text"`` mounts the memories' KV
but re-encodes the history; ``"text"`` re-encodes preamble + memories + history + message from scratch.

Example (two turns on a tiny random model: the replies are noise, the KV bookkeeping is real):
    >>> from agentmem.kv.engine import KVEngine
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> from agentmem.kv.types import MemoryItem
    >>> engine = KVEngine(*tiny_causal_lm("llama"))
    >>> memories, ids, kv = [MemoryItem("m1", "Alice lives in Lisbon.")], [], None   # no history yet
    >>> P = len(engine.layout.preamble_ids)
    >>> for message in ("Where does Alice live?", "Since when?"):
    ...     new_ids = engine.layout.suffix_ids(message)          # the user turn and the assistant's opener
    ...     plan = plan_turn(engine, memories, history_len=len(ids), new_len=len(new_ids), max_new_tokens=4)
    ...     kv_len = kv.length - P if kv else 0                  # the history ids that have KV
    ...     out = engine.turn(TurnRequest(plan, new_ids, ids, history=kv, kv_len=kv_len, capacity=256))
    ...     ids, kv = ids + new_ids + out.reply, out.kv
    >>> out.prefilled == len(new_ids)            # the second turn reused the first one's KV: only its message ran
    True
    >>> kv.length == P + len(ids)                # the memory is mounted for each turn, not kept in the history
    True
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from agentmem.errors import InvalidInputError
from agentmem.kv.cache import BufferedCache, cache_from_stacked, cache_layers, cache_length, remove_cache_span
from agentmem.kv.cache import stacked_from_cache
from agentmem.kv.fingerprint import ModelFingerprint
from agentmem.kv.mount import Workspace, assemble, plan_mount
from agentmem.kv.prompt import PromptLayout
from agentmem.kv.rope import rerotate_keys
from agentmem.kv.runner import Sampling, decode, next_token, prefill
from agentmem.kv.streaming import text_callback
from agentmem.kv.types import EncodedEntry, MountChoice, MountMemory

__all__ = [
    "MountedTurn", "SessionKV", "StartedTurn", "TurnEngine", "TurnOutput", "TurnPlan", "TurnRequest", "begin_turn",
    "decode_turn", "end_turn", "mount_turn", "plan_turn", "prefill_turn", "run_turn", "shift_history",
]

_TURN_MODES = ("kv", "history-text", "text")


class TurnEngine(Protocol):
    """What a turn needs of the engine (``agentmem.kv.engine.KVEngine`` is the one): its model and prompt layout,
    the shared preamble's KV, and its one "stored KV or re-encode" decision. Declared here so that this module
    does not import the engine that calls it.

    Example:
        >>> from agentmem.kv.engine import KVEngine
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> engine: TurnEngine = KVEngine(*tiny_causal_lm("llama"))       # the one implementation
        >>> keys, values = engine.preamble_kv()       # [layers, 1, KV heads, preamble tokens, head dim], computed once
        >>> keys.shape[3] == len(engine.layout.preamble_ids), sorted(engine.eos_ids)
        (True, [257])
    """

    model: Any  # the loaded causal LM
    tokenizer: Any
    device: torch.device
    layout: PromptLayout
    max_positions: int
    position_margin: int
    mount_budget: int | None

    @property
    def fingerprint(self) -> ModelFingerprint: ...

    @property
    def inv_freq(self) -> torch.Tensor | None: ...

    @property
    def eos_ids(self) -> list[int]: ...

    def preamble_kv(self) -> tuple[torch.Tensor, torch.Tensor]: ...

    def mount_entry(self, memory: MountMemory, want_ids: list[int], strict: bool, *, mount_trained: bool = True
                    ) -> MountChoice: ...



@dataclass
class SessionKV:
    """Stacked preamble + history KV on one device; the first ``length`` tokens are valid.

    Example:
        >>> kv = SessionKV(torch.zeros(2, 1, 2, 16, 4), torch.zeros(2, 1, 2, 16, 4), 5)
        >>> kv.capacity, kv.length
        (16, 5)
    """

    keys: torch.Tensor  # [L, 1, H, capacity, D]
    values: torch.Tensor
    length: int

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[3])

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def moved(self, device: torch.device | str, *, capacity: int | None = None) -> SessionKV:
        """A copy on ``device`` with room for ``capacity`` tokens (default: exactly ``length``, i.e. compacted)."""
        cap = max(self.length, capacity or self.length)
        shape = (*self.keys.shape[:3], cap, self.keys.shape[4])
        keys = torch.empty(shape, dtype=self.keys.dtype, device=device)
        values = torch.empty(shape, dtype=self.values.dtype, device=device)
        keys[..., : self.length, :].copy_(self.keys[..., : self.length, :])
        values[..., : self.length, :].copy_(self.values[..., : self.length, :])
        return SessionKV(keys, values, self.length)

    def cache(self) -> BufferedCache:
        """A model cache writing straight into these buffers (never grow it past ``capacity``)."""
        return cache_from_stacked(self.keys, self.values, length=self.length, copy=False)

    def owns(self, cache: BufferedCache) -> bool:
        """True if ``cache`` still writes into these buffers (it did not have to grow)."""
        k, _ = cache_layers(cache)[0]
        return k.data_ptr() == self.keys[0].data_ptr()


@dataclass
class TurnPlan:
    """This turn's memories fitted to the model's positions (:func:`plan_turn`), in mount order."""

    memories: list[Any]  # the kept memories (MountMemory), most relevant first
    memory_ids: list[list[int]]  # the token ids each occupies
    dropped: list[str]  # ids of the memories that did not fit
    max_new_tokens: int
    notes: list[str]
    spans: list[tuple[int, int]]  # (start, end) cache positions of each kept memory, back to back after the preamble

    @property
    def memory_tokens(self) -> int:
        return sum(len(x) for x in self.memory_ids)


def plan_turn(
    engine: TurnEngine,
    memories: Sequence[MountMemory],
    *,
    history_len: int,
    new_len: int,
    max_new_tokens: int,
    budget_tokens: int | None = None,
) -> TurnPlan:
    """Which memories fit in front of ``history_len`` history + ``new_len`` new tokens, and the reply's room.

    Every memory is placed by its text's ids (a trained entry's learned KV is not mounted in a turn).

    Example:
        >>> from agentmem.kv.engine import KVEngine
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> from agentmem.kv.types import MemoryItem
        >>> engine = KVEngine(*tiny_causal_lm("llama"))
        >>> memories = [MemoryItem("m1", "Alice lives in Lisbon."), MemoryItem("m2", "Bob lives in Porto.")]
        >>> plan = plan_turn(engine, memories, history_len=120, new_len=14, max_new_tokens=64, budget_tokens=30)
        >>> [m.id for m in plan.memories], plan.dropped, plan.spans      # m1 takes 25 of the 30 tokens allowed
        (['m1'], ['m2'], [(56, 81)])
    """
    P = len(engine.layout.preamble_ids)
    ids = [engine.layout.entry_ids(m.text) for m in memories]
    plan = plan_mount(
        [len(x) for x in ids], preamble_len=P, suffix_len=history_len + new_len, max_new_tokens=max_new_tokens,
        max_positions=int(engine.max_positions), margin=int(engine.position_margin),
        budget_tokens=budget_tokens if budget_tokens is not None else engine.mount_budget,
    )
    kept_ids = [ids[i] for i in plan.keep]
    ends = list(itertools.accumulate((len(x) for x in kept_ids), initial=P))
    return TurnPlan(
        memories=[memories[i] for i in plan.keep], memory_ids=kept_ids,
        dropped=[memories[i].id for i in plan.drop], max_new_tokens=plan.max_new_tokens, notes=list(plan.notes),
        spans=list(zip(ends[:-1], ends[1:])),
    )


@dataclass
class TurnRequest:
    """One turn: the plan, the new message's ids, and the conversation's history (ids + working KV)."""

    plan: TurnPlan
    new_ids: list[int]  # the new user turn (opener + text + assistant opener)
    history_ids: list[int]  # every history token id after the preamble
    history: SessionKV | None = None  # preamble + the first ``kv_len`` history tokens; None: built from the ids
    kv_len: int = 0  # history tokens that have KV in ``history`` (the rest is prefilled with the new message)
    capacity: int = 0  # tokens the working KV is built or grown to when it lacks room
    mode: str = "kv"
    commit: bool = True  # False: a dry run; the working KV keeps its length (writes past it are ignored)
    peek: bool = False  # a baseline dry run: no working KV is read, built or changed
    history_kv: str = "clean"  # "clean": the turn re-encoded without memories; "as_generated": kept, shifted
    sampling: Sampling = field(default_factory=Sampling)
    strict: bool = False
    on_text: Callable[[str], None] | None = None
    workspace: Workspace | None = None  # reused buffers for the prompt cache (history-text / text / memories)
    cancel: threading.Event | None = None  # once set, decoding stops before its next step (a truncated reply)


@dataclass
class TurnOutput:
    """What a turn produced and what it cost (``timings`` in seconds)."""

    reply: list[int]
    text: str
    kv: SessionKV | None  # the working KV after the turn: a new object when built, grown or outgrown
    fresh: bool  # the working KV was built from the history ids this turn
    kv_tokens: int  # history tokens that had KV when the prompt was mounted
    prefilled: int  # tokens run through the model before the first new one (a rebuilt history included)
    fallbacks: list[tuple[str, str]]  # memories mounted from their text, and why
    timings: dict[str, float]  # load, encode, rebuild, mount, prefill, decode, append
    first_token_at: float  # time.perf_counter() when the first new token was chosen (for a caller's TTFT)
    workspace_bytes: int = 0  # the largest prompt cache this turn built in the workspace


def load_memories(engine: TurnEngine, req: TurnRequest, timings: dict[str, float]
                  ) -> tuple[list[EncodedEntry], list[tuple[str, str]]]:
    """Each kept memory's KV, through the engine's one "stored or re-encode" decision (call outside its lock)."""
    entries, fallbacks = [], []
    for memory, ids in zip(req.plan.memories, req.plan.memory_ids):
        choice = engine.mount_entry(memory, ids, req.strict, mount_trained=False)
        mounted = choice.record(memory.id, timings, fallbacks)
        assert mounted  # mount_trained=False: never skipped, at worst re-encoded
        entries.append(choice.entry)
    return entries, fallbacks


@dataclass
class MountedTurn:
    """A turn whose KV is ready and whose memories are mounted (:func:`mount_turn`): what its prefill needs, and
    what :func:`end_turn` needs to append the turn once its reply is decoded."""

    kv: SessionKV | None
    fresh: bool
    kv_len: int
    step: list[int]  # the pending history + the new message (prefilled this turn)
    base: int  # the working KV's length before the turn
    cache: BufferedCache
    own: bool  # the cache writes into ``kv``'s buffers itself
    step_in: list[int]  # the ids the prefill runs (``step``, less what the cache already holds)
    rebuilt_tokens: int
    workspace_bytes: int


@dataclass
class StartedTurn(MountedTurn):
    """A turn between its prefill and its decode (:func:`prefill_turn`): the mounted turn, the first chosen id, and
    when it was chosen."""

    first: int | None  # the first reply id (None: no room to answer)
    prefilled: int
    first_token_at: float


def mount_turn(engine: TurnEngine, req: TurnRequest, entries: list[EncodedEntry],
               timings: dict[str, float]) -> MountedTurn:
    """Ready the working KV and mount the memories in front of the turn (caller holds the engine lock).

    Example (a first turn with no memories; alone here, so no lock is needed):
        >>> from agentmem.kv.engine import KVEngine
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> engine = KVEngine(*tiny_causal_lm("llama"))
        >>> new_ids = engine.layout.suffix_ids("Where is Alice?")
        >>> plan = plan_turn(engine, [], history_len=0, new_len=len(new_ids), max_new_tokens=3)
        >>> mounted = mount_turn(engine, TurnRequest(plan, new_ids, [], capacity=128), [], {})
        >>> mounted.step_in == new_ids, mounted.fresh        # the message is what the prefill runs
        (True, True)
    """
    if req.mode not in _TURN_MODES:
        raise InvalidInputError(f"mode must be one of {_TURN_MODES}")
    t = time.perf_counter()
    kv, fresh, rebuilt_tokens = _ready_kv(engine, req)
    timings["rebuild"] = time.perf_counter() - t
    kv_len = len(req.history_ids) if fresh else (0 if req.peek else req.kv_len)
    step = req.history_ids[kv_len:] + req.new_ids
    base = kv.length if kv is not None else 0
    t = time.perf_counter()
    cache, own, step_in, ws_bytes = _prompt_cache(engine, req, kv, kv_len, entries, step)
    timings["mount"] = time.perf_counter() - t
    return MountedTurn(kv, fresh, kv_len, step, base, cache, own, step_in, rebuilt_tokens, ws_bytes)


def prefill_turn(engine: TurnEngine, req: TurnRequest, mounted: MountedTurn, timings: dict[str, float],
                 prefill_fn: Callable[[BufferedCache, list[int]], torch.Tensor] | None = None) -> StartedTurn:
    """Prefill the mounted turn and choose its first reply id: inline (the caller holds the engine lock), or through
    ``prefill_fn(cache, ids)`` (the engine's ``decoder.prefill``, fed in the decode worker's steps; no lock held).

    Example (alone here, so no lock is needed):
        >>> from agentmem.kv.engine import KVEngine
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> engine = KVEngine(*tiny_causal_lm("llama"))
        >>> ids = engine.layout.suffix_ids("Where is Alice?")
        >>> plan = plan_turn(engine, [], history_len=0, new_len=len(ids), max_new_tokens=3)
        >>> req = TurnRequest(plan, ids, [], capacity=128)
        >>> inline, packed = [prefill_turn(engine, req, mount_turn(engine, req, [], {}), {}, prefill_fn)
        ...                   for prefill_fn in (None, engine.decoder.prefill)]     # inline, then in the worker's steps
        >>> inline.first == packed.first, inline.prefilled == len(ids)
        (True, True)
    """
    t = time.perf_counter()
    if prefill_fn is None:
        logits = prefill(engine.model, mounted.cache, mounted.step_in)
    else:
        logits = prefill_fn(mounted.cache, mounted.step_in)
    first = next_token(logits, req.sampling, req.sampling.generator(engine.device)) \
        if req.plan.max_new_tokens > 0 else None
    t_first = time.perf_counter()
    timings["prefill"] = t_first - t
    return StartedTurn(**vars(mounted), first=first, prefilled=len(mounted.step_in) + mounted.rebuilt_tokens,
                       first_token_at=t_first)


def begin_turn(engine: TurnEngine, req: TurnRequest, entries: list[EncodedEntry],
               timings: dict[str, float]) -> StartedTurn:
    """Ready the KV, mount, prefill and choose the first reply id, all inline (caller holds the engine lock):
    :func:`mount_turn` then :func:`prefill_turn`.

    Example (a first turn with one memory; alone here, so no lock is needed):
        >>> from agentmem.kv.engine import KVEngine
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> from agentmem.kv.types import MemoryItem
        >>> engine = KVEngine(*tiny_causal_lm("llama"))
        >>> memory, new_ids = MemoryItem("m1", "Alice lives in Lisbon."), engine.layout.suffix_ids("Where is Alice?")
        >>> plan = plan_turn(engine, [memory], history_len=0, new_len=len(new_ids), max_new_tokens=3)
        >>> started = begin_turn(engine, TurnRequest(plan, new_ids, [], capacity=128), [engine.encode(memory.text)], {})
        >>> started.prefilled == len(new_ids), type(started.first)    # the message ran; the reply's first id
        (True, <class 'int'>)
        >>> started.own, started.kv.length     # prompt built in a workspace; the working KV still holds the preamble
        (False, 56)
    """
    return prefill_turn(engine, req, mount_turn(engine, req, entries, timings), timings)


def end_turn(engine: TurnEngine, req: TurnRequest, started: StartedTurn, reply: list[int],
             fallbacks: list[tuple[str, str]], timings: dict[str, float]) -> TurnOutput:
    """Append the decoded turn to the working KV (caller holds the engine lock) and report it.

    Example (a first turn, step by step; alone here, so no lock is needed):
        >>> from agentmem.kv.engine import KVEngine
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> engine = KVEngine(*tiny_causal_lm("llama"))
        >>> new_ids, timings = engine.layout.suffix_ids("Hi!"), {}
        >>> plan = plan_turn(engine, [], history_len=0, new_len=len(new_ids), max_new_tokens=3)
        >>> req = TurnRequest(plan, new_ids, [], history=fresh_kv(engine, 128), capacity=128)
        >>> started = begin_turn(engine, req, [], timings)
        >>> reply = decode_turn(engine, req, started, lambda **args: decode(engine.model, started.cache, None,
        ...                     first_token=started.first, **args), timings)
        >>> out = end_turn(engine, req, started, reply, [], timings)
        >>> out.kv.length == 56 + len(new_ids) + len(reply) - 1    # the reply's last id gets its KV next turn
        True
        >>> sorted(timings)
        ['append', 'decode', 'mount', 'prefill', 'rebuild']
    """
    t = time.perf_counter()
    kv = started.kv
    if req.commit:
        kv = _append(engine, req, kv, started.cache, started.own, started.step + reply, started.base, started.kv_len)
        # a cancelled batched decode may have run past what it delivered: the KV keeps only the reply's tokens
        kv.length = min(kv.length, started.base + len(started.step) + len(reply))
    elif kv is not None:
        kv.length = started.base  # a dry run leaves the working KV as it was (writes past the length are ignored)
    del started.cache
    timings["append"] = time.perf_counter() - t
    return TurnOutput(
        reply=list(reply), text=engine.tokenizer.decode(reply, skip_special_tokens=True), kv=kv,
        fresh=started.fresh, kv_tokens=started.kv_len, prefilled=started.prefilled, fallbacks=fallbacks,
        timings=timings, first_token_at=started.first_token_at, workspace_bytes=started.workspace_bytes,
    )


def run_turn(engine: TurnEngine, req: TurnRequest, entries: list[EncodedEntry], fallbacks: list[tuple[str, str]],
             timings: dict[str, float]) -> TurnOutput:
    """The model part of a turn, all under the engine lock the caller holds: ready the KV, mount, prefill, decode
    inline (not batched with other answers), append. ``KVEngine.turn`` prefills and decodes batched instead,
    between :func:`mount_turn` and :func:`end_turn`.

    Example (alone here, so no lock is needed):
        >>> from agentmem.kv.engine import KVEngine
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> engine = KVEngine(*tiny_causal_lm("llama"))
        >>> new_ids = engine.layout.suffix_ids("Hello there")
        >>> req = TurnRequest(plan_turn(engine, [], history_len=0, new_len=len(new_ids), max_new_tokens=4), new_ids,
        ...                   [], capacity=128)
        >>> inline = run_turn(engine, req, [], [], {})
        >>> inline.reply == engine.turn(req).reply        # decoded inline: the same reply as the batched turn
        True
    """
    started = begin_turn(engine, req, entries, timings)
    reply = decode_turn(engine, req, started, lambda **args: decode(
        engine.model, started.cache, None, first_token=started.first, **args), timings)
    return end_turn(engine, req, started, reply, fallbacks, timings)


def decode_turn(engine: TurnEngine, req: TurnRequest, started: StartedTurn, decoder: Callable[..., list[int]],
                timings: dict[str, float]) -> list[int]:
    """The reply's ids after the prefill, from ``decoder(**args)`` with the keyword arguments of
    :func:`agentmem.kv.runner.decode` after its first id (inline there, or batched by the engine's
    :class:`~agentmem.kv.batch.DecodeBatch`); pieces stream to ``req.on_text``.

    Example (a second turn, over a history rebuilt from its ids; alone here, so no lock is needed):
        >>> from agentmem.kv.engine import KVEngine
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> engine, pieces = KVEngine(*tiny_causal_lm("llama")), []
        >>> history = engine.layout.suffix_ids("Hi!") + engine.layout.content_ids("Hello.")
        >>> new_ids = engine.layout.suffix_ids("How are you?")
        >>> req = TurnRequest(plan_turn(engine, [], history_len=len(history), new_len=len(new_ids), max_new_tokens=5),
        ...                   new_ids, history, history=rebuild(engine, history, 128), kv_len=len(history),
        ...                   capacity=128, on_text=pieces.append)      # the reply's text, streamed as it decodes
        >>> started = begin_turn(engine, req, [], {})
        >>> reply = decode_turn(engine, req, started, lambda **a: engine.decoder.decode(started.cache, started.first,
        ...                     **a), {})
        >>> reply[0] == started.first, "".join(pieces) == engine.tokenizer.decode(reply, skip_special_tokens=True)
        (True, True)
    """
    if started.first is None:
        return []
    on_token, flush = text_callback(engine.tokenizer, req.on_text)
    # decode draws from its own generator (as sessions always did: seeded replies stay as they were)
    reply = decoder(on_token=on_token, generator=req.sampling.generator(engine.device),
                    max_new_tokens=req.plan.max_new_tokens, eos_ids=engine.eos_ids, sampling=req.sampling,
                    cancel=req.cancel)
    flush()
    timings["decode"] = time.perf_counter() - started.first_token_at
    return reply


def _ready_kv(engine: TurnEngine, req: TurnRequest) -> tuple[SessionKV | None, bool, int]:
    """The working KV with room for this turn: as given, grown, or rebuilt from the history ids (and their count)."""
    kv = req.history
    if req.peek:
        return None, False, 0
    if kv is None:
        kv = rebuild(engine, req.history_ids, req.capacity)
        return kv, True, kv.length - len(engine.layout.preamble_ids)
    if kv.capacity < req.capacity:
        kv = kv.moved(engine.device, capacity=req.capacity)
    return kv, False, 0


def _prompt_cache(engine: TurnEngine, req: TurnRequest, kv: SessionKV | None, kv_len: int,
                  entries: list[EncodedEntry], step: list[int]) -> tuple[BufferedCache, bool, list[int], int]:
    """The cache to prefill on: straight on the working buffers, or assembled in the workspace.

    Returns the cache, whether it writes into ``kv`` itself, the ids to prefill, and the workspace bytes used.
    """
    pre_k, pre_v = engine.preamble_kv()
    P, plan, inv_freq = pre_k.shape[3], req.plan, engine.inv_freq
    ws = req.workspace if req.workspace is not None else Workspace()
    per_token = _bytes_per_token(pre_k)
    max_new, mem_tokens = plan.max_new_tokens, plan.memory_tokens
    if req.mode == "text":
        full = list(engine.layout.preamble_ids) + [i for ids in plan.memory_ids for i in ids]
        full += req.history_ids + req.new_ids
        cap = len(full) + max_new + 1
        L, _, H, _, D = pre_k.shape
        kb, vb = ws.get(L, H, cap, D, dtype=pre_k.dtype, device=pre_k.device)
        return BufferedCache(kb, vb, 0), False, full, cap * per_token
    if req.mode == "history-text":
        cap = P + mem_tokens + len(req.history_ids) + len(req.new_ids) + max_new + 1
        cache, _ = assemble(pre_k, pre_v, entries, inv_freq, capacity=cap, workspace=ws)
        return cache, False, req.history_ids + req.new_ids, cap * per_token
    assert kv is not None
    if entries:
        hist = [history_entry(engine, kv, req.history_ids, kv_len)] if kv_len else []
        cap = P + mem_tokens + kv_len + len(step) + max_new + 1
        cache, _ = assemble(pre_k, pre_v, entries + hist, inv_freq, capacity=cap, workspace=ws)
        return cache, False, step, cap * per_token
    return kv.cache(), True, step, 0


def _append(engine: TurnEngine, req: TurnRequest, kv: SessionKV | None, cache: BufferedCache, own: bool,
            turn_ids: list[int], base: int, kv_len: int) -> SessionKV | None:
    """Append the turn (pending history + message + reply) to the working KV; returns it (maybe a new object)."""
    assert kv is not None
    if own:
        return adopt(kv, cache)
    P, mem_tokens = len(engine.layout.preamble_ids), req.plan.memory_tokens
    if req.mode == "kv" and req.history_kv == "as_generated":
        _copy_back(engine, kv, cache, base, P + mem_tokens + kv_len, mem_tokens)
        return kv
    # "clean": this turn's tokens as if encoded right after the preamble and the history
    own_cache = kv.cache()
    prefill(engine.model, own_cache, turn_ids)
    return adopt(kv, own_cache)


def _copy_back(engine: TurnEngine, kv: SessionKV, cache: BufferedCache, dst: int, src: int, shift: int) -> None:
    """``as_generated``: move the turn's KV from the workspace into the session, ``shift`` positions back."""
    end = cache_length(cache)
    keys, values = stacked_from_cache(cache, src, end)
    n = end - src
    if shift:
        keys = rerotate_keys(keys, -shift, engine.inv_freq, start=src)
    kv.keys[..., dst : dst + n, :].copy_(keys)
    kv.values[..., dst : dst + n, :].copy_(values)
    kv.length = dst + n


def _bytes_per_token(pre_k: torch.Tensor) -> int:
    L, _, H, _, D = pre_k.shape
    return 2 * L * H * D * pre_k.element_size()


def fresh_kv(engine: TurnEngine, capacity: int) -> SessionKV:
    """Buffers for ``capacity`` tokens holding just the preamble.

    Example:
        >>> from agentmem.kv.engine import KVEngine
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> engine = KVEngine(*tiny_causal_lm("llama"))
        >>> kv = fresh_kv(engine, 256)
        >>> kv.length == len(engine.layout.preamble_ids), kv.capacity
        (True, 256)
    """
    pre_k, pre_v = engine.preamble_kv()
    L, B, H, P, D = pre_k.shape
    cap = max(capacity, P)
    keys = torch.empty((L, B, H, cap, D), dtype=pre_k.dtype, device=pre_k.device)
    values = torch.empty_like(keys)
    keys[..., :P, :].copy_(pre_k)
    values[..., :P, :].copy_(pre_v)
    return SessionKV(keys, values, P)


def rebuild(engine: TurnEngine, history_ids: list[int], capacity: int) -> SessionKV:
    """The working KV re-encoded from scratch: preamble, then every history id (caller holds the engine lock).

    Example:
        >>> from agentmem.kv.engine import KVEngine
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> engine = KVEngine(*tiny_causal_lm("llama"))
        >>> transcript_ids = engine.layout.suffix_ids("Hello") + engine.layout.content_ids("Hi, how can I help?")
        >>> kv = rebuild(engine, transcript_ids, capacity=128)
        >>> kv.length == len(engine.layout.preamble_ids) + len(transcript_ids), kv.capacity
        (True, 128)
    """
    kv = fresh_kv(engine, capacity)
    if history_ids:
        cache = kv.cache()
        prefill(engine.model, cache, history_ids)
        kv = adopt(kv, cache)
    return kv


def adopt(kv: SessionKV, cache: BufferedCache) -> SessionKV:
    """``kv`` with the cache's new length (or a copy of the cache, had it outgrown the buffers)."""
    if kv.owns(cache):
        kv.length = cache_length(cache)
        return kv
    keys, values = stacked_from_cache(cache)
    return SessionKV(keys, values, keys.shape[3])


def history_entry(engine: TurnEngine, kv: SessionKV, ids: Sequence[int], n: int) -> EncodedEntry:
    """The first ``n`` history tokens of ``kv`` as a mountable entry encoded at the preamble offset."""
    P = len(engine.layout.preamble_ids)
    return EncodedEntry(
        token_ids=torch.as_tensor(list(ids[:n]), dtype=torch.long),
        keys=kv.keys[:, 0, :, P : P + n, :],
        values=kv.values[:, 0, :, P : P + n, :],
        offset=P,
        fingerprint=engine.fingerprint.digest,
        preamble_digest=engine.layout.preamble_digest,
    )


def shift_history(kv: SessionKV, start: int, cut: int, inv_freq: torch.Tensor) -> None:
    """Drop the ``cut`` tokens of ``kv`` from position ``start`` in place; the rest moves back exactly.

    Example:
        >>> from agentmem.kv.engine import KVEngine
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> engine = KVEngine(*tiny_causal_lm("llama"))
        >>> kv = rebuild(engine, engine.layout.suffix_ids("one, two, three"), capacity=128)
        >>> n, last_values = kv.length, kv.values[..., kv.length - 1, :].clone()
        >>> shift_history(kv, len(engine.layout.preamble_ids), 7, engine.inv_freq)   # the oldest 7 history tokens leave
        >>> kv.length == n - 7, torch.equal(kv.values[..., kv.length - 1, :], last_values)  # values move unchanged
        (True, True)
    """
    cache = kv.cache()
    remove_cache_span(cache, start, start + cut, inv_freq)
    kv.length = cache_length(cache)
