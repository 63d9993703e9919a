"""A conversation whose working KV is reused across turns, and the result of one turn.

A turn (:meth:`Session.send`): scan the user text for secrets, restore the session's KV to the hot tier if it
left, drop it if stale, make room under ``session_max_tokens``, recall memories (not the turns already in the
working cache), plan them against the model's positions and make room in the hot tier; then the engine's turn
operation (``KVEngine.turn``, :mod:`agentmem.kv.turn`) mounts, under the engine lock::

    [preamble][this turn's memories][history, re-rotated after them][pending + new user message] -> generate

prefilling only the new tokens, and appends the turn to the working KV; finally the turn joins the transcript
and both messages are stored as long-term memories. The session does the bookkeeping only (tiers, transcript,
leases, through the manager's public methods); the model work is the engine's. See ``docs/sessions.md`` for why
the layout is this one.

Example:
    >>> from agentmem import AgentMemory
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> mem = AgentMemory("./memdata", model=tiny_causal_lm("llama"))   # any (model, tokenizer); default SmolLM2
    >>> chat = mem.session("s1", user_id="u1")
    >>> r1 = chat.send("Remember that my sister is called Inès.", k=4, max_new_tokens=8)
    >>> r2 = chat.send("What is my sister called?", k=4, max_new_tokens=8)
    >>> r2.reused_tokens > 0          # the first turn's KV was kept, not re-encoded
    True
    >>> mem.close()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentmem.errors import InvalidInputError
from agentmem.kv.mount import Workspace
from agentmem.kv.runner import Sampling
from agentmem.kv.turn import SessionKV, TurnOutput, TurnRequest, plan_turn, shift_history
from agentmem.sessions.slot import SessionSlot
from agentmem.sessions.state import Transcript, Turn
from agentmem.sessions.tiers import Tier
from agentmem.sessions.turn import EngineContext
from agentmem.validation import check_generation, check_text

__all__ = ["Session", "SessionHost", "TopicSwitch", "TurnResult"]

log = logging.getLogger(__name__)
_MODES = ("kv", "history-text", "text")
_GROW_TOKENS = 128  # capacity is rounded up to this many tokens so most turns append without reallocating
_TIMINGS = ("scan", "make_room", "restore", "retrieve", "load", "encode", "rebuild", "mount", "prefill", "ttft",
            "decode", "append", "remember", "total")  # TurnResult.timings, in seconds


class TopicSwitch(Protocol):
    """Decides whether a message leaves the topic of the recent user turns (e.g.
    :class:`~agentmem.sessions.topic.TopicDetector`).

    Example:
        >>> from agentmem.sessions.topic import TopicDetector
        >>> detector: TopicSwitch = TopicDetector(mem.embed, threshold=0.2)     # mem's embedder
        >>> hikes = ["I love hiking in the Alps", "The trails near Chamonix are great"]
        >>> detector.switched("How do I file my quarterly tax return?", hikes)
        True
        >>> detector.switched("Which mountain trail is the steepest?", hikes)
        False
    """

    def switched(self, message: str, recent: Sequence[str]) -> bool: ...


class SessionHost(Protocol):
    """What a :class:`Session` needs of its manager (:class:`~agentmem.sessions.manager.SessionManager` is the one):
    declared here so the session does not import the manager that creates it. Every method but ``check_open``,
    ``register``, ``scan``, ``context``, ``settle`` and ``end`` expects the caller to hold the session's lock.

    Example:
        >>> host: SessionHost = mem.sessions             # a SessionManager
        >>> chat = Session(host, "s1", "u1", key="u1/s1")         # the cold store's '<folder>/<name>'
        >>> host.register(chat)
        >>> chat.send("Hello.", max_new_tokens=1).prompt_tokens > 0, host.get("s1", user_id="u1") is chat
        (True, True)
    """

    config: Any  # a MemoryConfig
    history_kv: str  # "clean" or "as_generated" (TurnRequest.history_kv)
    topic: TopicSwitch | None
    hot: Tier
    workspace: Workspace
    retrieve: Callable[..., list[Any]]
    remember_turn: Callable[[str, str, str, str], Any]
    scan: Callable[[str], str]

    def check_open(self) -> None: ...
    def register(self, s: Session) -> None: ...
    def serve(self, s: Session) -> None: ...
    def context(self) -> EngineContext: ...
    def limit(self, ctx: EngineContext) -> int: ...
    def count(self, name: str, n: int = 1) -> None: ...
    def end_turn(self, s: Session, *, changed: bool) -> None: ...
    def settle(self) -> None: ...
    def end(self, session_id: str, *, user_id: str | None = None) -> bool: ...
    def read_transcript(self, s: Session) -> Transcript | None: ...
    def reset_session(self, s: Session) -> None: ...
    def bring_hot(self, s: Session, ctx: EngineContext, extra: int = ...) -> tuple[str | None, float, float]: ...
    def validate(self, s: Session, ctx: EngineContext) -> str | None: ...
    def validity_key(self, ctx: EngineContext) -> dict[str, Any]: ...
    def hot_kv(self, s: Session) -> SessionKV | None: ...
    def put_hot(self, s: Session, kv: SessionKV) -> None: ...
    def fit(self, tier: Tier, *, incoming: int = 0, exclude: Session | None = None) -> None: ...
    def drop_kv(self, s: Session) -> bool: ...
    def note_workspace(self, nbytes: int) -> None: ...


@dataclass
class TurnResult:
    """The reply and what it cost.

    ``reused_tokens``: history tokens whose cached KV was reused instead of re-encoded. ``prefilled_tokens``: tokens
    run through the model before the first new token. ``timings`` (seconds): ``scan``, ``make_room`` (moving other
    sessions down to make room), ``restore`` (this session's KV back to the device, and validating it), ``retrieve``,
    ``load``, ``encode``, ``rebuild``, ``mount``, ``prefill``, ``ttft`` (send start to first token), ``decode``,
    ``append``, ``remember``, ``total``. ``spans``: each mounted memory's ``(start, end)`` cache positions, in
    ``mounted`` order (the same in every mode: memories sit back to back after the preamble).
    """

    text: str
    token_ids: list[int]
    mounted: list[str]
    dropped: list[str]
    reused_tokens: int
    prefilled_tokens: int
    prompt_tokens: int
    timings: dict[str, float]
    mode: str = "kv"
    restored_from: str | None = None
    rebuilt: str | None = None
    evicted_turns: int = 0
    records: list[str] = field(default_factory=list)
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)  # (start, end) cache positions of each mounted memory
    max_new_tokens: int = 0  # the reply's length limit after clamping to the room left in the model's context


def _check_send(text: str, mode: str, k: int, entry_ids: Sequence[str] | None) -> list[str] | None:
    """Check ``send``'s own arguments before anything is touched; returns ``entry_ids`` as a list (or None)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("message text must be a non-empty string")
    if mode not in _MODES:
        raise InvalidInputError(f"mode must be one of {_MODES}")
    if not isinstance(k, int) or k < 0:
        raise InvalidInputError("k must be an int >= 0")
    if entry_ids is not None:
        if isinstance(entry_ids, str) or not all(isinstance(i, str) for i in entry_ids):
            raise InvalidInputError("entry_ids must be a list of entry id strings")
        entry_ids = list(entry_ids)
    check_text(text, "message text")
    return entry_ids


class Session:
    """One conversation of one user; get it from ``mem.session(session_id, user_id=...)``."""

    def __init__(self, manager: SessionHost, session_id: str, user_id: str, key: str) -> None:
        self.session_id = session_id
        self.user_id = user_id
        self._mgr = manager
        self.slot = SessionSlot(key)  # the manager's bookkeeping: tier, transcript, versions, lease, lock (slot.py)

    def __repr__(self) -> str:
        return f"Session({self.session_id!r}, user_id={self.user_id!r}, tier={self.slot.tier!r})"

    # -- inspection -------------------------------------------------------------------------------------
    @property
    def tier(self) -> str | None:
        """Where the working KV is now: ``"hot"``, ``"warm"``, ``"cold"``, or None (none cached)."""
        return self.slot.tier

    def history(self) -> list[dict[str, str]]:
        """The turns still in the working cache, as chat messages (the user text as scanned)."""
        with self.slot.lock:
            st = self._mgr.read_transcript(self)
            out: list[dict[str, str]] = []
            for t in st.turns if st else []:
                out += [{"role": "user", "content": t.user}, {"role": "assistant", "content": t.reply}]
            return out

    @property
    def tokens(self) -> int:
        """History tokens in the working cache (0 while on disk)."""
        st = self.slot.state
        return len(st.ids) if st else 0

    # -- lifecycle --------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Start a new topic: drop the working KV and turns from every tier (long-term memories stay)."""
        with self.slot.lock:
            self._mgr.reset_session(self)

    def end(self) -> bool:
        """Erase this session now (same as ``mem.sessions.end(session_id, user_id=...)``)."""
        return self._mgr.end(self.session_id, user_id=self.user_id)

    # -- a turn -----------------------------------------------------------------------------------------
    def send(
        self,
        text: str,
        *,
        k: int = 4,
        max_new_tokens: int = 64,
        mode: str = "kv",
        budget_tokens: int | None = None,
        remember: bool = True,
        commit: bool = True,
        strict: bool | None = None,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        entry_ids: Sequence[str] | None = None,
        on_text: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
        repetition_penalty: float | None = None,
    ) -> TurnResult:
        """Answer ``text`` in this conversation. Sampling settings left None are the model's own
        (``generation_config``; greedy for a model without one).

        ``entry_ids`` mounts exactly those memories of this user, in that order (``k`` is then ignored; ids of
        other users, expired ones and turns already in the working cache are left out) — for a caller that chose
        them itself, such as a LangGraph memory node.

        ``k`` memories are recalled (never turns already in the working cache) and mounted as stored KV. Baselines
        on the same ids: ``mode="history-text"`` mounts the memories' KV but re-encodes the history instead of
        reusing it (what a turn costs without sessions); ``mode="text"`` re-encodes preamble + memories + history
        + message from scratch. ``commit=False`` answers without changing the session or storing anything (a dry
        run; with a baseline mode it reads the transcript only and moves nothing between tiers).
        ``remember=False`` keeps the turn in the session but does not store it as long-term memories.
        ``on_text`` receives each piece of the reply as soon as it is decoded (streaming), on this thread.
        Setting ``cancel`` (from any thread) stops decoding before its next step; the turn keeps the reply so far.
        """
        entry_ids = _check_send(text, mode, k, entry_ids)
        check_generation(max_new_tokens=max_new_tokens, budget_tokens=budget_tokens, temperature=temperature,
                         top_p=top_p, seed=seed, do_sample=do_sample, repetition_penalty=repetition_penalty)
        asked = dict(do_sample=do_sample, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                     repetition_penalty=repetition_penalty)
        mgr = self._mgr
        strict = mgr.config.strict_fingerprint if strict is None else strict
        t0 = time.perf_counter()
        tm = dict.fromkeys(_TIMINGS, 0.0)
        with self.slot.lock:
            mgr.check_open()
            mgr.register(self)
            mgr.serve(self)  # one worker serves a session at a time (waits, or raises SessionBusyError)
            user_text = mgr.scan(text)  # before anything is encoded: secrets never enter the session KV
            tm["scan"] = time.perf_counter() - t0
            ctx = mgr.context()
            if mode != "text":
                ctx.require_kv()
            sampling = Sampling.for_model(ctx.engine.model, **asked)
            if commit:
                self._follow_topic(user_text)
            self.slot.busy = True
            try:
                result = self._turn(ctx, user_text, k, max_new_tokens, mode, budget_tokens, remember, commit,
                                    strict, sampling, tm, t0, entry_ids, on_text, cancel)
            finally:
                mgr.end_turn(self, changed=mode == "kv" or commit)  # a baseline dry run only read the transcript
            mgr.settle()
        result.timings["total"] = time.perf_counter() - t0
        return result

    def _turn(self, ctx: EngineContext, user_text: str, k: int, max_new_tokens: int, mode: str,
              budget_tokens: int | None, remember: bool, commit: bool, strict: bool, sampling: Sampling,
              tm: dict[str, float], t0: float, chosen_ids: list[str] | None = None,
              on_text: Callable[[str], None] | None = None, cancel: threading.Event | None = None) -> TurnResult:
        """The bookkeeping around the engine's turn operation (:meth:`~agentmem.kv.KVEngine.turn`)."""
        mgr, P, notes = self._mgr, ctx.preamble_len, []
        # a baseline dry run needs no working KV: it only reads the transcript and moves nothing between tiers
        peek = mode != "kv" and not commit
        st, new_ids, max_new, restored_from, rebuilt, evicted = self._ready(ctx, user_text, max_new_tokens, peek,
                                                                            commit, notes, tm)
        t = time.perf_counter()
        if chosen_ids is not None:
            memories = self._chosen(chosen_ids, st, strict)
        else:
            memories = self._recall(user_text, st, k, strict) if k > 0 else []
        tm["retrieve"] = time.perf_counter() - t
        plan = plan_turn(ctx.engine, memories, history_len=len(st.ids), new_len=len(new_ids),
                         max_new_tokens=max_new, budget_tokens=budget_tokens)
        notes += plan.notes
        kv, capacity = self._room(ctx, st, len(new_ids), plan.max_new_tokens, peek, tm)
        out = ctx.engine.turn(TurnRequest(
            plan, new_ids, st.ids, history=kv, kv_len=st.kv_len, capacity=capacity, mode=mode, commit=commit,
            peek=peek, history_kv=mgr.history_kv, sampling=sampling, strict=strict, on_text=on_text,
            workspace=mgr.workspace, cancel=cancel,
        ))
        tm.update(out.timings)
        tm["ttft"] = out.first_token_at - t0
        mgr.note_workspace(out.workspace_bytes)
        if out.kv is not None and out.kv is not kv:
            mgr.put_hot(self, out.kv)  # built, grown, or outgrown: the hot tier holds the new buffers
        if out.fresh:
            if st.ids:
                rebuilt = rebuilt or "no cached KV"
                mgr.count("rebuilds", 1)
            st.key = mgr.validity_key(ctx)
            st.kv_len = out.kv.length - P
        prompt_tokens = P + plan.memory_tokens + len(st.ids) + len(new_ids)
        records = self._commit(st, P, user_text, new_ids, out, remember, notes, tm) if commit else []
        return TurnResult(
            text=out.text, token_ids=list(out.reply), mounted=[m.id for m in plan.memories], dropped=plan.dropped,
            reused_tokens=0 if rebuilt else out.kv_tokens, prefilled_tokens=out.prefilled,
            prompt_tokens=prompt_tokens, timings=tm, mode=mode, restored_from=restored_from, rebuilt=rebuilt,
            evicted_turns=evicted, records=records, fallbacks=out.fallbacks, notes=notes, spans=plan.spans,
            max_new_tokens=plan.max_new_tokens,
        )

    # -- helpers (caller holds the session lock) --------------------------------------------------------
    def _follow_topic(self, user_text: str) -> None:
        """Reset the session first when ``user_text`` leaves the topic of its turns (the manager's ``topic``, if any)."""
        topic, st = self._mgr.topic, self.slot.state  # topic: None unless the config sets topic_switch_threshold
        if topic is not None and st is not None and st.turns and topic.switched(user_text, [t.user for t in st.turns]):
            self.reset()  # the old topic's working KV stops being mounted; its turns stay long-term memories
            self._mgr.count("topic_switches", 1)

    def _ready(self, ctx: EngineContext, user_text: str, max_new_tokens: int, peek: bool, commit: bool,
               notes: list[str], tm: dict[str, float]) -> tuple[Transcript, list[int], int, str | None, str | None, int]:
        """The session's KV on the model's device, valid, with room for this turn under the session limit.

        Returns the transcript, the new message's ids, the reply's room, where the KV was restored from, why it
        must be rebuilt (None: it need not), and how many of the oldest turns left to make room.
        """
        mgr, chat = self._mgr, ctx.chat
        t = time.perf_counter()
        restored_from: str | None = None
        rebuilt: str | None = None
        if peek:
            st = self._peek_transcript()
        else:
            extra = len(chat.content_ids(user_text)) + max_new_tokens + 64
            restored_from, _, tm["make_room"] = mgr.bring_hot(self, ctx, extra=extra)
            st = self.slot.state
            assert st is not None
            rebuilt = mgr.validate(self, ctx)
        tm["restore"] = time.perf_counter() - t - tm["make_room"]
        limit = mgr.limit(ctx)
        new_ids = chat.user_turn_ids(user_text, first=not st.turns)
        if len(new_ids) >= limit:
            raise InvalidInputError(f"the message is {len(new_ids)} tokens; a session holds at most {limit}")
        max_new = min(max_new_tokens, limit - len(new_ids))
        if max_new < max_new_tokens:
            notes.append(f"max_new_tokens reduced from {max_new_tokens} to {max_new} to fit the session limit")
        if not commit and len(st.ids) + len(new_ids) > limit:
            raise InvalidInputError("a dry run (commit=False) cannot make room: the message does not fit the session")
        evicted = self._evict(ctx, st, len(new_ids) + max_new, limit) if commit else 0
        if evicted:
            new_ids = chat.user_turn_ids(user_text, first=not st.turns)
            if mgr.hot_kv(self) is None and st.ids:
                rebuilt = rebuilt or "oldest turns left and the template needs another opener"
        max_new = max(0, min(max_new, limit - len(st.ids) - len(new_ids)))
        return st, new_ids, max_new, restored_from, rebuilt, evicted

    def _room(self, ctx: EngineContext, st: Transcript, new_len: int, max_new: int, peek: bool,
              tm: dict[str, float]) -> tuple[SessionKV | None, int]:
        """This session's hot KV and the capacity its buffers need for the turn; other sessions move down first.

        Room is made here, outside the engine lock, before the engine grows or rebuilds the buffers.
        """
        if peek:
            return None, 0
        need = ctx.preamble_len + len(st.ids) + new_len + max_new + 1
        kv = self._mgr.hot_kv(self)
        if kv is not None and kv.capacity >= need:
            return kv, kv.capacity
        capacity = -(-(need + _GROW_TOKENS // 2) // _GROW_TOKENS) * _GROW_TOKENS
        t = time.perf_counter()
        self._mgr.fit(self._mgr.hot, incoming=(capacity - (kv.capacity if kv else 0)) * ctx.bytes_per_token,
                      exclude=self)
        tm["make_room"] += time.perf_counter() - t
        return kv, capacity

    def _commit(self, st: Transcript, preamble_len: int, user_text: str, new_ids: list[int], out: TurnOutput,
                remember: bool, notes: list[str], tm: dict[str, float]) -> list[str]:
        """Add the turn to the transcript (its KV is in the working buffers now); store it long-term if asked."""
        mgr = self._mgr
        start = len(st.ids)
        st.ids += new_ids + out.reply
        assert out.kv is not None
        st.kv_len = out.kv.length - preamble_len
        turn = Turn(user=user_text, reply=out.text, start=start, end=len(st.ids), at=time.time())
        st.turns.append(turn)
        mgr.count("turns", 1)
        self.slot.tier = "hot"
        mgr.hot.note_bytes()
        records: list[str] = []
        if remember:
            t = time.perf_counter()
            records = self._remember(user_text, out.text, notes)
            turn.record_ids = records
            tm["remember"] = time.perf_counter() - t
        return records

    def _peek_transcript(self) -> Transcript:
        """The transcript without restoring anything (read from the file if the session is on disk)."""
        st = self._mgr.read_transcript(self)
        return st if st is not None else Transcript(self.session_id, self.user_id)

    def _evict(self, ctx: EngineContext, st: Transcript, need: int, limit: int) -> int:
        """Drop the oldest turns until ``need`` more tokens fit; the rest of the KV moves back exactly."""
        if len(st.ids) + need <= limit or not st.turns:
            return 0
        count = 0
        while count < len(st.turns):
            count += 1
            cut = st.turns[count].start if count < len(st.turns) else len(st.ids)
            if len(st.ids) - cut + need <= limit:
                break
        mgr, chat = self._mgr, ctx.chat
        old_kv_len = st.kv_len
        cut = st.drop_turns(count)
        kv = mgr.hot_kv(self)
        if st.turns and not chat.openers_match:
            # The first kept turn must open like a first turn: swap its opener; its KV has to be re-encoded.
            drop, add = len(chat.next_open_ids), chat.first_open_ids
            st.ids[:drop] = add
            delta = len(add) - drop
            for i, turn in enumerate(st.turns):
                turn.start += delta if i else 0
                turn.end += delta
            mgr.drop_kv(self)
        elif kv is not None:
            if ctx.inv_freq is None:
                mgr.drop_kv(self)
            else:
                shift_history(kv, ctx.preamble_len, min(cut, old_kv_len), ctx.inv_freq)
        mgr.count("evicted_turns", count)
        return count

    def _chosen(self, ids: list[str], st: Transcript, strict: bool) -> list[Any]:
        exclude = st.in_cache_records
        wanted = [i for i in dict.fromkeys(ids) if i not in exclude]
        return self._mgr.retrieve("", self.user_id, len(wanted), strict=strict, entry_ids=wanted) if wanted else []

    def _recall(self, query: str, st: Transcript, k: int, strict: bool) -> list[Any]:
        exclude = st.in_cache_records
        hits = self._mgr.retrieve(query, self.user_id, k + min(len(exclude), 64), strict=strict)
        return [m for m in hits if m.id not in exclude][:k]

    def _remember(self, user_text: str, reply_text: str, notes: list[str]) -> list[str]:
        ids: list[str] = []
        for role, content in (("user", user_text), ("assistant", reply_text)):
            if not content.strip():
                continue
            try:
                ids += [r.id for r in self._mgr.remember_turn(self.user_id, self.session_id, role, content)]
            except Exception as exc:  # the reply is already committed: report, do not lose it
                log.warning("session %s: storing the %s turn failed (%s)", self.slot.key, role, type(exc).__name__)
                notes.append(f"storing the {role} turn as a long-term memory failed: {type(exc).__name__}")
        return ids

