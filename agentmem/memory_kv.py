"""The KV-bank half of the :class:`~agentmem.AgentMemory` facade: answering with mounted memories, training
entries, fidelity checks, warm-up and bulk encoding.

A mixin only so that ``memory.py`` stays readable per concern: it holds no state of its own, and every method
delegates to the parts ``AgentMemory.__init__`` builds (the entry store, the KV bank, the sealer), declared below.

Example:
    >>> from agentmem import AgentMemory
    >>> with AgentMemory("./memdata") as mem:                                     # doctest: +SKIP
    ...     _ = mem.remember("My dog is called Rex.", user_id="u1")
    ...     mem.generate("What is my dog's name?", user_id="u1", k=4).text
    'Your dog is called Rex.'
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentmem.bank import BankMemory
from agentmem.store.records import to_hit
from agentmem.validation import check_answer_room, check_entry_ids, check_generation, check_id, check_metadata, check_text

if TYPE_CHECKING:
    from agentmem.bank import KVBank
    from agentmem.config import MemoryConfig
    from agentmem.kv.types import GenerationResult, Mode
    from agentmem.security.sealer import Sealer
    from agentmem.store.entries import EntryStore, NewEntry
    from agentmem.types import Hit, MemoryRecord

log = logging.getLogger("agentmem")


class KVBankMethods:
    """``generate``, ``train``, ``fidelity``, ``tool_prompt``, ``warmup``, ``load_model``, ``encode_pending``."""

    # the parts these methods use, built by AgentMemory.__init__ (and its helpers, defined there)
    config: MemoryConfig
    path: Path
    _store: EntryStore
    _bank: KVBank
    _sealer: Sealer
    _cipher: Any
    _scanner: Any
    _check_open: Callable[[], None]
    _recall: Callable[..., list[Hit]]
    _new_entry: Callable[..., NewEntry]
    _record: Callable[..., MemoryRecord]

    def generate(
        self,
        question: str,
        *,
        user_id: str,
        session_id: str | None = None,
        k: int = 4,
        mode: Mode = "kv",
        max_new_tokens: int = 64,
        tags: Iterable[str] | None = None,
        kinds: Iterable[str] | None = None,
        filters: Mapping[str, Any] | None = None,
        budget_tokens: int | None = None,
        strict: bool | None = None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        entry_ids: Sequence[str] | None = None,
        on_text: Callable[[str], None] | None = None,
        logits_processor: Callable[[Any, Any], Any] | None = None,
    ) -> GenerationResult:
        """Recall the ``k`` most relevant memories of ``user_id``, mount them, and answer ``question``.

        ``logits_processor`` (transformers' ``(ids, scores) -> scores``) constrains decoding, e.g. to a grammar.

        ``entry_ids`` skips recall and mounts exactly those entries of ``user_id`` (in that order), e.g. what a
        LangGraph node already chose.

        ``mode="kv"`` mounts stored KV (re-positioned exactly); ``"kv+fix"`` also recomputes a few tokens of each
        entry in context; ``"text"`` re-encodes the same memories as text (the baseline). Memories are recalled
        across all of the user's sessions; ``session_id`` names the conversation asking. Entries that do not fit
        ``budget_tokens`` (default ``mount_budget_tokens``) or the model's context are dropped least relevant
        first and listed in ``out.dropped``. ``on_text`` receives each piece of the answer as soon as it is
        decoded (streaming), on the calling thread.

        Example:
            >>> out = mem.generate("What is my dog's name?", user_id="u1", k=4)      # doctest: +SKIP
            >>> out.text, out.mounted, out.timings["ttft"]                           # doctest: +SKIP
        """
        t0 = time.perf_counter()
        self._check_open()
        check_text(question, "question")
        check_generation(max_new_tokens=max_new_tokens, budget_tokens=budget_tokens, temperature=temperature,
                         top_p=top_p, seed=seed, do_sample=do_sample, k=k)
        if entry_ids is not None:
            hits = self._owned_hits(entry_ids, user_id)
        else:
            hits = self._recall(question, user_id=user_id, k=k, kinds=kinds, tags=tags, filters=filters,
                                asking_session=session_id, for_mount=True)
        retrieve_s = time.perf_counter() - t0
        if hits:
            engine = self._bank.engine
            check_answer_room(context=engine.max_positions - engine.position_margin, max_new_tokens=max_new_tokens,
                              prompt_tokens=len(engine.layout.preamble_ids) + len(engine.layout.suffix_ids(question)))
        strict = self.config.strict_fingerprint if strict is None else strict
        rows = self._store.catalog.get([h.id for h in hits])
        if mode == "text":
            memories, skipped = [BankMemory(id=h.id, text=h.memory_text) for h in hits], []
        else:
            memories, skipped = self._bank.memories(rows, [h.memory_text for h in hits], strict=strict,
                                                    documents=[h.text for h in hits])
        out = self._bank.engine.generate(
            question, memories, mode=mode, max_new_tokens=max_new_tokens, budget_tokens=budget_tokens,
            do_sample=do_sample, temperature=temperature, top_p=top_p, seed=seed, strict=strict,
            retrieve_s=retrieve_s, on_text=on_text, logits_processor=logits_processor,
        )
        out.fallbacks.extend(skipped)  # stale trained entries: not mounted, with the reason
        return out

    def train(
        self,
        document: str,
        *,
        user_id: str,
        session_id: str | None = None,
        tags: Iterable[str] | None = None,
        tokens: int = 64,
        steps: int = 48,
        seed: int = 0,
        lr: float = 5e-3,
        ttl: float | timedelta | None = None,
        metadata: Mapping[str, Any] | None = None,
        progress: bool = True,
        checkpoint_path: str | Path | None | bool = None,
        **options: Any,
    ) -> MemoryRecord:
        """Learn a ``tokens``-long KV prefix that stands for ``document`` (model frozen) and store it as an entry
        of kind ``trained``; it mounts like any other entry. The document text is kept (secret-scanned) for text
        mode and inspection; if the document or the model changes, the entry is stale and is not mounted.

        The defaults are the benchmarked recipe (docs/trained-entries.md: 64 tokens, 48 steps, lr 5e-3 recovered
        106 % of a ~1,000-token document's NLL benefit, 6-8 minutes on one CPU core); longer documents have more
        lines to learn and want more steps. ``options`` are :class:`agentmem.train.TrainOptions` fields (samples,
        batch_size, time_budget_s, ...). Training checkpoints by default to ``<store>/train/<run>.ckpt`` (named by the
        user, document and settings), so calling ``train`` again after an interruption resumes where it stopped; the
        checkpoint is removed once the entry is stored. ``checkpoint_path`` names another file, ``False`` turns
        checkpoints off. An encrypted store does not checkpoint by default (the checkpoint holds the document's
        tokens unencrypted); pass ``checkpoint_path`` to accept that.

        Example:
            >>> entry = mem.train(manual, user_id="u1", tags=["manual"], tokens=64, steps=48)      # doctest: +SKIP
            >>> mem.generate("How do I reset the device?", user_id="u1", tags=["manual"])         # doctest: +SKIP
        """
        self._check_open()
        text = check_text(document, "document")
        if self._scanner is not None:
            text = self._scanner.apply(text)
        ckpt = self._train_checkpoint(checkpoint_path, text, user_id=user_id, tokens=tokens, steps=steps,
                                      seed=seed, lr=lr, options=options)
        blob, fields, record = self._bank.train_blob(
            text, tokens=tokens, steps=steps, seed=seed, lr=lr, progress=progress,
            checkpoint_path=ckpt, options=options,
        )
        meta = {**check_metadata(metadata), "training": record}
        entry = self._new_entry(text, user_id=user_id, session_id=session_id, kind="trained", role=None,
                                speaker=None, timestamp=None, tags=tags, ttl=ttl, metadata=meta)
        entry.attach_kv(blob, fields)
        self._store.add([entry])
        if ckpt is not None and checkpoint_path is None:  # ours, and the entry is stored: nothing left to resume
            Path(ckpt).unlink(missing_ok=True)
        return self._record(entry.row)

    def fidelity(self, question: str, *, user_id: str, answer: str, entry_ids: Sequence[str],
                 tokens: int = 8) -> dict[str, float | int]:
        """Score ``answer``'s first ``tokens`` tokens with ``entry_ids`` mounted as KV and re-encoded as text.

        Returns ``{"kl", "top1_agree", "tokens"}`` (KL(text ‖ kv), near 0 when mounting is exact); the server's
        fidelity monitor calls it on a share of live answers.

        Example:
            >>> out = mem.generate("Where do I live?", user_id="u1")                       # doctest: +SKIP
            >>> mem.fidelity("Where do I live?", user_id="u1", answer=out.text, entry_ids=out.mounted)["kl"]  # doctest: +SKIP
            3.1e-07
        """
        from agentmem.kv.fidelity import mode_kl

        self._check_open()
        hits = self._owned_hits(entry_ids, user_id)
        rows = self._store.catalog.get([h.id for h in hits])
        kv_memories, _ = self._bank.memories(rows, [h.memory_text for h in hits], strict=False,
                                             documents=[h.text for h in hits])
        text_memories = [BankMemory(id=h.id, text=h.memory_text) for h in hits]
        return mode_kl(self._bank.engine, check_text(question, "question"), kv_memories, text_memories,
                       check_text(answer, "answer"), tokens=tokens)

    def _train_checkpoint(self, given: str | Path | None | bool, document: str, **run: Any) -> Path | None:
        """Where ``train`` checkpoints: ``given``, else a file named by the run under ``<store>/train/``."""
        if given is False:
            return None
        if given is not None and given is not True:
            return Path(given)
        if self._cipher is not None and given is None:
            return None  # a plaintext checkpoint of an encrypted store's document: only when asked for
        import hashlib
        import json

        key = json.dumps({"doc": hashlib.sha256(document.encode()).hexdigest(), **run}, sort_keys=True, default=str)
        return self.path / "train" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.ckpt"

    def tool_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """Instructions describing ``tools`` (OpenAI function-tool dicts) the way the local LLM's chat template
        renders them (a Hermes-style fallback for templates without tool support); loads the model.

        Example:
            >>> mem.tool_prompt([{"type": "function", "function": {"name": "get_weather"}}])   # doctest: +SKIP
            '# Tools ... <tools> ... get_weather ... </tools> ...'
        """
        from agentmem.kv.tools import render_tools

        self._check_open()
        return render_tools(self._bank.engine.tokenizer, list(tools))

    def warmup(self) -> dict[str, float]:
        """Do the one-time work of a first run now, not inside the first request; returns seconds per step.

        Converts the embedded model once (cached), loads it, encodes the shared preamble, compiles the mount path
        (the numba re-rotation kernel), and exports the query embedder to ONNX (cached). Safe to call again.

        Example:
            >>> AgentMemory("./memdata").warmup()                                     # doctest: +SKIP
            {'embedder': 2.1, 'model': 1.3, 'engine': 0.9}
        """
        self._check_open()
        t = time.perf_counter()
        self._store.embedder.encode(["warm up"])  # loads MiniLM and exports / opens the ONNX query encoder
        self._store.embed_query("warm up")  # and the query graph (int8 feed-forward weights: quantised once, cached)
        times = {"embedder": time.perf_counter() - t}
        times.update(self._bank.warmup())
        log.info("warmup done in %.1f s (%s)", sum(times.values()),
                 ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
        return {k: round(v, 3) for k, v in times.items()}

    def _owned_hits(self, entry_ids: Sequence[str], user_id: str) -> list[Hit]:
        check_id(user_id, "user_id", required=True)
        entry_ids = check_entry_ids(entry_ids)
        now = time.time()
        rows = [r for r in self._store.catalog.get(entry_ids)  # superseded entries are never mounted
                if r.user_id == user_id and (r.expires_at is None or r.expires_at > now) and r.status == "active"]
        return [to_hit(r, 1.0, {}, text=self._sealer.open_text(r.id, "text", r.text),
                       memory_text=self._sealer.open_text(r.id, "memory_text", r.memory_text)) for r in rows]

    def load_model(self) -> None:
        """Load the local LLM now (it otherwise loads on the first encode or mount)."""
        self._check_open()
        _ = self._bank.engine

    def encode_pending(self, *, user_id: str | None = None, batch_size: int = 16, progress: bool = True) -> int:
        """Encode KV for every entry that has none for the loaded model (bulk loads, model changes).

        Shows a progress bar; returns how many entries were encoded.
        """
        from tqdm.auto import tqdm

        self._check_open()
        ids = self._store.scope_ids(user_id=check_id(user_id, "user_id", required=False), alive_at=time.time())
        get = self._store.catalog.get
        todo = [r for i in range(0, len(ids), 1000) for r in self._bank.stale_rows(get(ids[i : i + 1000]))]
        done = 0
        with tqdm(total=len(todo), desc="encoding KV", unit="entry", disable=not progress) as bar:
            for i in range(0, len(todo), batch_size):
                rows = todo[i : i + batch_size]
                lines = [self._sealer.open_text(r.id, "memory_text", r.memory_text) for r in rows]
                for row, (blob, fields) in zip(rows, self._bank.encode_blobs(lines)):
                    done += self._store.attach_blob(row.id, blob, **fields)
                bar.update(len(rows))
        return done
