"""The KV bank: joins the entry store (rows, blob files) to the KV engine (tensors, mounting).

It owns the lazily loaded model and engine, decides when an entry's KV is encoded (``kv_encoding``:
``eager`` on every write, ``lazy`` when the model is already loaded or at first mount, ``background`` like lazy
while the model is idle and by a worker thread after the write returns while it is busy, ``off`` never), turns
catalog rows into mountable memories, and repairs what cannot be mounted ("hot update"): a blob made by
another model or corrupted on disk is re-encoded with the current model and stored again. Nothing here
logs KV or memory text; only ids and reasons.

Example:
    >>> bank = KVBank(store, config, model_spec=None)     # store, config: an AgentMemory's
    >>> bank.loaded
    False
    >>> len(bank.engine.fingerprint.digest) > 8, bank.loaded    # loads the embedded SmolLM2 on first use
    (True, True)
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentmem.config import MemoryConfig
from agentmem.erasure import Erasure
from agentmem.errors import BlobCorruptedError, FingerprintMismatchError
from agentmem.ports.catalog import EntryRecord
from agentmem.entries.store import EntryStore

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class BankMemory:
    """A recalled entry ready to mount (satisfies ``agentmem.kv.MountMemory``)."""

    id: str
    text: str
    load_kv: Any = None
    trained: bool = False  # learned KV: mounted as is, never compared with text ids or recomputed
    kv_tokens: int | None = None
    load_fallback: str | None = None  # set by load_kv when it had to re-encode: why (reported in out.fallbacks)


@dataclass
class BankStats:
    counts: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts)


class KVBank:
    def __init__(self, store: EntryStore, config: MemoryConfig, *, model_spec: Any = None) -> None:
        self.store = store
        self.config = config
        self.model_spec = model_spec
        self.stats = BankStats()
        self._engine: Any = None
        self._lock = threading.Lock()
        self._behind: _WriteBehind | None = None
        self._behind_lock = threading.Lock()
        self._group = _GroupEncoder(lambda texts: self.engine.encode_many(texts))

    # --- the model, loaded on first need ----------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self._engine is not None

    @property
    def engine(self) -> Any:
        with self._lock:
            if self._engine is None:
                from agentmem.kv import KVEngine, load_model
                from agentmem.kv.device import apply_threads

                apply_threads(self.config.threads, workers=self.config.workers)
                device, dtype = self._placement()
                model, tokenizer = load_model(self.model_spec, cache_dir=self.config.cache_dir, device=device,
                                              dtype=dtype)
                self._engine = KVEngine(
                    model, tokenizer, codec=self.config.kv_codec, mount_budget=self.config.mount_budget_tokens,
                    prefix_cache=self.config.prefix_cache, decode_lanes=self.config.decode_lanes,
                )
            return self._engine

    def forget_erased(self, _erasure: Erasure | None = None) -> None:
        """Drop what the loaded engine memoises per memory text (an :meth:`AgentMemory.on_erase` listener); an
        engine not loaded yet holds nothing."""
        engine = self._engine  # not under _lock: an erase must not wait for a model load (a new engine is empty)
        if engine is not None:
            engine.layout.forget_entry_texts()

    def _placement(self) -> tuple[str | None, str | None]:
        """``(device, dtype)`` for :func:`~agentmem.kv.load_model` from the config.

        A model given already loaded keeps its own placement unless the config names one explicitly.
        """
        device, dtype = self.config.device, self.config.torch_dtype
        if isinstance(self.model_spec, tuple):
            explicit = self.config.model_fields_set
            return (device if "device" in explicit else None), (dtype if "torch_dtype" in explicit else None)
        return device, dtype

    def warmup(self) -> dict[str, float]:
        """Load (converting once) the model, encode the preamble and compile the mount path; seconds per step."""
        t0 = time.perf_counter()
        engine = self.engine
        times = {"model": time.perf_counter() - t0}
        t = time.perf_counter()
        engine.warmup()
        times["engine"] = time.perf_counter() - t
        return times

    def should_encode(self, requested: bool | None) -> bool:
        """Whether a write encodes KV now (``requested`` is ``remember(..., encode=)``)."""
        if requested is not None:
            return requested
        if self.config.kv_encoding == "eager":
            return True
        if self.config.kv_encoding == "background":  # inline while the model is idle, else after the write
            return self.loaded and self.engine.idle
        return self.config.kv_encoding == "lazy" and self.loaded

    def encode_later(self, ids: Sequence[str]) -> None:
        """With ``kv_encoding="background"``, queue entries written while the model was busy for the worker that
        encodes their KV after the write returned (only once the model is loaded: before that, the first mount
        encodes them)."""
        if self.config.kv_encoding != "background" or not ids or not self.loaded:
            return
        with self._behind_lock:
            if self._behind is None:
                self._behind = _WriteBehind(self)
        self._behind.submit(list(ids))

    def close(self) -> None:
        """Stop the background encoder (entries still queued are encoded by their first mount)."""
        if self._behind is not None:
            self._behind.close()

    # --- encode ----------------------------------------------------------------------------------
    def encode_blobs(self, texts: Sequence[str]) -> list[tuple[bytes, dict[str, Any]]]:
        """Blob bytes and catalog KV fields for memory lines; empty when the model cannot mount KV."""
        engine = self.engine
        if not engine.supports_kv:
            return []
        # a caller inside the model's lock (a mount) encodes itself: waiting for a group led by another thread,
        # which needs that lock, would never end
        entries = engine.encode_many(list(texts)) if engine.holds_lock else self._group.encode(list(texts))
        return [(engine.to_bytes(e), self._kv_fields(e.num_tokens)) for e in entries]

    def attach_encoded(self, rows: Sequence[EntryRecord]) -> int:
        """Encode the rows' memory lines and attach each blob to its entry if it still exists at the version read
        (``attach_blob``: a forgotten or updated entry gets none, and what encoding memoised of its text is dropped);
        how many were attached. Shared by :meth:`AgentMemory.encode_pending` and the write-behind worker."""
        lines = [self.store.sealer.open_text(r.id, "memory_text", r.memory_text) for r in rows]
        return sum(stored for _, stored in self._attach(rows, self.encode_blobs(lines)))

    def _attach(self, rows: Sequence[EntryRecord], encoded: Sequence[tuple[bytes, dict[str, Any]]]
                ) -> list[tuple[bytes, bool]]:
        """Attach each encoded blob to its row's entry if it is still at the version read; ``(blob, stored)`` per
        row. A forgotten or updated entry gets none, and what encoding memoised of its text is dropped."""
        out = []
        for row, (blob, fields) in zip(rows, encoded):
            stored = self.store.attach_blob(row.id, blob, expect_version=row.version, **fields)
            if not stored:
                self.forget_erased()
            out.append((blob, stored))
        return out

    def _kv_fields(self, tokens: int, codec: str | None = None) -> dict[str, Any]:
        codec = codec or self.config.kv_codec  # the catalog's kv_dtype column names the blob's codec
        # no kb_version here: it is the knowledge version an entry was written under (entries/kb_versions.py)
        return dict(kv_tokens=tokens, kv_fingerprint=self.engine.fingerprint.digest, kv_dtype=codec)

    def stale_rows(self, rows: Sequence[EntryRecord]) -> list[EntryRecord]:
        """Rows without KV for the loaded model (never encoded, or encoded by another model)."""
        digest = self.engine.fingerprint.digest
        return [r for r in rows if r.kind != "trained" and (not r.kv_path or r.kv_fingerprint != digest)]

    # --- trained entries -------------------------------------------------------------------------
    def train_blob(self, document: str, *, tokens: int, steps: int, seed: int, lr: float, progress: bool,
                   checkpoint_path: Any, options: dict[str, Any]) -> tuple[bytes, dict[str, Any], dict[str, Any]]:
        """Train a KV prefix for ``document`` (model frozen): blob bytes, catalog KV fields, training record."""
        from agentmem.kv.types import EncodedEntry
        from agentmem.train import PromptLayout, TrainOptions, train_prefix

        engine = self.engine
        engine._require_kv()
        prefix = train_prefix(
            engine.model, engine.tokenizer, document, tokens=tokens, steps=steps, seed=seed, lr=lr,
            layout=PromptLayout(engine.tokenizer, engine.layout),  # train exactly what this engine mounts
            options=TrainOptions(**options), progress=progress,
            checkpoint_path=checkpoint_path, fingerprint=engine.fingerprint.digest,
        )
        entry = EncodedEntry(
            token_ids=torch.tensor(prefix.token_ids, dtype=torch.long), keys=prefix.keys.detach(),
            values=prefix.values.detach(), offset=int(prefix.offset), fingerprint=engine.fingerprint.digest,
            preamble_digest=engine.layout.preamble_digest,
        )
        # Learned KV keep full precision: no benchmark has shown an integer codec safe for them (docs/kv-compression.md).
        codec = self.config.kv_codec if self.config.kv_codec in _DTYPES else str(engine.dtype).removeprefix("torch.")
        return engine.to_bytes(entry, codec_name=codec), self._kv_fields(prefix.tokens, codec), prefix.record

    def stale_reason(self, row: EntryRecord, document: str) -> str | None:
        """Why a trained entry must not be mounted (document or model changed), else None."""
        from agentmem.train import is_stale

        record = (row.metadata_json or {}).get("training") or {}
        return is_stale(record, document, self.engine.fingerprint.digest,
                        preamble_digest=self.engine.layout.preamble_digest)

    # --- mount -----------------------------------------------------------------------------------
    def memories(self, rows: Sequence[EntryRecord], texts: Sequence[str], *, strict: bool,
                 documents: Sequence[str] | None = None) -> tuple[list[BankMemory], list[tuple[str, str]]]:
        """Mountable memories for recalled rows (most relevant first) and the stale trained entries left out.

        A trained entry mounts its learned KV; its text (for text mode) is the document it stands for.
        """
        out: list[BankMemory] = []
        skipped: list[tuple[str, str]] = []
        fresh = self._encode_unencoded(rows, texts)
        for i, (row, text) in enumerate(zip(rows, texts)):
            if row.kind == "trained":
                document = documents[i] if documents is not None else text
                reason = self.stale_reason(row, document)
                if reason is not None:
                    self.stats.counts["stale_trained"] += 1
                    log.warning("trained entry %s not mounted: %s", row.id, reason)
                    if strict:
                        from agentmem.errors import StaleEntryError

                        raise StaleEntryError(f"trained entry {row.id} is stale: {reason}; retrain it")
                    skipped.append((row.id, reason))
                    continue
            memory = BankMemory(id=row.id, text=text, trained=row.kind == "trained", kv_tokens=row.kv_tokens)
            memory.load_kv = self._loader(row, memory, strict, fresh.get(row.id))
            out.append(memory)
        return out, skipped

    def _encode_unencoded(self, rows: Sequence[EntryRecord], texts: Sequence[str]) -> dict[str, tuple[bytes, bool]]:
        """Encode, before the mount takes the model's lock, the recalled memories never encoded (written before the
        model loaded, or queued for the background encoder): one batched forward through the group encoder, shared
        with concurrent writers and mounts, instead of one prefill per memory inside the mount. Each blob is stored
        if its entry is still at the version read. ``{entry id: (blob, stored)}``; empty when the model is not
        loaded, cannot mount KV, or a line is refused (each memory's loader then encodes, or fails, on its own)."""
        todo = [(row, text) for row, text in zip(rows, texts) if row.kind != "trained" and not row.kv_path]
        if not todo or not self.loaded or not self.engine.supports_kv:
            return {}
        try:
            encoded = self.encode_blobs([text for _, text in todo])
        except Exception as exc:  # noqa: BLE001 - the loaders encode one by one and report their own error
            log.info("batched encode of %d memories before a mount failed (%s); encoding each", len(todo), exc)
            return {}
        rows = [row for row, _ in todo]
        fresh = {row.id: done for row, done in zip(rows, self._attach(rows, encoded))}
        self.stats.counts["encoded_on_mount"] += len(fresh)  # encoded for a mount, as the loader counts
        return fresh

    def _loader(self, row: EntryRecord, memory: BankMemory, strict: bool, fresh: tuple[bytes, bool] | None = None):
        """``memory.load_kv``: the stored entry, or a fresh encoding stored in its place, with the reason recorded
        in ``memory.load_fallback`` so the engine reports it in ``out.fallbacks`` (it was swallowed before).
        ``fresh`` is ``(blob, stored)`` when :meth:`_encode_unencoded` encoded the memory before the mount."""

        def load() -> Any:
            engine = self.engine
            memory.load_fallback = None
            reason = "no stored KV yet"
            if fresh is not None:
                blob, stored = fresh
                memory.load_fallback = f"{reason}: " + ("encoded from text and stored again" if stored else
                                                         _NOT_STORED)
                return engine.from_bytes(blob)
            if row.kv_path:
                try:
                    entry = engine.from_bytes(self.store.map_blob(row))  # zero-copy unless encrypted
                    self.stats.counts["blob_loads"] += 1
                    return entry
                except (FingerprintMismatchError, BlobCorruptedError) as exc:
                    # The reason names the mismatch or the damage, never KV content.
                    self.stats.counts["fingerprint_mismatch" if isinstance(exc, FingerprintMismatchError)
                                      else "corrupted_blobs"] += 1
                    log.warning("entry %s: stored KV not mountable (%s); re-encoding", row.id, exc)
                    if strict or row.kind == "trained":
                        raise
                    reason = f"{type(exc).__name__}: {exc}"
            # No usable blob: encode now and store it, so the next mount is a plain load ("hot update").
            entry = engine.encode(memory.text)
            self.stats.counts["encoded_on_mount"] += 1
            blob = engine.to_bytes(entry)
            # attach_blob stores nothing when the entry was forgotten meanwhile: say which happened
            # expect_version: if the entry was updated meanwhile, this KV is of the old text and is not stored
            if self.store.attach_blob(row.id, blob, expect_version=row.version, **self._kv_fields(entry.num_tokens)):
                memory.load_fallback = f"{reason}: encoded from text and stored again"
            else:
                memory.load_fallback = f"{reason}: {_NOT_STORED}"
            # mount what was stored (with a lossy codec, not the fresh full-precision KV), so this first mount
            # answers exactly as every later one that loads the blob
            return engine.from_bytes(blob)

        return load


_NOT_STORED = "encoded from text; not stored (the entry was forgotten or updated meanwhile)"


@dataclass
class _EncodeJob:
    texts: list[str]
    lead: bool = False
    result: list[Any] | None = None
    error: BaseException | None = None


class _GroupEncoder:
    """Memory lines of concurrent writers encoded in one batched forward (a group commit): a writer that finds the
    encoder free leads; it encodes its own lines and every writer's queued behind it (up to ``MAX_TEXTS``), hands the
    lead to the next writer waiting, and returns. Alone, a writer encodes at once, as before. 16 server clients
    writing at once each waited for 15 single prefills under the model's lock (remember p50 2.8 s on 2 cores).
    A batch that fails is encoded writer by writer, so an error reaches only the writer whose line caused it."""

    MAX_TEXTS = 32

    def __init__(self, encode_many: Any) -> None:
        self._encode_many = encode_many
        self._cond = threading.Condition()
        self._queue: list[_EncodeJob] = []
        self._busy = False

    def encode(self, texts: list[str]) -> list[Any]:
        job = _EncodeJob(texts)
        with self._cond:
            self._queue.append(job)
            if not self._busy:
                self._busy = job.lead = True
            self._cond.wait_for(lambda: job.lead or job.result is not None or job.error is not None)
        if job.result is None and job.error is None:
            self._lead()
        if job.error is not None:
            raise job.error
        return job.result or []

    def _lead(self) -> None:
        with self._cond:
            batch, taken = [], 0
            while self._queue and (not batch or taken + len(self._queue[0].texts) <= self.MAX_TEXTS):
                batch.append(self._queue.pop(0))
                taken += len(batch[-1].texts)
        try:
            self._encode_batch(batch)
        finally:  # whatever happened, every writer of the batch is answered and the lead passed on
            with self._cond:
                for job in batch:
                    job.lead = False
                    if job.result is None and job.error is None:
                        job.error = RuntimeError("KV encoding was interrupted")
                if self._queue:
                    self._queue[0].lead = True  # the next writer waiting encodes the next batch
                else:
                    self._busy = False
                self._cond.notify_all()

    def _encode_batch(self, batch: list[_EncodeJob]) -> None:
        try:
            entries = iter(self._encode_many([t for job in batch for t in job.texts]))
            for job in batch:
                job.result = [next(entries) for _ in job.texts]
        except Exception:  # someone's line is refused (too long ...): each writer gets its own outcome
            for job in batch:
                try:
                    job.result, job.error = self._encode_many(job.texts), None
                except Exception as exc:
                    job.result, job.error = None, exc


class _WriteBehind:
    """The worker thread of ``kv_encoding="background"``: encodes queued entries in small batches while the model is
    idle (no answer decoding, no prompt waiting: a chat that arrives meanwhile waits for one batch at most; under
    steady chat load the first mount encodes them instead), and attaches the blobs only to entries that still exist
    at the version read (``attach_blob``: a forgotten or updated entry gets none)."""

    BATCH = 2
    IDLE_POLL_S = 0.02

    def __init__(self, bank: KVBank) -> None:
        self.bank = bank
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentmem-kv-write-behind", daemon=True)
        self._thread.start()

    def submit(self, ids: list[str]) -> None:
        for entry_id in ids:
            self._queue.put(entry_id)

    def close(self) -> None:
        self._closing.set()
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self.BATCH and not self._queue.empty():
                batch.append(self._queue.get())
            ids = [i for i in batch if i is not None]
            try:
                while ids and not self.bank.engine.idle and not self._closing.wait(self.IDLE_POLL_S):
                    pass  # the model is answering someone: wait
                if not self._closing.is_set():
                    self._encode(ids)
            except Exception:  # a failed encode leaves the entries to their first mount; the worker goes on
                log.exception("background KV encoding of %d entries failed; they encode when first mounted", len(ids))
            if len(ids) < len(batch):
                return  # close() was called

    def _encode(self, ids: list[str]) -> None:
        rows = self.bank.stale_rows(self.bank.store.catalog.get(ids)) if ids else []
        if rows:
            self.bank.stats.counts["encoded_behind"] += self.bank.attach_encoded(rows)


__all__ = ["BankMemory", "KVBank"]
