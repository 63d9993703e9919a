"""KVEngine: encode memories to KV after a shared preamble, mount them, answer — or re-encode as text to compare.

``generate`` modes, all on the same token ids:

* ``kv``: load each entry's stored KV, re-rotate keys to the entry's new position, place after the cached
  preamble, prefill only the question suffix, decode.
* ``kv+fix``: ``kv`` plus recomputing a few tokens of each entry in context (see :mod:`agentmem.kv.fix`).
* ``text``: encode preamble + memories + suffix from scratch: the baseline.

Example:
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> engine = KVEngine(*tiny_causal_lm("llama"))       # any RoPE causal LM; the facade loads SmolLM2
    >>> entry = engine.encode("Alice moved to Lisbon in 2021.")
    >>> blob = engine.to_bytes(entry)                     # the facade stores this (encrypted if configured)
    >>> memories = [MemoryItem("m1", "Alice moved to Lisbon in 2021.", lambda: engine.from_bytes(blob))]
    >>> kv = engine.generate("Where does Alice live?", memories, max_new_tokens=8)
    >>> text = engine.generate("Where does Alice live?", memories, mode="text", max_new_tokens=8)
    >>> kv.mounted, kv.text == text.text      # the stored KV answers as re-encoding the text does
    (['m1'], True)
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from agentmem.errors import BlobCorruptedError, FingerprintMismatchError, InvalidInputError, UnsupportedModelError
from agentmem.kv import codec, rope_kernel
from agentmem.kv.quant import codec_for
from agentmem.kv.batch import FairRLock
from agentmem.kv.cache import BufferedCache, cache_from_stacked, empty_cache, new_dynamic_cache, stacked_from_cache
from agentmem.kv.fingerprint import ModelFingerprint, model_fingerprint
from agentmem.kv.fix import FixConfig, apply_fix, max_recomputed
from agentmem.kv.lanes import DecodeLanes, default_lanes
from agentmem.kv.mount import Mount, Workspace, plan_mount
from agentmem.kv.prompt import DEFAULT_SYSTEM_PROMPT, PromptLayout
from agentmem.kv.rope import kv_support, rotary_inv_freq
from agentmem.kv.runner import LogitsProcessor, Sampling, decode, next_token, prefill, processed, stop_ids
from agentmem.kv.streaming import text_callback
from agentmem.kv.turn import (TurnOutput, TurnRequest, decode_turn, end_turn, load_memories, mount_turn, prefill_turn,
                              run_turn)
from agentmem.kv.types import EncodedEntry, GenerationResult, MemoryItem, Mode, MountChoice, MountMemory

__all__ = ["KVEngine", "MountChoice", "PreparedPrompt"]

log = logging.getLogger(__name__)


def _fallback_level(reason: str | None) -> int:
    """INFO for the normal first mount of a not-yet-encoded entry, WARNING when stored KV was unusable."""
    return logging.INFO if str(reason).startswith("no stored KV") else logging.WARNING
_MODES = ("kv", "kv+fix", "text")


@dataclass
class PreparedPrompt:
    """A cache holding everything before the still-pending ids, plus what went into it (see ``KVEngine.prepare``)."""

    cache: BufferedCache
    pending_ids: list[int]  # ids still to prefill: the suffix (kv modes) or the whole prompt (text mode)
    mounted: list[str]
    dropped: list[str]
    fallbacks: list[tuple[str, str]]
    timings: dict[str, float]
    prompt_tokens: int
    max_new_tokens: int
    notes: list[str] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    recomputed_tokens: int = 0  # kv+fix: entry tokens recomputed in context

    def result(self, text: str, token_ids: list[int], mode: Mode, timings: dict[str, float]) -> GenerationResult:
        """The answer generated on this prompt, with what went into it.

        Example:
            >>> from agentmem.kv.testing import tiny_causal_lm
            >>> engine = KVEngine(*tiny_causal_lm("llama"))
            >>> prep = engine.prepare("Where does Alice live?", [MemoryItem("m1", "Alice lives in Lisbon.")])
            >>> out = prep.result("Lisbon.", [42, 13], "kv", {"total": 0.2})    # the text and ids decoded on it
            >>> out.text, out.mounted, out.fallbacks           # no stored KV given: the memory was encoded from text
            ('Lisbon.', ['m1'], [('m1', 'no stored KV')])
        """
        return GenerationResult(
            text=text, mounted=self.mounted, dropped=self.dropped, mode=mode, timings=timings,
            fallbacks=self.fallbacks, token_ids=token_ids, prompt_tokens=self.prompt_tokens,
            max_new_tokens=self.max_new_tokens, notes=self.notes, recomputed_tokens=self.recomputed_tokens,
            spans=list(self.spans),
        )


@dataclass
class _Mounted:
    """What ``prepare`` placed in its cache: the memories actually mounted, in order, and where each sits."""

    memories: list[MountMemory]
    cache: BufferedCache
    spans: list[tuple[int, int]]
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    recomputed: int = 0  # kv+fix: entry tokens recomputed in context


def _answer_timings(mounting: dict[str, float], retrieve_s: float, *, start: float, prefill: float, first: float,
                    end: float) -> dict[str, float]:
    """``GenerationResult.timings``: the mount's own seconds, then prefill, decode and the end-to-end ``ttft`` and
    ``total`` (the caller's ``retrieve_s`` included), from ``time.perf_counter()`` marks.

    Example:
        >>> _answer_timings({"load": 0.5}, 1.0, start=10.0, prefill=11.0, first=12.0, end=14.0)["ttft"]
        3.0
    """
    return {**mounting, "retrieve": retrieve_s, "prefill": first - prefill, "ttft": retrieve_s + (first - start),
            "decode": end - first, "total": retrieve_s + (end - start)}


def _spans_after(start: int, ids: list[list[int]]) -> list[tuple[int, int]]:
    """``(start, end)`` positions of memories placed back to back from ``start`` (text mode's spans).

    Example:
        >>> _spans_after(4, [[1, 2], [3]])
        [(4, 6), (6, 7)]
    """
    ends = list(itertools.accumulate((len(x) for x in ids), initial=start))
    return list(zip(ends[:-1], ends[1:]))


class KVEngine:
    """Encodes, stores (as bytes), mounts and answers with memory KV for one loaded causal LM.

    Not thread-safe across processes, but calls on one engine are serialised by a lock (the model and a reused
    workspace are shared). ``codec`` (a name from :data:`agentmem.kv.quant.CODECS`: ``float32`` ... ``int4``;
    default: the float codec of ``storage_dtype``, itself defaulting to the model dtype) applies to :meth:`to_bytes`;
    the model's own float dtype makes loading zero-copy, integer codecs read fewer bytes and dequantize while
    mounting.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        storage_dtype: torch.dtype | None = None,
        codec: str | None = None,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        fix: FixConfig = FixConfig(),
        position_margin: int = 8,
        mount_budget: int | None = None,
        prefix_cache: bool = True,
        decode_lanes: int | None = None,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        param = next(model.parameters())
        self.dtype, self.device = param.dtype, param.device
        self.storage_dtype = storage_dtype or self.dtype
        self.codec = codec_for(codec if codec is not None else self.storage_dtype).name
        self.layout = PromptLayout.from_tokenizer(tokenizer, system_prompt)
        self.fix = fix
        self.position_margin = position_margin
        self.mount_budget = mount_budget
        # The prompt prefix cache: every prompt starts from the preamble's KV, computed once (preamble_kv). The kv
        # modes need it anyway (entries are encoded after it); text mode starts from it too unless this is False.
        self.prefix_cache = prefix_cache
        config = model.config
        if hasattr(config, "get_text_config"):
            config = config.get_text_config(decoder=True)
        self.max_positions = int(
            getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 2048
        )
        self.kv_unsupported_reason = kv_support(model)
        self._inv_freq = None if self.kv_unsupported_reason else rotary_inv_freq(model).to(self.device)
        self._eos = stop_ids(model, tokenizer)
        self._fingerprint: ModelFingerprint | None = None
        self._preamble: tuple[torch.Tensor, torch.Tensor] | None = None
        self._kv_shape: tuple[int, int, int] | None = None
        self._workspace = Workspace()
        self._workspace_busy = False  # an answer is mounted or still decodes in the workspace buffers
        self._workspace_guard = threading.Lock()  # who takes the workspace (generate mounts outside the model lock)
        self._turn_workspaces: set[int] = set()  # ids of the session workspaces a turn is decoding in now
        self._lock = FairRLock()  # granted in arrival order: a prefill never waits behind a stream of decode steps
        # runs the decode steps of concurrent answers together, and feeds the prompts waiting in the same steps; on
        # a CPU with a core to spare, two such workers run side by side (agentmem/kv/lanes.py)
        lanes = default_lanes(self.device) if decode_lanes is None else decode_lanes
        self.decoder = DecodeLanes(self.model, self._lock, lanes=lanes)

    # -- identity ---------------------------------------------------------------------------------------------
    @property
    def fingerprint(self) -> ModelFingerprint:
        """The loaded model's fingerprint (computed on first use, ~0.5 s for SmolLM2)."""
        if self._fingerprint is None:
            self._fingerprint = model_fingerprint(self.model, self.tokenizer)
        return self._fingerprint

    @property
    def supports_kv(self) -> bool:
        return self.kv_unsupported_reason is None

    @property
    def inv_freq(self) -> torch.Tensor | None:
        """The model's RoPE inverse frequencies on its device (None when its KV cannot be re-rotated exactly)."""
        return self._inv_freq

    @property
    def eos_ids(self) -> frozenset[int]:
        """Token ids that end a reply (read-only: a copy no caller can change under a running decode)."""
        return frozenset(self._eos)

    @property
    def idle(self) -> bool:
        """Whether no answer, turn or encoding uses the model now (background work waits for this: it must not
        delay a chat's first token)."""
        return not (self._lock.busy or self._workspace_busy or self._turn_workspaces or self.decoder.active)

    @property
    def holds_lock(self) -> bool:
        """Whether the calling thread holds the model's lock (then it must not wait for work that needs the lock).

        Example:
            >>> from agentmem.kv.testing import tiny_causal_lm
            >>> KVEngine(*tiny_causal_lm("llama")).holds_lock
            False
        """
        return self._lock.held_by_me()

    def _require_kv(self) -> None:
        if self.kv_unsupported_reason is not None:
            raise UnsupportedModelError(self.kv_unsupported_reason)

    # -- preamble & encoding ----------------------------------------------------------------------------------
    def preamble_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Stacked KV ``[L, 1, H, P, D]`` of the shared preamble, computed once."""
        if self._preamble is not None:  # read without the model lock: mounts run outside it
            return self._preamble
        with self._lock:
            if self._preamble is None:
                ids = self.layout.preamble_ids
                cache = self._blank_cache(len(ids))
                prefill(self.model, cache, ids)
                self._preamble = stacked_from_cache(cache)
            return self._preamble

    def _blank_cache(self, capacity: int, workspace: Workspace | None = None) -> BufferedCache:
        """An empty cache for ``capacity`` tokens, shaped like the model's own cache."""
        if self._kv_shape is None:
            with self._lock:
                # Layer count and KV heads/dim as the model really produces them, from a 1-token probe.
                probe = new_dynamic_cache()
                prefill(self.model, probe, self.layout.preamble_ids[:1] or [0])
                k = probe.layers[0].keys
                self._kv_shape = (len(probe.layers), k.shape[1], k.shape[3])
        layers, heads, dim = self._kv_shape
        if workspace is not None:
            kb, vb = workspace.get(layers, heads, capacity, dim, dtype=self.dtype, device=self.device)
            return BufferedCache(kb, vb, 0)
        return empty_cache(layers, heads, dim, capacity=capacity, dtype=self.dtype, device=self.device)

    def encode(self, text: str) -> EncodedEntry:
        """KV of one memory line, encoded after the shared preamble."""
        return self.encode_many([text])[0]

    def encode_many(self, texts: Sequence[str], *, batch_size: int = 8) -> list[EncodedEntry]:
        """Encode several memories; batched with right padding (causal attention never looks at the pads)."""
        for t in texts:
            if not isinstance(t, str) or not t.strip():
                raise InvalidInputError("memory text must be a non-empty string")
        self._require_kv()
        with self._lock:
            pre_k, pre_v = self.preamble_kv()
            ids = [self.layout.entry_ids(t) for t in texts]
            limit = self.max_positions - pre_k.shape[3] - self.position_margin
            if any(len(x) > limit for x in ids):
                raise InvalidInputError(f"a memory is longer than the model's context allows ({limit} tokens)")
            out: list[EncodedEntry | None] = [None] * len(texts)
            order = sorted(range(len(texts)), key=lambda i: len(ids[i]))  # similar lengths batch with less padding
            for b in range(0, len(order), batch_size):
                group = order[b : b + batch_size]
                for i, entry in zip(group, self._encode_batch([ids[i] for i in group], pre_k, pre_v)):
                    out[i] = entry
            return [e for e in out if e is not None]

    def _encode_batch(self, batch: list[list[int]], pre_k, pre_v) -> list[EncodedEntry]:
        p, width = pre_k.shape[3], max(len(x) for x in batch)
        size = len(batch)
        cache = cache_from_stacked(
            pre_k.expand(-1, size, -1, -1, -1), pre_v.expand(-1, size, -1, -1, -1), capacity=p + width
        )
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        rows = torch.tensor([x + [pad] * (width - len(x)) for x in batch], dtype=torch.long)
        prefill(self.model, cache, rows)
        keys, values = stacked_from_cache(cache, p, p + width)  # [L, B, H, W, D]
        fp, pre = self.fingerprint.digest, self.layout.preamble_digest
        return [
            EncodedEntry(
                token_ids=torch.tensor(x, dtype=torch.long),
                keys=keys[:, b, :, : len(x)].contiguous(),
                values=values[:, b, :, : len(x)].contiguous(),
                offset=p,
                fingerprint=fp,
                preamble_digest=pre,
            )
            for b, x in enumerate(batch)
        ]

    # -- bytes ------------------------------------------------------------------------------------------------
    def to_bytes(self, entry: EncodedEntry, *, codec_name: str | None = None) -> bytes:
        """Serialise an entry (safetensors) in this engine's codec (or ``codec_name``)."""
        return codec.encode_entry(entry, self.fingerprint, codec=codec_name or self.codec)

    def from_bytes(self, blob: bytes | bytearray | memoryview, *, cast: bool = True) -> EncodedEntry:
        """Decode a blob for this model; raises FingerprintMismatchError / BlobCorruptedError.

        ``cast=False`` keeps fp16/bf16-stored KV in their storage dtype (zero-copy); mounting widens them while
        copying them into the cache, which saves a pass over the data. Use it for blobs that are only mounted.
        Integer codecs always come back as codes (a ``QuantizedEntry``), dequantized while mounting.
        """
        return codec.decode_entry(
            blob,
            expected=self.fingerprint,
            dtype=self.dtype if cast else codec.KEEP_STORAGE_DTYPE,
            preamble_digest=self.layout.preamble_digest,
        )

    # -- mounting ---------------------------------------------------------------------------------------------
    def _planned_ids(self, memory: MountMemory, mode: str) -> list[int]:
        """Token ids a memory occupies; a trained entry occupies its learned KV length (text mode: its document)."""
        if mode != "text" and memory.trained:
            return [-1] * int(memory.kv_tokens or 0)
        return self.layout.entry_ids(memory.text)

    def load_stored(self, memory: MountMemory, want_ids: list[int], strict: bool, *, mount_trained: bool = True
                    ) -> tuple[EncodedEntry | None, str | None]:
        """A memory's stored KV, checked against this model, its preamble and ``want_ids`` (the ids it will occupy).

        ``(entry, None)``; ``(None, reason)`` when it must be encoded from text instead; or ``(entry, reason)``
        when the loader itself replaced unusable stored KV with a fresh encoding (it says why in ``load_fallback``).
        A trained entry's learned KV stands for no token ids, so its ids are not compared, unless
        ``mount_trained=False`` (a caller that plans every memory by its text, like sessions).
        """
        loader = memory.load_kv
        if loader is None:
            return None, "no stored KV"
        try:
            entry = loader()
        except (FingerprintMismatchError, BlobCorruptedError) as exc:
            if strict:
                raise
            return None, f"{type(exc).__name__}: {exc}"
        if entry.fingerprint != self.fingerprint.digest:
            reason = "stored KV was encoded by a different model"
        elif entry.preamble_digest != self.layout.preamble_digest:
            reason = "stored KV was encoded after a different preamble"
        elif not (mount_trained and memory.trained) and entry.token_ids.tolist() != want_ids:
            reason = "stored KV token ids do not match the memory text"
        else:
            return entry, memory.load_fallback
        if strict:
            raise FingerprintMismatchError(f"memory {memory.id}: {reason}")
        return None, reason

    def mount_entry(self, memory: MountMemory, want_ids: list[int], strict: bool, *, mount_trained: bool = True
                    ) -> MountChoice:
        """The one place that decides "mount the stored KV, or re-encode the text" for a memory.

        Stored KV that is missing, corrupt, made by another model or after another preamble, or whose token ids
        differ from ``want_ids`` is replaced by the memory's text encoded now (the reason says which); with
        ``strict`` those raise instead (:meth:`load_stored`). A trained entry's learned KV cannot be rebuilt from
        text: left out when unusable, unless ``mount_trained=False`` (a caller that places every memory by its
        text, like a conversation turn), where it is re-encoded like any other.

        Example:
            >>> from agentmem.kv.testing import tiny_causal_lm
            >>> engine = KVEngine(*tiny_causal_lm("llama"))
            >>> entry = engine.encode("Alice moved to Lisbon.")
            >>> memory = MemoryItem("m1", "Alice moved to Lisbon.", lambda: entry)
            >>> choice = engine.mount_entry(memory, engine.layout.entry_ids(memory.text), strict=False)
            >>> choice.entry is not None, choice.reason      # the stored KV, mounted as stored
            (True, None)
        """
        t = time.perf_counter()
        entry, reason = self.load_stored(memory, want_ids, strict, mount_trained=mount_trained)
        load_s = time.perf_counter() - t
        if entry is not None:
            if reason is not None:
                # the loader re-encoded unusable stored KV itself (e.g. the facade's hot update): mount that.
                # A first mount of a lazily encoded entry is the normal path, not a problem: INFO, not WARNING.
                log.log(_fallback_level(reason), "memory %s: stored KV replaced by a fresh encoding (%s)",
                        memory.id, reason)
            return MountChoice(entry, reason, load_s, 0.0)
        if mount_trained and memory.trained:
            # learned KV cannot be rebuilt from text: leave it out rather than mount the whole document
            log.warning("trained memory %s not mounted (%s)", memory.id, reason)
            return MountChoice(None, str(reason), load_s, 0.0)
        log.log(_fallback_level(reason), "memory %s: mounting from text (%s)", memory.id, reason)
        t = time.perf_counter()
        entry = self.encode(memory.text)
        return MountChoice(entry, str(reason), load_s, time.perf_counter() - t)

    def turn(self, request: TurnRequest) -> TurnOutput:
        """One conversation turn over a kept history KV (see :mod:`agentmem.kv.turn`): mount, prefill, decode, append.

        The memories are loaded first, outside the engine lock (their loaders may read files or encode); the
        prefill and the append run under it, and the reply decodes in :attr:`decoder`'s batch with every other
        answer decoding now (so a long turn never holds back another conversation's first token). The request's
        ``history`` buffers are updated in place when they have room.

        Example (a conversation's first turn; :mod:`agentmem.kv.turn` shows a second one reusing its KV):
            >>> from agentmem.kv.testing import tiny_causal_lm
            >>> from agentmem.kv.turn import plan_turn
            >>> engine = KVEngine(*tiny_causal_lm("llama"))
            >>> memories = [MemoryItem("m1", "Alice lives in Lisbon.")]
            >>> new = engine.layout.suffix_ids("Where does Alice live?")
            >>> plan = plan_turn(engine, memories, history_len=0, new_len=len(new), max_new_tokens=4)
            >>> out = engine.turn(TurnRequest(plan, new, [], capacity=128))    # no history KV given: built here
            >>> out.fresh, len(out.reply), out.fallbacks, out.timings["prefill"] > 0
            (True, 4, [('m1', 'no stored KV')], True)
        """
        timings = dict.fromkeys(("load", "encode", "rebuild", "mount", "prefill", "decode", "append"), 0.0)
        entries, fallbacks = load_memories(self, request, timings)
        if self._lock.held_by_me():  # the decode worker could not take the lock: decode inline
            return run_turn(self, request, entries, fallbacks, timings)
        with self._lock:
            request = self._claim_workspace(request)
        try:
            with self._lock:
                mounted = mount_turn(self, request, entries, timings)
            # the message is fed in the decode worker's steps, beside every answer decoding (a long one in chunks)
            started = prefill_turn(self, request, mounted, timings, self.decoder.prefill)
            # decoded together with every other answer
            reply = decode_turn(self, request, started, lambda **args: self.decoder.decode(
                started.cache, started.first, **args), timings)
            with self._lock:
                return end_turn(self, request, started, reply, fallbacks, timings)
        finally:
            self._turn_workspaces.discard(id(request.workspace))

    def _claim_workspace(self, request: TurnRequest) -> TurnRequest:
        """``request`` with a workspace no other turn is decoding in (caller holds the engine lock): the shared one
        it names, or a fresh one while another turn uses that (the lock is let go during the decode)."""
        if request.workspace is not None and id(request.workspace) in self._turn_workspaces:
            return dataclasses.replace(request, workspace=Workspace())
        if request.workspace is not None:
            self._turn_workspaces.add(id(request.workspace))
        return request

    def prepare(
        self,
        question: str,
        memories: Sequence[MountMemory],
        *,
        mode: Mode = "kv",
        max_new_tokens: int = 64,
        budget_tokens: int | None = None,
        strict: bool = False,
        extra_capacity: int = 0,
        workspace: bool = False,
    ) -> PreparedPrompt:
        """Plan, load, mount (and fix) memories into a cache; the caller prefills ``pending_ids`` next.

        ``workspace=True`` builds the cache in the engine's reused buffers: only for caches that die before the
        next engine call (``generate`` does this). Otherwise the cache owns fresh memory.
        """
        with self._lock:  # the model, the preamble cache and the workspace are shared
            return self._prepare(
                question, memories, mode, max_new_tokens, budget_tokens, strict, extra_capacity, workspace
            )

    def _prepare(
        self, question, memories, mode, max_new_tokens, budget_tokens, strict, extra_capacity, workspace
    ) -> PreparedPrompt:
        self._check_request(question, mode, max_new_tokens)
        timings = dict.fromkeys(("load", "encode", "mount", "fix"), 0.0)
        t0 = time.perf_counter()
        preamble_ids = self.layout.preamble_ids
        suffix_ids = self.layout.suffix_ids(question)
        entry_ids = [self._planned_ids(m, mode) for m in memories]
        budget = budget_tokens if budget_tokens is not None else self.mount_budget
        plan = plan_mount(
            [len(x) for x in entry_ids],
            preamble_len=len(preamble_ids),
            suffix_len=len(suffix_ids),
            max_new_tokens=max_new_tokens,
            max_positions=self.max_positions,
            margin=self.position_margin,
            budget_tokens=budget,
        )
        kept = [memories[i] for i in plan.keep]
        kept_ids = [entry_ids[i] for i in plan.keep]
        total = len(preamble_ids) + plan.memory_tokens + len(suffix_ids)
        capacity = total + plan.max_new_tokens + extra_capacity
        if mode == "kv+fix":  # recomputed tokens are appended before being spliced back: leave room, never regrow
            capacity += max_recomputed(self.fix, [len(x) for x in kept_ids])
        ws = self._workspace if workspace else None
        timings["mount"] += time.perf_counter() - t0
        if mode == "text":
            cache, pending = self._text_start(capacity, ws)
            mounted = _Mounted(kept, cache, _spans_after(len(preamble_ids), kept_ids))
            pending += [t for ids in kept_ids for t in ids] + suffix_ids
        else:
            mounted = self._mount_stored(kept, kept_ids, mode, strict, capacity, ws, timings)
            pending = suffix_ids
        return PreparedPrompt(
            cache=mounted.cache,
            pending_ids=pending,
            mounted=[m.id for m in mounted.memories],
            dropped=[memories[i].id for i in plan.drop],
            fallbacks=mounted.fallbacks,
            timings=timings,
            prompt_tokens=total,
            max_new_tokens=plan.max_new_tokens,
            notes=plan.notes,
            spans=mounted.spans,
            recomputed_tokens=mounted.recomputed,
        )

    def _text_start(self, capacity: int, ws: Workspace | None) -> tuple[BufferedCache, list[int]]:
        """Text mode's starting cache and the ids still to prefill before its memories: the cached preamble KV
        (exact: causal attention, so no preamble token depends on what follows), or an empty cache and the
        preamble ids without the prefix cache."""
        if not self.prefix_cache:
            return self._blank_cache(capacity, ws), self.layout.preamble_ids
        return Mount(*self.preamble_kv(), self._inv_freq, capacity=capacity, workspace=ws).cache(), []

    def _check_request(self, question: str, mode: str, max_new_tokens: int) -> None:
        """Typed errors for a bad mode, question or token count (and for KV modes on a model without KV support)."""
        if mode not in _MODES:
            raise InvalidInputError(f"mode must be one of {_MODES}, got {mode!r}")
        if not isinstance(question, str) or not question.strip():
            raise InvalidInputError("question must be a non-empty string")
        if max_new_tokens < 0:
            raise InvalidInputError("max_new_tokens must be >= 0")
        if mode != "text":
            self._require_kv()

    def _mount_stored(self, kept: list[MountMemory], kept_ids: list[list[int]], mode: str, strict: bool,
                      capacity: int, ws: Workspace | None, timings: dict[str, float]) -> _Mounted:
        """The kv modes: every kept memory's stored KV (or its text encoded now) placed after the preamble, and
        in ``kv+fix`` a few tokens of each recomputed in context."""
        t = time.perf_counter()
        mount = Mount(*self.preamble_kv(), self._inv_freq, capacity=capacity, workspace=ws)
        timings["mount"] += time.perf_counter() - t
        loaded: list[MountMemory] = []
        entries: list[EncodedEntry] = []
        fallbacks: list[tuple[str, str]] = []
        all_ids = list(self.layout.preamble_ids)
        # Load every entry, then place them all: placement can then run on two threads (Mount.place_all).
        # Loaders must therefore return KV that stay valid until the mount is built (mapped files and fresh
        # buffers do; one buffer reused for every blob would not).
        for memory, ids in zip(kept, kept_ids):
            choice = self.mount_entry(memory, ids, strict)  # the one "stored KV or re-encode" decision
            if not choice.record(memory.id, timings, fallbacks):
                continue
            entry = choice.entry
            if mode == "kv+fix":  # only the fix re-reads the ids
                all_ids.extend(entry.token_ids.tolist())
            entries.append(entry)
            loaded.append(memory)
        t = time.perf_counter()
        mount.place_all(entries)
        timings["mount"] += time.perf_counter() - t
        t = time.perf_counter()
        entries.clear()  # releasing the blobs (e.g. unmapping mapped files) is part of loading them
        entry = choice = None
        timings["load"] += time.perf_counter() - t
        mounted = _Mounted(loaded, mount.cache(), mount.spans, fallbacks)
        if mode == "kv+fix":
            t = time.perf_counter()
            # a trained entry's KV stands for no token sequence: there is nothing to recompute in it
            fix_spans = [sp for sp, m in zip(mounted.spans, loaded) if not m.trained]
            with self._lock:  # the fix runs the model
                mounted.recomputed = apply_fix(
                    self.model, mounted.cache, torch.tensor(all_ids), fix_spans, self.fix,
                    exact_end=len(self.layout.preamble_ids),
                )
            timings["fix"] = time.perf_counter() - t
        return mounted

    # -- answering --------------------------------------------------------------------------------------------
    def generate(
        self,
        question: str,
        memories: Sequence[MountMemory] = (),
        *,
        mode: Mode = "kv",
        max_new_tokens: int = 64,
        budget_tokens: int | None = None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        strict: bool = False,
        retrieve_s: float = 0.0,
        on_text: Callable[[str], None] | None = None,
        logits_processor: LogitsProcessor | None = None,
        cancel: threading.Event | None = None,
    ) -> GenerationResult:
        """Answer ``question`` with ``memories`` (most relevant first) mounted; greedy unless ``do_sample``.

        ``retrieve_s`` is the caller's retrieval time, added to ``ttft`` and ``total`` so they are end to end.
        Memories that do not fit in what the budget and the model's context leave (taken best first) are dropped
        and listed in ``dropped``; unusable stored KV falls back to encoding the text (``fallbacks``), or raises if
        ``strict``.
        ``on_text`` receives each piece of the answer as soon as it is decoded (streaming), on this thread.
        ``logits_processor`` constrains each choice (transformers' ``(ids, scores) -> scores`` convention).
        Setting ``cancel`` (from any thread) stops decoding before the next model step; the result then has
        ``cancelled=True`` and the tokens decoded so far.
        """
        sampling = Sampling(do_sample=do_sample, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                            repetition_penalty=repetition_penalty)
        t0 = time.perf_counter()
        own_workspace = self._take_workspace()  # the reused buffers, unless another answer is in them
        try:
            # load and mount outside the model lock (they do not run the model): concurrent requests mount at once
            prep = self._prepare(question, memories, mode, max_new_tokens, budget_tokens, strict, 0, own_workspace)
            t = time.perf_counter()
            logits = self._prefill(prep.cache, prep.pending_ids)
            gen = sampling.generator(self.device)
            first = next_token(processed(logits, logits_processor, []), sampling, gen) \
                if prep.max_new_tokens > 0 else None
        except BaseException:
            if own_workspace:
                self._workspace_busy = False
            raise
        t_first = time.perf_counter()
        on_token, flush = text_callback(self.tokenizer, on_text)
        try:
            ids = [] if first is None else self._decode(prep, logits, first, sampling, gen, on_token,
                                                        logits_processor, cancel)
            flush()
        finally:
            del prep.cache  # the workspace buffers are reused by the next call
            if own_workspace:
                self._workspace_busy = False
        timings = _answer_timings(prep.timings, retrieve_s, start=t0, prefill=t, first=t_first, end=time.perf_counter())
        out = prep.result(self.tokenizer.decode(ids, skip_special_tokens=True), ids, mode, timings)
        out.cancelled = cancel is not None and cancel.is_set()
        return out

    def _take_workspace(self) -> bool:
        """Take the reused mount buffers for one answer; False when another answer holds them (mount elsewhere)."""
        with self._workspace_guard:
            if self._workspace_busy:
                return False
            self._workspace_busy = True
            return True

    def _prefill(self, cache: BufferedCache, ids: list[int]) -> torch.Tensor:
        """The next token's logits ``[1, vocab]`` after ``ids`` are appended to ``cache``: batched with every other
        prefill waiting for the model and the answers decoding (:mod:`agentmem.kv.batch`), or inline when the caller
        holds the model lock."""
        if self._lock.held_by_me():
            return prefill(self.model, cache, ids)[-1:]
        return self.decoder.prefill(cache, ids)

    def _decode(self, prep: PreparedPrompt, logits: torch.Tensor, first: int, sampling: Sampling, gen,
                on_token, logits_processor, cancel) -> list[int]:
        """The answer's ids after ``first``: batched with every other answer decoding now (:mod:`agentmem.kv.batch`),
        or inline when the caller holds the engine lock (it could not wait for the decode worker)."""
        args = dict(max_new_tokens=prep.max_new_tokens, eos_ids=self._eos, sampling=sampling, generator=gen,
                    on_token=on_token, logits_processor=logits_processor, cancel=cancel)
        if not self._lock.held_by_me():
            return self.decoder.decode(prep.cache, first, **args)
        return decode(self.model, prep.cache, logits, first_token=first, **args)

    def answer_logits(
        self,
        question: str,
        memories: Sequence[MountMemory],
        answer: str,
        *,
        mode: Mode = "kv",
        info: dict | None = None,
    ) -> tuple[torch.Tensor, list[int]]:
        """Teacher-forced logits ``[len(answer_ids), vocab]`` predicting each answer token, and the answer ids.

        For evaluation (KL between modes, answer NLL): the answer is tokenized as content and follows the prompt.
        Pass a dict as ``info`` to receive ``recomputed_tokens``, ``memory_tokens``, ``fallbacks`` and ``timings``.
        """
        answer_ids = self.layout.content_ids(answer)
        if not answer_ids:
            raise InvalidInputError("answer must be non-empty")
        own_workspace = self._take_workspace()
        try:
            with self._lock:
                prep = self.prepare(question, memories, mode=mode, max_new_tokens=len(answer_ids),
                                    workspace=own_workspace)
                if prep.dropped:
                    raise InvalidInputError("memories do not fit the context; pass fewer or shorter ones")
                logits = prefill(
                    self.model, prep.cache, prep.pending_ids + answer_ids, logits_to_keep=len(answer_ids) + 1
                )
                del prep.cache
        finally:
            if own_workspace:
                self._workspace_busy = False
        if info is not None:
            info.update(
                recomputed_tokens=prep.recomputed_tokens,
                memory_tokens=sum(e - s for s, e in prep.spans),
                fallbacks=prep.fallbacks,
                timings=prep.timings,
            )
        return logits[:-1].float(), answer_ids

    def warmup(self) -> None:
        """Do the one-time work ahead of the first request: the preamble KV, and (KV models) one encode and a mount
        that re-rotates, and on CPU the fused kernels loaded (a model in bfloat16 mounts nothing through them here,
        but dequantizes stored integer codes with them later: loading them then added ~1 s to that first mount).
        The workspace is released afterwards."""
        with self._lock:
            self.preamble_kv()
            if self.supports_kv:
                if self.device.type == "cpu":
                    rope_kernel.kernels_available()  # loads them
                a, b = self.encode_many(["warm up one", "warm up two"])
                items = [MemoryItem("warmup-a", "warm up one", lambda: a), MemoryItem("warmup-b", "warm up two",
                                                                                       lambda: b)]
                self.generate("warm up", items, max_new_tokens=1)
            self._workspace.release()

    def release_workspace(self) -> None:
        """Free the reused mount buffers (they are re-created on the next generate)."""
        with self._lock:
            self._workspace.release()
