"""The write pipeline: a checked memory becomes an entry; entries are consolidated, encoded and written
all-or-nothing; an entry gets a new version (``update``, ``restore``).

``remember`` / ``remember_many`` / ``remember_messages`` go through :meth:`Writer.write`:

    consolidate (merge restatements, plan supersessions: :mod:`agentmem.consolidate.local`)
      → encode the kept entries' KV where the policy says so (the bank)
      → add them all-or-nothing (:meth:`agentmem.entries.store.EntryStore.add`)
      → apply the decisions (supersede the replaced entries, count the merged restatements)

Each record says what the write did (``event``: ADD / UPDATE / NOOP, docs/lifecycle.md). The facade
(:class:`agentmem.AgentMemory`) holds a :class:`Writer` and only delegates to it.

Example:
    >>> writer = Writer(store=store, bank=bank, config=config, consolidator=consolidator, kb=kb,
    ...                 scanner=None, submit_llm=print, end_session_kv=lambda s, u: None)   # an AgentMemory's parts
    >>> writer.write([writer.new_entry("I moved to Lyon.", user_id="u9")], None)[0].event
    'ADD'
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from agentmem.config import MemoryConfig
from agentmem.consolidate.local import LocalConsolidator, apply_decisions
from agentmem.entries.kb_versions import KbVersions
from agentmem.entries.lifecycle import HistoryEvent
from agentmem.entries.documents import document_parts
from agentmem.entries.messages import transcript_memories
from agentmem.entries.records import embedding_line, memory_line, own_text, to_record
from agentmem.entries.store import EntryStore, NewEntry
from agentmem.errors import InvalidInputError
from agentmem.security import SecretScanner
from agentmem.types import MemoryRecord
from agentmem.validation import (
    check_id, check_kind, check_metadata, check_remember_item, check_role, check_session_id,
    check_speaker, check_tags, check_text, check_timestamp, check_ttl, format_timestamp,
)

if TYPE_CHECKING:
    from agentmem.ports.catalog import EntryRecord


class BlobEncoder(Protocol):
    """What the writer needs of the KV bank (:class:`agentmem.bank.KVBank`): whether to encode now, and the blobs."""

    def should_encode(self, encode: bool | None) -> bool: ...

    def encode_blobs(self, texts: Sequence[str]) -> list[tuple[bytes, dict[str, Any]]]: ...

    def encode_later(self, ids: Sequence[str]) -> None: ...


class Writer:
    """Entries in, records out: the store's one write path (see the module docstring).

    ``submit_llm`` queues written ids for the background LLM consolidation (``consolidation="llm"``);
    ``end_session_kv(session_id, user_id)`` drops a conversation's working KV whose text an update changed.
    """

    def __init__(self, *, store: EntryStore, bank: BlobEncoder, config: MemoryConfig,
                 consolidator: LocalConsolidator, kb: KbVersions, scanner: SecretScanner | None,
                 submit_llm: Callable[[list[str]], None],
                 end_session_kv: Callable[[str, str | None], None]) -> None:
        self.store, self.bank, self.config = store, bank, config
        self.consolidator, self.kb, self.scanner = consolidator, kb, scanner
        self.sealer = store.sealer
        self._submit_llm, self._end_session_kv = submit_llm, end_session_kv
        self.stats: Counter[str] = Counter()  # consolidation outcomes (AgentMemory.stats()["lifecycle"])
        self._last_ts = 0.0
        self._clock_lock = threading.Lock()

    def clock(self) -> float:
        """Strictly increasing wall-clock seconds, so entries written together keep their order.

        Example:
            >>> writer.clock() < writer.clock()
            True
        """
        with self._clock_lock:
            self._last_ts = max(time.time(), self._last_ts + 1e-6)
            return self._last_ts

    def record(self, row: EntryRecord) -> MemoryRecord:
        """The public record of a catalog row (texts opened).

        Example:
            >>> writer.record(store.catalog.get([rec.id])[0]).text
            'I moved to Lyon last May.'
        """
        return to_record(row, text=self.sealer.open_text(row.id, "text", row.text),
                         memory_text=self.sealer.open_text(row.id, "memory_text", row.memory_text))

    # --- new entries ---------------------------------------------------------------------------
    def new_entry(self, text: str, *, user_id: str, session_id: str | None = None, kind: str = "turn",
                  role: str | None = None, speaker: str | None = None, timestamp: datetime | str | None = None,
                  tags: Iterable[str] | None = None, ttl: float | timedelta | None = None,
                  metadata: Mapping[str, Any] | None = None, index: bool = True) -> NewEntry:
        """One memory (``remember``'s arguments), checked and with secrets redacted, as an entry for :meth:`write`.

        Example:
            >>> entry = writer.new_entry("The wifi password: hunter2", user_id="u1")
            >>> entry.row.kind, entry.line
            ('turn', '[...] The wifi password: [REDACTED:password]')
        """
        text = check_text(text)
        check_id(user_id, "user_id", required=True)
        check_session_id(session_id, required=False, scanner=self.scanner)
        check_kind(kind)
        role, speaker = check_role(role), check_speaker(speaker)
        tag_list = check_tags(tags)
        ttl_s = check_ttl(ttl)
        meta = check_metadata(metadata)
        occurred = format_timestamp(check_timestamp(timestamp) if timestamp is not None
                                    else datetime.now().astimezone())
        if self.scanner is not None:
            # before anything is embedded, indexed or encoded: secrets never enter the bank
            text = self.scanner.apply(text)
            speaker = self.scanner.apply(speaker) if speaker else speaker
            occurred = self.scanner.apply(occurred) if occurred else occurred  # a timestamp string is text too
            tag_list = [self.scanner.apply(t) for t in tag_list]
            meta = self.scanner.apply_value(meta)
        now = self.clock()
        line = memory_line(text, kind=kind, speaker=speaker, role=role, occurred_at=occurred)
        embed = embedding_line(text, kind=kind, speaker=speaker, role=role)  # the line without its time
        return self.store.new_entry(
            str(uuid.uuid4()), text, line, embed, user_id=user_id, session_id=session_id, kind=kind, role=role,
            speaker=speaker, occurred_at=occurred, metadata=meta, tags=tag_list, created_at=now,
            expires_at=None if ttl_s is None else now + ttl_s, indexed=bool(index),
            kb_version=self.kb.write_version() if kind == "knowledge" else None)

    def item_entries(self, items: Sequence[Mapping[str, Any]]) -> list[NewEntry]:
        """``remember_many``'s items (each a dict of :meth:`new_entry`'s arguments) as entries, all checked first.

        Example:
            >>> items = [{"text": "hi", "user_id": "u1"}, {"text": "yo", "user_id": "u2", "tags": ["greeting"]}]
            >>> [(e.row.user_id, e.row.tags) for e in writer.item_entries(items)]
            [('u1', ()), ('u2', ('greeting',))]
        """
        if isinstance(items, (str, Mapping)) or not isinstance(items, Sequence):
            raise InvalidInputError("remember_many takes a list of dicts of remember() arguments")
        entries = []
        for n, item in enumerate(items):
            text, fields = check_remember_item(item, n)
            entries.append(self.new_entry(text, **fields))
        return entries

    def message_entries(self, messages: Sequence[Any], *, metadata: Mapping[str, Any] | None = None,
                        **shared: Any) -> list[NewEntry]:
        """Chat messages (OpenAI-shaped dicts or LangChain messages) as entries
        (:func:`agentmem.entries.messages.transcript_memories`: system messages and call-only assistant messages are
        not stored, a tool result ``kind="tool"`` keeps its call's name and arguments); a message longer than
        ``MemoryConfig.message_max_words`` words becomes its parts, numbered in ``metadata["document"]`` as
        :meth:`document_entries` numbers a document's; ``shared``: ``remember_messages``'s other arguments.

        Example:
            >>> messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
            ...             {"role": "tool", "content": "sunny"}]
            >>> [(e.row.role, e.row.kind) for e in writer.message_entries(messages, user_id="u1")]
            [('user', 'turn'), ('tool', 'tool')]
        """
        meta = check_metadata(metadata)
        return [self.new_entry(text, kind=m.kind, role=m.role, speaker=m.speaker,
                               metadata=meta if info is None else {**meta, "document": info}, **shared)
                for m in transcript_memories(messages) for text, info in m.parts(self.config.message_max_words)]

    def document_entries(self, text: str, *, title: str | None, max_words: int,
                         metadata: Mapping[str, Any] | None = None, **shared: Any) -> list[NewEntry]:
        """A long text's parts (:func:`agentmem.entries.documents.split_document`) as entries: each part's text
        opens with ``title`` when given, and its metadata adds ``document`` = {id, part, parts, title}.

        Example:
            >>> entries = writer.document_entries("One. Two. Three.", title="Notes", max_words=2, user_id="u1")
            >>> [(e.row.text, e.row.metadata_json["document"]["part"]) for e in entries]
            [('Notes: One. Two.', 1), ('Notes: Three.', 2)]
        """
        text = check_text(text)
        title = check_id(title, "title", required=False)  # a short single-line name, like a speaker's
        meta = check_metadata(metadata)
        return [self.new_entry(f"{title}: {part}" if title else part, metadata={**meta, "document": info}, **shared)
                for part, info in document_parts(text, max_words, title=title)]

    def write(self, entries: Sequence[NewEntry], encode: bool | None, *, consolidate: bool = True,
              vectors: np.ndarray | None = None) -> list[MemoryRecord]:
        """Consolidate (merge restatements, supersede replaced facts), encode KV if the policy says so, then write
        everything all-or-nothing. Each record says what happened (``event``); a merged entry's record is the
        existing entry it was merged into (``NOOP``). ``vectors`` (checked by :meth:`given_vectors`, one row per
        entry): each entry's text already embedded, indexed as it is, nothing embedded here.

        Example:
            >>> entries = [writer.new_entry(t, user_id="u1") for t in ("I like tea.", "I moved to Paris in June.")]
            >>> [r.event for r in writer.write(entries, None)]      # Paris supersedes rec (Lyon)
            ['ADD', 'UPDATE']
        """
        mode = self.config.consolidation if consolidate else "off"
        decisions = texts = text_vectors = None
        if vectors is not None:  # stored as given: the text vectors the score and the conflict check read too
            text_vectors = vectors
        elif entries and mode == "local":
            vectors = self.store.embedder.encode([e.embed_text for e in entries],
                                                 batch_size=self.config.embedding_batch_size)
            texts = self._own_texts(entries)
            decisions, text_vectors = self.consolidator.plan([e.row for e in entries], texts, vectors, time.time())
        elif entries:  # every row keeps its text's vector: Hit.score reads it (agentmem.entries.text_vectors)
            texts = self._own_texts(entries)
            vectors, text_vectors = self._unconsolidated_vectors(entries, texts)
        keep = [i for i in range(len(entries)) if decisions is None or decisions[i].merge_into is None]
        self._store_entries(entries, keep, encode, vectors, text_vectors, texts)
        if decisions is None:
            if mode == "llm" and keep:
                self._submit_llm([entries[i].row.id for i in keep])
            return [replace(self.record(e.row), event="ADD") for e in entries]
        applied = apply_decisions(
            self.store.lifecycle, self.store.catalog.get, [e.row for e in entries], texts, decisions,
            seal=lambda i, t: self.sealer.seal_text(i, "history", t),
            open_text=lambda r: self.sealer.open_text(r.id, "text", r.text), now=self.clock())
        self.stats.update(applied.counts)
        if applied.unmerged:  # the entry a restatement matched was erased meanwhile: store the write after all
            self._store_entries(entries, applied.unmerged, encode, vectors, text_vectors, texts)
        merged = {r.id: r for r in self.store.catalog.get([d.merge_into for d in decisions if d.merge_into])}
        records = []
        for n, (e, d) in enumerate(zip(entries, decisions)):
            if d.merge_into and n not in applied.unmerged:
                records.append(replace(self.record(merged[d.merge_into]), event="NOOP", matched_id=d.merge_into))
            else:
                done = applied.superseded[n]
                records.append(replace(self.record(e.row), event="UPDATE" if done else "ADD", superseded_ids=done))
        return records

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """``AgentMemory.embed``: each text checked as a memory's text and redacted as a write would, then embedded.

        Example:
            >>> writer.embed_texts(["I live in Lyon."]).shape
            (1, 384)
        """
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise InvalidInputError("embed takes a list of texts")
        checked = [check_text(t) for t in texts]
        if self.scanner is not None:
            checked = [self.scanner.apply(t) for t in checked]
        return np.asarray(self.store.embed_texts(checked), dtype=np.float32)

    def given_vectors(self, vectors: Any, n: int, *, consolidate: bool) -> np.ndarray:
        """``remember_many``'s precomputed ``vectors`` for ``n`` items, checked: shape ``(n, embedder dim)``, finite,
        non-zero; returned unit-length float32. They skip consolidation, which compares texts it embeds itself.

        Example:
            >>> vectors = writer.given_vectors(np.ones((1, 384)), 1, consolidate=False)
            >>> vectors.dtype, round(float(np.linalg.norm(vectors[0])), 3)
            (dtype('float32'), 1.0)
        """
        if consolidate and self.config.consolidation != "off":
            raise InvalidInputError("remember_many(vectors=...) stores the items as given: pass consolidate=False")
        try:
            array = np.asarray(vectors, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"vectors must be a 2-D array of numbers ({exc})") from None
        dim = self.store.embedder.dim
        if array.shape != (n, dim):
            raise InvalidInputError(f"vectors must have shape ({n}, {dim}): one embedding per item; got {array.shape}")
        norms = np.linalg.norm(array, axis=1, keepdims=True)
        if not np.isfinite(array).all() or (norms == 0).any():
            raise InvalidInputError("vectors must be finite and non-zero")
        return array / norms

    def _unconsolidated_vectors(self, entries: Sequence[NewEntry],
                                texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Index (memory-line) vectors and text vectors of entries written without consolidation, in one embedding
        call: ``Hit.score`` and recall's conflict check read the text's vector from the row (a row without one is
        re-embedded by every conflict check that looks at it: 2,000 such entries, recall p50 262 ms instead of
        23 ms). A text that is its own memory line (no head) is embedded once. ``texts``: :meth:`_own_texts`."""
        lines = [e.embed_text for e in entries]
        unique = list(dict.fromkeys(lines + texts))
        at = {t: i for i, t in enumerate(unique)}
        embedded = np.asarray(self.store.embedder.encode(unique, batch_size=self.config.embedding_batch_size),
                              dtype=np.float32)
        unit = embedded / np.maximum(np.linalg.norm(embedded, axis=1, keepdims=True), 1e-12)
        return embedded[[at[t] for t in lines]], unit[[at[t] for t in texts]]

    def _own_texts(self, entries: Sequence[NewEntry]) -> list[str]:
        """The texts whose vectors the rows keep for their score and conflict checks (a tool result's with its
        tool's name: :func:`~agentmem.entries.records.own_text`)."""
        return [own_text(self.sealer.open_text(e.row.id, "text", e.row.text), kind=e.row.kind,
                         speaker=e.row.speaker) for e in entries]

    def _store_entries(self, entries: Sequence[NewEntry], keep: Sequence[int], encode: bool | None,
                       vectors: Any, text_vectors: Any, texts: Sequence[str] | None = None) -> None:
        """Encode (when the policy says so) and write ``entries[i]`` for ``i`` in ``keep``, all-or-nothing;
        ``texts``: the entries' :meth:`_own_texts`, where the caller opened them already."""
        kept = [entries[i] for i in keep]
        inline = bool(kept) and self.bank.should_encode(encode)
        if inline:
            for entry, (blob, fields) in zip(kept, self.bank.encode_blobs([e.line for e in kept])):
                entry.attach_kv(blob, fields)
        if text_vectors is not None:
            own = self._own_texts(kept) if texts is None else [texts[i] for i in keep]
            self.consolidator.attach_vectors([e.row for e in kept], text_vectors[list(keep)], own)
        self.store.add(kept, None if vectors is None else vectors[list(keep)])
        if not inline and encode is None:  # kv_encoding "background": encoded after the write returns
            self.bank.encode_later([e.row.id for e in kept])

    # --- versions ------------------------------------------------------------------------------
    def update(self, row: EntryRecord, *, text: str, tags: Iterable[str] | None, metadata: Mapping[str, Any] | None,
               ttl: float | timedelta | None, reason: str | None, index: bool | None, clear_ttl: bool,
               timestamp: datetime | str | None) -> MemoryRecord:
        """``AgentMemory.update``'s arguments checked, secrets redacted, written as ``row``'s next version.

        Example:
            >>> writer.update(row, text="I moved to Paris.", tags=None, metadata=None, ttl=None, reason=None,
            ...               index=None, clear_ttl=False, timestamp=None).version
            2
        """
        text = check_text(text)
        tag_list = None if tags is None else check_tags(tags)
        meta = None if metadata is None else check_metadata(metadata)
        ttl_s = check_ttl(ttl)
        if reason is not None:
            reason = check_text(reason, "reason")
        occurred = format_timestamp(check_timestamp(timestamp) if timestamp is not None
                                    else datetime.now().astimezone())
        if self.scanner is not None:  # before anything is embedded or encoded, as on remember
            text = self.scanner.apply(text)
            tag_list = None if tag_list is None else [self.scanner.apply(t) for t in tag_list]
            meta = None if meta is None else self.scanner.apply_value(meta)
            reason = None if reason is None else self.scanner.apply(reason)
            occurred = self.scanner.apply(occurred) if occurred else occurred  # a timestamp string is text too
        return self.new_version(row, text, tag_list=tag_list, meta=meta, ttl_s=ttl_s, clear_ttl=clear_ttl,
                                reason=reason, index=index, occurred=occurred, op="update")

    def new_version(self, row: EntryRecord, text: str, *, tag_list: list[str] | None, meta: dict[str, Any] | None,
                    ttl_s: float | None, clear_ttl: bool, reason: str | None, index: bool | None,
                    occurred: str | None, op: str) -> MemoryRecord:
        """Write ``text`` (checked) as the entry's next version, active, logged as ``op`` (update or restore).

        Example:
            >>> writer.new_version(row, "I moved to Paris.", tag_list=None, meta=None, ttl_s=None, clear_ttl=False,
            ...                    reason=None, index=None, occurred=None, op="update").version
            2
        """
        now = self.clock()
        line = memory_line(text, kind=row.kind, speaker=row.speaker, role=row.role, occurred_at=occurred)
        version = (row.version or 1) + 1
        indexed = row.indexed if index is None else bool(index)
        seal = self.sealer.seal_text
        fields: dict[str, Any] = dict(
            text=seal(row.id, "text", text), memory_text=seal(row.id, "memory_text", line),
            occurred_at=occurred, version=version, status="active", superseded_by=None, indexed=indexed,
            # the new text's vectors (score, conflicts)
            **self.consolidator.vector_fields(own_text(text, kind=row.kind, speaker=row.speaker), kind=row.kind),
        )
        if meta is not None:
            fields["metadata_json"] = meta
        if ttl_s is not None or clear_ttl:
            fields["expires_at"] = None if clear_ttl else now + (ttl_s or 0.0)
        blob = kv_fields = None
        if self.bank.should_encode(None) and row.kind != "trained":
            encoded = self.bank.encode_blobs([line])
            if encoded:
                blob, kv_fields = encoded[0]
        events = [HistoryEvent(row.id, version, op, seal(row.id, "history", text), now, reason,
                               related_id=row.superseded_by if op == "restore" else None)]
        embed = embedding_line(text, kind=row.kind, speaker=row.speaker, role=row.role)
        self.store.replace(row, fields, embed_text=embed if indexed else None, index_text=line if indexed else None,
                           tags=tag_list, blob=blob, kv_fields=kv_fields, events=events)
        if blob is None and row.kind != "trained":
            self.bank.encode_later([row.id])
        if row.session_id:  # the old text may sit in its conversation's working KV
            self._end_session_kv(row.session_id, row.user_id)
        return self.record(self.store.catalog.get([row.id])[0])

    def restore(self, row: EntryRecord, version: int | None = None) -> MemoryRecord:
        """``AgentMemory.restore``: ``row`` active again or, with ``version``, that version's text as a new one.

        Example:
            >>> mem.remember("I moved to Paris in June.", user_id="u1").superseded_ids == (rec.id,)
            True
            >>> writer.restore(store.catalog.get([rec.id])[0]).status
            'active'
        """
        current = row.version or 1
        if version is not None and version != current:
            if isinstance(version, bool) or not isinstance(version, int):
                raise InvalidInputError("version must be an integer")
            texts = {h.version: h.text for h in self.store.lifecycle.history(row.id)
                     if h.op in ("add", "update", "restore")}
            if version not in texts:
                raise InvalidInputError(f"entry {row.id!r} has no version {version} (versions: {sorted(texts)})")
            text = self.sealer.open_text(row.id, "history", texts[version])
            return self.new_version(row, text, tag_list=None, meta=None, ttl_s=None, clear_ttl=False,
                                    reason=f"restored version {version}", index=None,
                                    occurred=format_timestamp(datetime.now().astimezone()), op="restore")
        if row.status == "active":
            raise InvalidInputError(f"entry {row.id!r} is active: nothing to restore (version= brings back an "
                                    f"earlier text)")
        sealed = self.sealer.seal_text(row.id, "history", self.record(row).text)
        event = HistoryEvent(row.id, current, "restore", sealed, self.clock(), "restored by the user",
                             related_id=row.superseded_by)
        self.store.lifecycle.apply_event(event)
        return self.record(self.store.catalog.get([row.id])[0])


__all__ = ["BlobEncoder", "Writer"]
