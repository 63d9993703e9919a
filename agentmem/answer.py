"""Answering with mounted memories, and the rest of the KV bank's work the facade offers: training entries,
fidelity checks, the tool prompt, warm-up and bulk encoding.

:class:`Answerer` is a part :class:`~agentmem.AgentMemory` holds (``mem._answer``) and delegates to in one line per
public method (the facade keeps the documented signatures and checks that it is open). It is given the entry
store, the KV bank and the facade's recall / record-building steps when the facade is built, and keeps no state of
its own.

Example:
    >>> answer = Answerer(store=store, bank=bank, config=config, path=mem.path, cipher=None, scanner=None,
    ...                   recall=mem._recall, new_entry=mem._new_entry, record=mem._record)   # mem's parts
    >>> [m.id for m in answer.mountable("What is my dog called?", "u1", 4)] == [dog.id]
    True
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentmem.bank import BankMemory
from agentmem.entries.records import to_hit
from agentmem.validation import (
    check_answer_room,
    check_entry_ids,
    check_generation,
    check_id,
    check_logit_bias,
    check_metadata,
    check_stop,
    check_text,
)

if TYPE_CHECKING:
    from agentmem.bank import KVBank
    from agentmem.config import MemoryConfig
    from agentmem.kv.types import GenerationResult, Mode
    from agentmem.ports.catalog import EntryRecord
    from agentmem.entries.store import EntryStore, NewEntry
    from agentmem.types import Hit, MemoryRecord

__all__ = ["Answerer"]

log = logging.getLogger("agentmem")


@dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class Answerer:
    """The facade's ``generate``, ``train``, ``fidelity``, ``tool_prompt``, ``warmup``, ``load_model`` and
    ``encode_pending`` (documented on :class:`~agentmem.AgentMemory`), and the memories a session mounts.

    ``recall``, ``new_entry`` and ``record`` are the facade's own steps (``AgentMemory._recall``, ``_new_entry``,
    ``_record``): recall with its scope filters, a validated new entry, a row as a public record.
    """

    store: EntryStore
    bank: KVBank
    config: MemoryConfig
    path: Path  # the store's directory (train checkpoints go under <path>/train/)
    cipher: Any  # None on a plaintext store (then train checkpoints by default)
    scanner: Any  # the secret scanner applied to trained documents (None: secret_policy "off")
    recall: Callable[..., list[Hit]]
    new_entry: Callable[..., NewEntry]
    record: Callable[[EntryRecord], MemoryRecord]

    def generate(self, question: str, *, user_id: str, session_id: str | None, k: int, mode: Mode,
                 max_new_tokens: int, tags: Iterable[str] | None, kinds: Iterable[str] | None,
                 filters: Mapping[str, Any] | None, budget_tokens: int | None, strict: bool | None,
                 do_sample: bool | None, temperature: float | None, top_p: float | None, seed: int | None,
                 entry_ids: Sequence[str] | None, on_text: Callable[[str], None] | None,
                 logits_processor: Callable[[Any, Any], Any] | None,
                 cancel: threading.Event | None = None, stop: Sequence[str] | None = None,
                 json_schema: Mapping[str, Any] | None = None,
                 repetition_penalty: float | None = None,
                 logit_bias: Mapping[int | str, float] | None = None) -> GenerationResult:
        """Recall (or take ``entry_ids``), mount and answer: :meth:`agentmem.AgentMemory.generate`.

        Example:
            >>> unset = dict.fromkeys(["session_id", "tags", "kinds", "filters", "budget_tokens", "strict", "do_sample",
            ...                         "temperature", "top_p", "seed", "on_text", "logits_processor"])
            >>> out = answer.generate("What is it called?", user_id="u1", k=4, mode="kv", max_new_tokens=2,
            ...                       entry_ids=[dog.id], **unset)     # the facade passes every argument
            >>> out.mounted == [dog.id], len(out.token_ids)
            (True, 2)
        """
        t0 = time.perf_counter()
        check_text(question, "question")
        stop, bias = check_stop(stop), check_logit_bias(logit_bias)
        check_generation(max_new_tokens=max_new_tokens, budget_tokens=budget_tokens, temperature=temperature,
                         top_p=top_p, seed=seed, do_sample=do_sample, k=k, repetition_penalty=repetition_penalty)
        from agentmem.kv.runner import Sampling  # here: importing agentmem does not load the KV engine

        sampling = Sampling.for_model(self.bank.engine.model, do_sample=do_sample, temperature=temperature,
                                      top_p=top_p, seed=seed, repetition_penalty=repetition_penalty)
        if entry_ids is not None:
            hits = self.owned_hits(entry_ids, user_id)
        else:
            hits = self.recall(question, user_id=user_id, k=k, kinds=kinds, tags=tags, filters=filters,
                                asking_session=session_id, for_mount=True)
        retrieve_s = time.perf_counter() - t0
        engine = self.bank.engine
        check_answer_room(context=engine.max_positions - engine.position_margin, max_new_tokens=max_new_tokens,
                          prompt_tokens=len(engine.layout.preamble_ids) + len(engine.layout.suffix_ids(question)),
                          memories=bool(hits))
        strict = self.config.strict_fingerprint if strict is None else strict
        rows = self.store.catalog.get([h.id for h in hits])
        if mode == "text":
            memories, skipped = [BankMemory(id=h.id, text=h.memory_text) for h in hits], []
        else:
            memories, skipped = self.bank.memories(rows, [h.memory_text for h in hits], strict=strict,
                                                    documents=[h.text for h in hits])
        processor = self._processor(logits_processor, bias, json_schema, stop)
        on_text, flush = _stop_cut(stop, on_text)
        out = self.bank.engine.generate(
            question, memories, mode=mode, max_new_tokens=max_new_tokens, budget_tokens=budget_tokens,
            do_sample=sampling.do_sample, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
            seed=seed, repetition_penalty=sampling.repetition_penalty, strict=strict,
            retrieve_s=retrieve_s, on_text=on_text, logits_processor=processor, cancel=cancel,
        )
        flush()
        out.text = _cut_at_stop(out.text, stop)
        out.fallbacks.extend(skipped)  # stale trained entries: not mounted, with the reason
        return out

    def _processor(self, given: Callable[[Any, Any], Any] | None, bias: Mapping[int, float],
                   json_schema: Mapping[str, Any] | None, stop: Sequence[str]) -> Callable[[Any, Any], Any] | None:
        """The caller's logits processor, then the logit bias, then the JSON schema's (which must have the last word
        on what is allowed), then the stop strings' (None if none)."""
        from agentmem.kv.constrain import bias_processor, chain, json_schema_processor, stop_processor

        tokenizer = self.bank.engine.tokenizer
        return chain(given, bias_processor(bias, len(tokenizer)) if bias else None,
                     json_schema_processor(tokenizer, json_schema) if json_schema is not None else None,
                     stop_processor(tokenizer, stop) if stop else None)

    def train(self, document: str, *, user_id: str, session_id: str | None, tags: Iterable[str] | None,
              tokens: int, steps: int, seed: int, lr: float, ttl: float | timedelta | None,
              metadata: Mapping[str, Any] | None, progress: bool, checkpoint_path: str | Path | None | bool,
              options: dict[str, Any]) -> MemoryRecord:
        """Learn a KV prefix standing for ``document`` and store it as a trained entry:
        :meth:`agentmem.AgentMemory.train`.

        Example:
            >>> entry = answer.train("Hold the power button for ten seconds to reset the device.", user_id="u1",
            ...                      session_id=None, tags=["manual"], tokens=4, steps=1, seed=0, lr=5e-3, ttl=None,
            ...                      metadata=None, progress=False, checkpoint_path=False, options={})
            >>> entry.kind, entry.metadata["training"]["tokens"]
            ('trained', 4)
        """
        text = check_text(document, "document")
        if self.scanner is not None:
            text = self.scanner.apply(text)
        ckpt = self._train_checkpoint(checkpoint_path, text, user_id=user_id, tokens=tokens, steps=steps,
                                      seed=seed, lr=lr, options=options)
        blob, fields, record = self.bank.train_blob(
            text, tokens=tokens, steps=steps, seed=seed, lr=lr, progress=progress,
            checkpoint_path=ckpt, options=options,
        )
        meta = {**check_metadata(metadata), "training": record}
        entry = self.new_entry(text, user_id=user_id, session_id=session_id, kind="trained", role=None,
                                speaker=None, timestamp=None, tags=tags, ttl=ttl, metadata=meta)
        entry.attach_kv(blob, fields)
        self.store.add([entry])
        if ckpt is not None and checkpoint_path is None:  # ours, and the entry is stored: nothing left to resume
            Path(ckpt).unlink(missing_ok=True)
        return self.record(entry.row)

    def fidelity(self, question: str, *, user_id: str, answer: str, entry_ids: Sequence[str],
                 tokens: int) -> dict[str, float | int]:
        """KL(text ‖ kv) on ``answer``'s first tokens: :meth:`agentmem.AgentMemory.fidelity`.

        Example:
            >>> score = answer.fidelity("What is my dog called?", user_id="u1", answer="Rex.", entry_ids=[dog.id],
            ...                         tokens=8)
            >>> score["tokens"], score["kl"] < 0.05
            (3, True)
        """
        from agentmem.kv.fidelity import mode_kl

        hits = self.owned_hits(entry_ids, user_id)
        rows = self.store.catalog.get([h.id for h in hits])
        kv_memories, _ = self.bank.memories(rows, [h.memory_text for h in hits], strict=False,
                                             documents=[h.text for h in hits])
        text_memories = [BankMemory(id=h.id, text=h.memory_text) for h in hits]
        return mode_kl(self.bank.engine, check_text(question, "question"), kv_memories, text_memories,
                       check_text(answer, "answer"), tokens=tokens)

    def _train_checkpoint(self, given: str | Path | None | bool, document: str, **run: Any) -> Path | None:
        """Where ``train`` checkpoints: ``given``, else a file named by the run under ``<store>/train/``."""
        if given is False:
            return None
        if given is not None and given is not True:
            return Path(given)
        if self.cipher is not None and given is None:
            return None  # a plaintext checkpoint of an encrypted store's document: only when asked for
        key = json.dumps({"doc": hashlib.sha256(document.encode()).hexdigest(), **run}, sort_keys=True, default=str)
        return self.path / "train" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.ckpt"

    def tool_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """``tools`` described the way the local LLM's chat template renders them (loads the model).

        Example:
            >>> answer.tool_prompt([{"type": "function", "function": {"name": "get_weather"}}])
            '# Tools...<tools>...get_weather...</tools>...'
        """
        from agentmem.kv.tools import render_tools

        return render_tools(self.bank.engine.tokenizer, list(tools))

    def count_tokens(self, text: str) -> int:
        """``text``'s length in the local LLM's tokens (loads the model): :meth:`agentmem.AgentMemory.count_tokens`.

        Example:
            >>> answer.count_tokens("Alice likes tea.")
            4
        """
        return len(self.bank.engine.layout.content_ids(text))

    def warmup(self) -> dict[str, float]:
        """The one-time work of a first run, in seconds per step: :meth:`agentmem.AgentMemory.warmup`.

        Example:
            >>> sorted(answer.warmup())
            ['embedder', 'engine', 'model']
        """
        t = time.perf_counter()
        self.store.embedder.encode(["warm up"])  # loads MiniLM and exports / opens the ONNX query encoder
        self.store.embed_query("warm up")  # and the query graph (int8 feed-forward weights: quantised once, cached)
        times = {"embedder": time.perf_counter() - t}
        times.update(self.bank.warmup())
        log.info("warmup done in %.1f s (%s)", sum(times.values()),
                 ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
        return {k: round(v, 3) for k, v in times.items()}

    def owned_hits(self, entry_ids: Sequence[str], user_id: str) -> list[Hit]:
        """``entry_ids``' live, active entries of ``user_id`` as hits, in that order (others are left out).

        Example:
            >>> [h.id for h in answer.owned_hits([dog.id, rec.id], "u1")] == [dog.id, rec.id]
            True
            >>> answer.owned_hits([rec.id], "u2")
            []
        """
        check_id(user_id, "user_id", required=True)
        entry_ids = check_entry_ids(entry_ids)
        now = time.time()
        rows = [r for r in self.store.catalog.get(entry_ids)  # superseded entries are never mounted
                if r.user_id == user_id and (r.expires_at is None or r.expires_at > now) and r.status == "active"]
        return [to_hit(r, 1.0, {}, text=self.store.sealer.open_text(r.id, "text", r.text),
                       memory_text=self.store.sealer.open_text(r.id, "memory_text", r.memory_text)) for r in rows]

    def mountable(self, query: str, user_id: str, k: int, *, exclude_session: str | None = None,
                  strict: bool = False, entry_ids: Sequence[str] | None = None) -> list[BankMemory]:
        """Recalled (or, with ``entry_ids``, chosen) memories ready to mount, most relevant first (for sessions).

        Example:
            >>> [m.id for m in answer.mountable("What is my dog called?", "u1", 4)] == [dog.id]
            True
        """
        hits = (self.owned_hits(entry_ids, user_id) if entry_ids is not None else
                self.recall(query, user_id=user_id, k=k, asking_session=exclude_session, for_mount=True))
        if exclude_session is not None:  # turns of the live conversation are already in its working cache
            hits = [h for h in hits if h.session_id != exclude_session]
        rows = self.store.catalog.get([h.id for h in hits])
        memories, _stale = self.bank.memories(rows, [h.memory_text for h in hits], strict=strict,
                                               documents=[h.text for h in hits])
        return memories

    def load_model(self) -> None:
        """Load the local LLM now (it otherwise loads on the first encode or mount)."""
        _ = self.bank.engine

    def encode_pending(self, *, user_id: str | None, batch_size: int, progress: bool) -> int:
        """Encode KV for every entry that has none for the loaded model: :meth:`agentmem.AgentMemory.encode_pending`.

        Example:
            >>> answer.encode_pending(user_id=None, batch_size=16, progress=False)    # mem's two, stored without KV
            2
            >>> answer.encode_pending(user_id=None, batch_size=16, progress=False)
            0
        """
        from tqdm.auto import tqdm

        ids = self.store.scope_ids(user_id=check_id(user_id, "user_id", required=False), alive_at=time.time())
        get = self.store.catalog.get
        todo = [r for i in range(0, len(ids), 1000) for r in self.bank.stale_rows(get(ids[i : i + 1000]))]
        done = 0
        with tqdm(total=len(todo), desc="encoding KV", unit="entry", disable=not progress) as bar:
            for i in range(0, len(todo), batch_size):
                rows = todo[i : i + batch_size]
                done += self.bank.attach_encoded(rows)
                bar.update(len(rows))
        return done


def _stop_cut(stop: Sequence[str], on_text: Callable[[str], None] | None) -> tuple[Any, Callable[[], None]]:
    """``(on_text, flush)`` streaming the answer up to its first stop string (agentmem.kv.streaming.StopCut)."""
    from agentmem.kv.streaming import StopCut

    return StopCut(stop).streaming(on_text)


def _cut_at_stop(text: str, stop: Sequence[str]) -> str:
    from agentmem.kv.streaming import cut_at_stop

    return cut_at_stop(text, stop)
