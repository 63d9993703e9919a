"""The entry store: catalog row + vector + optional KV blob, written all-or-nothing over the ports.

Write protocol (so a crash leaves only rows marked in flight, which recovery finds without scanning anything else):
    row inserted as pending ("adding")  →  blob staged, vector upserted, blob published  →  row committed
    row marked "deleting" (hidden)      →  vector and blob erased                           →  row deleted
Readers see committed rows only. :meth:`EntryStore.recover` (run on open) rolls back abandoned adds and finishes
abandoned deletions recorded more than ``pending_grace_s`` ago (a live writer finishes in well under a second), and
discards blobs staged as long ago. No process ids: it works the same with writers on other hosts.

Example:
    >>> own = EntryStore(Path("entries"), MemoryConfig(), embedder=store.embedder)  # SQLite, embedded Chroma, files
    >>> tea = own.new_entry("e1", "I like green tea.", "[5 May 2026] I like green tea.", "I like green tea.",
    ...                     user_id="u1", session_id=None, kind="fact", role=None, speaker=None,
    ...                     occurred_at="5 May 2026", metadata={}, tags=[], created_at=time.time(), expires_at=None)
    >>> own.add([tea]); [h.row.id for h in own.search("green tea", Scope("u1"), k=5)]
    ['e1']
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from agentmem.config import MemoryConfig
from agentmem.errors import BlobCorruptedError
from agentmem.ports import BlobStore, Catalog, Embedder, VectorIndex
from agentmem.ports.catalog import CHAIN_CUTS_KEY, CatalogScope, EntryRecord, chain_cuts_value
from agentmem.entries.lifecycle import ACTIVE, HistoryEvent, Lifecycle
from agentmem.entries.filters import Predicate
from agentmem.entries.chain_ends import ChainEnds
from agentmem.entries.versions import CHAIN, current_versions, pages
from agentmem.recall.rerank import HeadEntry
from agentmem.recall.context import context_cosines, neighbours
from agentmem.entries.context_vectors import ContextVectors
from agentmem.entries.records import overlap_leaves_out
from agentmem.entries.text_vectors import text_cosine
from agentmem.ports.vectors import CONTEXT_SPACE
from agentmem.recall.calibration import stems, word_overlap
from agentmem.recall.head import rank_candidates
from agentmem.recall.ranking_weights import load_ranking
from agentmem.recall.retrieval import Candidates, best_first, fuse
from agentmem.ports.vectors import where_clause
from agentmem.security.blind import BlindIndex
from agentmem.security.crypto import Cipher
from agentmem.security.sealer import Sealer

log = logging.getLogger(__name__)

BlobSealer = Callable[[bytes, str], bytes]  # (plaintext, entry id) -> bytes on disk, and the reverse


@dataclass
class NewEntry:
    row: EntryRecord  # its tags included
    embed_text: str  # what the dense index embeds (agentmem.entries.records.embedding_line: no time)
    line: str  # the memory line: what the lexical index holds and the KV encodes (time and speaker included)
    blob: bytes | None = None  # KV blob bytes (already sealed/encrypted by the caller's policy)
    history: HistoryEvent | None = None  # the entry's "add" event, written in the same transaction

    def attach_kv(self, blob: bytes, fields: dict[str, Any]) -> None:
        """Give the entry its KV blob and the row's KV fields (``kv_tokens``, ``kv_fingerprint``, ...) before
        :meth:`EntryStore.add` writes both.

        Example:
            >>> fact = EntryRecord(id="e1", user_id="u1", kind="fact", text="I like tea.", memory_text="I like tea.",
            ...                    created_at=time.time())
            >>> entry = NewEntry(fact, embed_text="I like tea.", line="I like tea.")
            >>> entry.attach_kv(b"kv bytes", {"kv_tokens": 12}); store.add([entry])
            >>> stored = store.catalog.get(["e1"])[0]
            >>> stored.kv_tokens, store.read_blob(stored)
            (12, b'kv bytes')
        """
        self.blob = blob
        for key, value in fields.items():
            setattr(self.row, key, value)


@dataclass
class Scope:
    user_id: str
    session_id: str | None = None
    kinds: Sequence[str] | None = None
    tags: Sequence[str] | None = None
    predicate: Predicate | None = None
    include_superseded: bool = False  # superseded / retracted entries are hidden unless asked for
    exclude_roles: Sequence[str] = ()
    kb_versions: Sequence[str | None] | None = None  # knowledge entries of these versions only (None: any)

    def admits(self, row: EntryRecord, now: float) -> bool:
        if row.user_id != self.user_id:
            return False
        if not self.include_superseded and row.status != ACTIVE:
            return False
        if row.role is not None and row.role in self.exclude_roles:
            return False
        if self.kb_versions is not None and row.kind == "knowledge" and row.kb_version not in self.kb_versions:
            return False
        if self.session_id is not None and row.session_id != self.session_id:
            return False
        if self.kinds and row.kind not in self.kinds:
            return False
        if row.expires_at is not None and row.expires_at <= now:
            return False
        if self.tags and not set(self.tags) <= set(row.tags):
            return False
        return self.predicate is None or self.predicate(row.metadata_json or {})


class ScoredRow:
    """A ranked row (a plain value: changing it writes nothing), its calibrated relevance ``score`` and that score's
    parts ``scores`` (:meth:`EntryStore.search`).

    ``settle``: where the cosine of the hit is not known yet (a hit the dense pool did not return), the step that
    gives (score, parts) from the parts so far, run when either is first read. Recall ranks k hits plus its conflict
    check's look-ahead and returns k: the look-ahead's cosines cost a vector read in a quarter of the recalls at
    10,000 entries, and are read in under one in twenty (research/notes/recall-latency.md).

    Example:
        >>> row = EntryRecord(id="a", user_id="u", kind="turn", text="hi", memory_text="hi", created_at=0.0)
        >>> hit = ScoredRow(row, scores={"rank": 1.0}, settle=lambda parts: (0.4, {**parts, "dense": 0.5}))
        >>> hit.score, hit.scores
        (0.4, {'rank': 1.0, 'dense': 0.5})
    """

    __slots__ = ("row", "_score", "_scores", "_settle")

    def __init__(self, row: EntryRecord, score: float = 0.0, scores: dict[str, float] | None = None, *,
                 settle: Callable[[dict[str, float]], tuple[float, dict[str, float]]] | None = None) -> None:
        self.row = row
        self._score, self._scores, self._settle = score, {} if scores is None else scores, settle

    @property
    def score(self) -> float:
        if self._settle is not None:
            self._complete()
        return self._score

    @property
    def scores(self) -> dict[str, float]:
        if self._settle is not None:
            self._complete()
        return self._scores

    def _complete(self) -> None:
        settle, self._settle = self._settle, None
        self._score, self._scores = settle(self._scores)  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"ScoredRow({self.row.id!r}, score={self.score!r})"


class EntryStore:
    """Catalog + vector index + blob store (SQLite, embedded Chroma and files under ``root`` by default).

    Any part may be passed in (an implementation of :mod:`agentmem.ports`); the rest are built by
    :mod:`agentmem.factory` from the URLs in ``config``.
    """

    def __init__(self, root: Path, config: MemoryConfig, *, embedder: Embedder | None = None,
                 cipher: Cipher | None = None, catalog: Catalog | None = None, vectors: VectorIndex | None = None,
                 blobs: BlobStore | None = None) -> None:
        from agentmem import factory

        # MemoryConfig.ranking (the bundled weights or a weights file), read first: a bad file opens nothing
        ranking = load_ranking(config.ranking)
        self.root = root
        self.cipher = cipher
        self.sealer = Sealer(cipher)  # every sealed value of the store (texts, blobs) goes through this one
        # encrypted stores keep keyed word hashes, not words, in the lexical index
        self._blind_index = BlindIndex(cipher.index_key) if cipher is not None else None
        self.config = config
        root.mkdir(parents=True, exist_ok=True)
        ctx = factory.BuildContext(root=root, config=config, cipher=cipher)
        parts = factory.build_store_parts(ctx, catalog=catalog, vectors=vectors, blobs=blobs)
        self.catalog, self.vectors, self.blobs = parts.catalog, parts.vectors, parts.blobs
        # an index in the catalog's database (pgvector) writes inside the row's transaction (decided by the factory)
        self._joint_vectors = parts.joint_vectors
        self.lifecycle = Lifecycle(self.catalog)
        self.contexts = ContextVectors(self.catalog, self.vectors)  # turn context vectors (second vector space)
        # where superseded_by chains end, remembered and checked against the rows each recall loads
        self.chains = ChainEnds(lambda ids: self.lifecycle.chain_ends(ids, longest=CHAIN),
                                superseded_ids=self._chain_starts, stamp=self._chain_cuts)
        self.embedder = embedder if embedder is not None else factory.build_embedder(ctx)
        self._encode_query = factory.query_encoder(self.embedder)  # its query path, decided once (no test per query)
        self.kv_dir = root / "kv"  # the files blob store's folder (kept for callers that look there)
        self.params = ranking.retrieval  # fusion and head re-ranking constants
        self.head_model = ranking.head  # the learned head order's model
        self.calibration = ranking.calibration  # (cosine, word overlap) of one hit -> P(it answers the query)
        self._lock = threading.RLock()
        # the lexical search runs beside the query embedding (SQLite, ONNX Runtime and torch release the GIL)
        self._lexical_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentmem-lexical")
        self.recover()

    # --- writes --------------------------------------------------------------------------------
    def new_entry(self, entry_id: str, text: str, line: str, embed_text: str, *, user_id: str,
                  session_id: str | None, kind: str, role: str | None, speaker: str | None, occurred_at: str | None,
                  metadata: dict[str, Any], tags: Sequence[str], created_at: float, expires_at: float | None,
                  indexed: bool = True, kb_version: str | None = None) -> NewEntry:
        """The row (texts sealed) and "add" event of one validated entry, ready for :meth:`add`: ``line`` is its
        memory line (:func:`agentmem.entries.records.memory_line`), ``embed_text`` what the dense index embeds
        (:func:`agentmem.entries.records.embedding_line`); the writer builds both.

        Example:
            >>> e = store.new_entry("e1", "hi", "[5 May 2026] hi", "User: hi", user_id="u1", session_id="s1",
            ...                     kind="turn", role="user", speaker=None, occurred_at="5 May 2026", metadata={},
            ...                     tags=["a", "a"], created_at=0.0, expires_at=None)
            >>> e.embed_text, e.line, e.row.tags, e.history.op, store.catalog.get(["e1"])  # nothing written yet
            ('User: hi', '[5 May 2026] hi', ('a',), 'add', [])
        """
        seal = self.sealer.seal_text
        row = EntryRecord(
            id=entry_id, user_id=user_id, session_id=session_id, kind=kind, role=role, speaker=speaker,
            occurred_at=occurred_at, text=seal(entry_id, "text", text), memory_text=seal(entry_id, "memory_text", line),
            metadata_json=metadata, created_at=created_at, expires_at=expires_at, version=1, status="active",
            seen_count=1, indexed=bool(indexed), kb_version=kb_version, tags=tuple(dict.fromkeys(tags)),
        )
        history = HistoryEvent(entry_id, 1, "add", seal(entry_id, "history", text), created_at)
        return NewEntry(row=row, embed_text=embed_text, line=line, history=history)

    def add(self, entries: Sequence[NewEntry], vectors: np.ndarray | None = None) -> None:
        """Write entries all-or-nothing (see the module docstring for the protocol)."""
        if not entries:
            return
        rows = [e.row for e in entries]
        ids = [r.id for r in rows]
        indexed = [i for i, r in enumerate(rows) if r.indexed is not False]  # index=False: stored, not embedded
        if vectors is None and indexed:
            vectors = self.embedder.encode([entries[i].embed_text for i in indexed],
                                           batch_size=self.config.embedding_batch_size)
        elif vectors is not None:
            vectors = vectors[indexed]
        for e in entries:
            if e.blob is not None:
                e.row.kv_path = self.blobs.location(e.row.id)
        index_texts = [self._index_text(e.line) if e.row.indexed is not False else None for e in entries]
        vector_args = ([rows[i].user_id for i in indexed], [ids[i] for i in indexed], vectors,
                       [_vector_metadata(rows[i]) for i in indexed], [entries[i].embed_text for i in indexed])
        if not indexed:
            vector_args = None
        add_in = self._joint_vectors.add_in if self._joint_vectors is not None else None
        has_blobs = any(e.blob is not None for e in entries)
        history = [e.history for e in entries if e.history is not None]
        with self._lock:
            for user in {r.user_id for r in rows}:
                self.contexts.backfill(user)  # a store written before context vectors: before the new turns
            ctx_args, follow = self.contexts.for_new(
                rows, {ids[i]: v for i, v in zip(indexed, vectors)} if vector_args is not None else {})

            def in_transaction(s: Any) -> None:
                add_in(s, *vector_args)
                if ctx_args:
                    add_in(s, *ctx_args, space=CONTEXT_SPACE)

            self.catalog.insert(rows, index_texts=index_texts, pending=has_blobs or add_in is None, history=history,
                                **({"extra": in_transaction} if add_in and vector_args else {}))
            if add_in is not None and not has_blobs:
                self.contexts.refresh(follow)
                return  # row and vector committed together: nothing is in flight
            staged: list[str] = []
            try:
                staged = [self.blobs.stage(e.row.id, self._seal(e.row.id, e.blob)) for e in entries
                          if e.blob is not None]
                if add_in is None and vector_args is not None:
                    self.vectors.add(*vector_args)
                    if ctx_args:
                        self.vectors.add(*ctx_args, space=CONTEXT_SPACE)
                for token in staged:
                    self.blobs.publish(token)
                staged = []
                self.catalog.commit(ids)
            except BaseException:
                self._roll_back(rows, staged)
                raise
            self.contexts.refresh(follow)  # a committed turn that now follows a new one
        for r in rows:  # the caller's row objects describe committed entries
            r.write_state = r.write_since = None

    def _roll_back(self, rows: Sequence[EntryRecord], staged: Sequence[str]) -> None:
        """Undo a failed add: every part that may have been written, then the pending rows."""
        try:
            for token in staged:
                self.blobs.discard(token)
            self._erase(rows)
        except Exception:  # recovery finishes it later: the rows are still marked pending
            log.exception("rolling back a failed write; recovery will finish it")

    def _index_text(self, text: str) -> str:
        return text if self._blind_index is None else self._blind_index.text(text)

    def replace(self, row: EntryRecord, fields: dict[str, Any], *, embed_text: str | None, index_text: str | None,
                tags: Sequence[str] | None, blob: bytes | None, kv_fields: dict[str, Any] | None,
                events: Sequence[HistoryEvent]) -> None:
        """Replace an entry's text, vector, lexical document and KV blob all-or-nothing (``mem.update``).

        ``fields`` carries the new ``version``. Protocol: new blob staged, vector upserted (the old one kept to
        restore); one transaction replaces row, lexical doc, tags, history *and drops the row's KV fields with a
        blob write marked in flight* (from then on the old text's KV can never be mounted: the row names none);
        the new blob is published over the old one and attached, or, without one, the old blob erased. A crash in
        between leaves a marked row without KV, which recovery cleans (the entry re-encodes at its next mount).
        ``embed_text=None`` stores the new version without a vector or lexical document.
        """
        with self._lock:
            token = None if blob is None else self.blobs.stage(row.id, self._seal(row.id, blob))
            old_vector = self.vectors.get(row.user_id, [row.id])  # to restore on failure
            fields.update(kv_path=None, kv_tokens=None, kv_fingerprint=None, kv_dtype=None, kv_staged_at=time.time())
            try:
                if embed_text is not None:
                    vec = self.embedder.encode([embed_text])
                    self.vectors.add([row.user_id], [row.id], vec, [_vector_metadata(row)], [embed_text])
                else:
                    self.vectors.delete([row.id], user_id=row.user_id)
                try:
                    self.lifecycle.replace(row.id, fields, tags=tags, events=events,
                                           index_text=None if index_text is None else self._index_text(index_text))
                except BaseException:
                    self._restore_vector(row, old_vector)
                    raise
                self._refresh_context([row])
            except BaseException:
                if token is not None:
                    self.blobs.discard(token)
                raise
            if token is not None:
                self.blobs.publish(token)
                self.catalog.set_kv(row.id, {"kv_path": self.blobs.location(row.id), **(kv_fields or {})})
            else:
                if row.kv_path:
                    self.blobs.delete(row.id)
                self.catalog.set_kv(row.id, {})  # clears the in-flight marker

    def _restore_vector(self, row: EntryRecord, old: dict[str, np.ndarray]) -> None:
        if row.id in old:
            self.vectors.add([row.user_id], [row.id], old[row.id][None, :], [_vector_metadata(row)], None)
        else:
            self.vectors.delete([row.id], user_id=row.user_id)
        self._refresh_context([row])

    def _refresh_context(self, rows: Sequence[EntryRecord]) -> None:
        """Recompute the context vectors of turns whose own vector changed, and of the turns after them."""
        self.contexts.refresh([*((r.user_id, r.id) for r in rows), *self.contexts.successors(rows)])

    def attach_blob(self, entry_id: str, blob: bytes, *, expect_version: int | None = None, **kv_fields: Any) -> bool:
        """Attach (or replace) an entry's KV blob; False if the entry no longer exists or, with
        ``expect_version``, was updated since the blob's text was read (its KV would be stale)."""
        with self._lock:
            if not self.catalog.set_kv(entry_id, None, version=expect_version):
                return False
            token = self.blobs.stage(entry_id, self._seal(entry_id, blob))
            try:
                self.blobs.publish(token)
            except BaseException:
                self.blobs.discard(token)
                raise
            self.catalog.set_kv(entry_id, {"kv_path": self.blobs.location(entry_id), **kv_fields})
            return True

    def delete(self, ids: Sequence[str]) -> list[EntryRecord]:
        """Erase rows, vectors and blobs; returns the rows that existed."""
        deleted: list[EntryRecord] = []
        with self._lock:
            for i in range(0, len(ids), 500):
                rows = self.catalog.mark_deleting(list(ids[i : i + 500]))  # hidden first: a crash is finished later
                self._erase(rows)
                deleted += rows
            if deleted:
                self.catalog.scrub(user_ids={r.user_id for r in deleted}, vacuum=True)
                self.vectors.erase_residue([r.user_id for r in deleted])  # deleted vectors stay in Chroma's files
        return deleted

    def _erase(self, rows: Sequence[EntryRecord]) -> None:
        """Erase the vectors (every space) and blobs of rows marked in flight, then the rows; then the context
        vectors of the turns that followed them are rebuilt without the erased turns' words."""
        after = self.contexts.successors(rows)
        self.chains.clear()  # a chain through an erased entry is cut now
        for user in {r.user_id for r in rows}:
            self.vectors.delete([r.id for r in rows if r.user_id == user], user_id=user)
        for row in rows:
            if row.kv_path:
                self.blobs.delete(row.id)
        self.catalog.delete([r.id for r in rows])
        self.contexts.refresh(after)

    # --- reads ---------------------------------------------------------------------------------
    def scope_ids(self, *, user_id: str | None = None, session_id: str | None = None, tags: Sequence[str] | None = None,
                  alive_at: float | None = None) -> list[str]:
        """Every id in a scope (all pages; no cap), for erasure and re-encoding.

        Example:
            >>> lunch = mem.remember("Lunch is at noon.", user_id="u1", session_id="s2")
            >>> len(store.scope_ids(user_id="u1")), store.scope_ids(session_id="s2") == [lunch.id]
            (3, True)
        """
        return self.ids_in(CatalogScope(user_id=user_id, session_id=session_id, tags=tags, alive_at=alive_at))

    def ids_in(self, scope: CatalogScope) -> list[str]:
        """Every id in a catalog scope, all pages of ``Catalog.iter_ids`` read.

        Example:
            >>> parcel = mem.remember("The parcel code is 0815.", user_id="u1", ttl=0.01)
            >>> time.sleep(0.05); store.ids_in(CatalogScope(expired_by=time.time())) == [parcel.id]
            True
        """
        return [i for page in self.catalog.iter_ids(scope) for i in page]

    def has_kind(self, user_id: str, kind: str) -> bool:
        """Whether the user has an unexpired entry of ``kind`` (one page of one id read: an indexed look-up).

        Example:
            >>> store.has_kind("u1", "turn"), store.has_kind("u1", "profile")
            (True, False)
        """
        scope = CatalogScope(user_id=user_id, kinds=(kind,), alive_at=time.time())
        return bool(next(iter(self.catalog.iter_ids(scope, page_size=1)), []))

    def list_rows(self, *, limit: int | None, offset: int = 0, **scope: Any) -> list[EntryRecord]:
        """Rows of a scope (``user_id``, ``session_id``, ``kinds``, ``tags``, ``alive_at``), oldest first.

        Example:
            >>> [r.text for r in store.list_rows(user_id="u1", limit=10, alive_at=time.time())]
            ['I moved to Lyon last May.', 'My dog is called Rex.']
            >>> [r.text for r in store.list_rows(user_id="u1", limit=1, offset=1)]
            ['My dog is called Rex.']
        """
        return self.catalog.list_entries(CatalogScope(**scope), limit=limit, offset=offset)

    def blob_path(self, entry_id: str) -> Path:
        """Where the files blob store keeps ``entry_id``'s blob."""
        return self.root / "kv" / entry_id[:2] / f"{entry_id}.kv"

    def read_blob(self, row: EntryRecord) -> bytes:
        if not row.kv_path:
            raise BlobCorruptedError(f"entry {row.id} has no KV blob")
        data = self.blobs.read(row.id)
        return self.sealer.open_blob(row.id, data)  # BlobCorruptedError if tampered

    def map_blob(self, row: EntryRecord) -> bytes | memoryview:
        """The entry's blob for a one-shot read, without copying it when the store is not encrypted.

        Plaintext blobs come from :meth:`BlobStore.view` (memory-mapped files: the 94 MB of a 2,048-token mount
        would otherwise be copied into fresh buffers on every mount); encrypted ones are read and decrypted.
        """
        if self.cipher is not None or not row.kv_path:
            return self.read_blob(row)
        return self.blobs.view(row.id)

    def _seal(self, entry_id: str, blob: bytes) -> bytes:
        return self.sealer.seal_blob(entry_id, blob)

    def candidates(self, query: str, scope: Scope, *, pool: int, query_vector: np.ndarray | None = None,
                   ids: Sequence[str] | None = None, context: bool | None = None) -> tuple[Candidates, np.ndarray]:
        """What the dense and lexical retrievers find for ``query`` in ``scope`` (``pool`` of each), with the
        conversation placement of every candidate, and the query vector.

        Example:
            >>> cands, vec = store.candidates("What is my dog called?", Scope("u1"), pool=100)
            >>> sorted(cands.dense) == sorted([rec.id, dog.id]), list(cands.lexical) == [dog.id], vec.shape
            (True, True, (384,))
        """
        lexical_job = self._lexical_worker.submit(self._lexical_placed, query, scope.user_id, pool)
        vec = self.embed_query(query) if query_vector is None else query_vector
        where = where_clause(session_id=scope.session_id, kind=list(scope.kinds) if scope.kinds else None)
        dense, turn_context = self._dense(vec, scope, pool, where, ids)
        lexical, lexical_places = lexical_job.result()  # after the vector searches: they need only the vector
        if ids is not None:
            admitted = set(ids)
            lexical = {i: s for i, s in lexical.items() if i in admitted}
        wanted = dense.keys() | lexical.keys() | turn_context.keys()
        places = {i: p for i, p in lexical_places.items() if i in wanted}
        places.update(self.catalog.turn_context(list(wanted - lexical_places.keys())))
        cands = Candidates(dense, lexical, places, turn_context=turn_context)
        if self.params.context_weight > 0 if context is None else context:
            cands.context = self._context(vec, scope, cands, where)
        return cands, vec

    def _dense(self, vec: np.ndarray, scope: Scope, pool: int, where: Any,
               ids: Sequence[str] | None) -> tuple[dict[str, float], dict[str, float]]:
        """The dense candidates and, where turns are searched, the turn context vectors' (their own space,
        agentmem.entries.context_vectors): both in one ``query_spaces`` (side by side where the index can), the
        context space asked for ``params.context_pool`` (at most ``pool``)."""
        search = {"user_id": scope.user_id, "n": pool, "where": where, "ids": ids}
        if not (self.params.context_vector_weight > 0 and self.contexts.enabled
                and (not scope.kinds or "turn" in scope.kinds)):
            return dict(self.vectors.query(vec, **search)), {}
        search["n"] = (pool, min(pool, self.params.context_pool))  # context_pool: the pool unless set lower
        dense, context = self.vectors.query_spaces(vec, spaces=("", CONTEXT_SPACE), **search)
        return dict(dense), dict(context)

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """Unit vectors of ``texts`` as they are stored (the embedder's ``encode``): one row per text.

        Example:
            >>> vecs = store.embed_texts(["I moved to Lyon.", "My dog is Rex."])
            >>> vecs.shape, np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
            ((2, 384), True)
        """
        return self.embedder.encode(texts)

    def embed_query(self, query: str) -> np.ndarray:
        """The query's vector, as recall embeds it: the embedder's own query path where it is a
        :class:`~agentmem.ports.QueryEmbedder` (MiniLM: int8 feed-forward weights), else its ``encode``. Benchmarks
        and tests that compare with recall use this.

        Example:
            >>> q = store.embed_query("Where do I live?")
            >>> lyon, rex = store.embed_texts(["I moved to Lyon.", "My dog is Rex."])
            >>> q.shape, float(q @ lyon) > float(q @ rex)
            ((384,), True)
        """
        return self._encode_query(query)

    def _lexical_placed(self, query: str, user_id: str, pool: int) -> tuple[dict[str, float], dict[str, Any]]:
        """The lexical candidates and their conversation placement, in the worker thread beside the query
        embedding (the lexical half of the pool is placed off the recall's critical path)."""
        lexical = dict(self.catalog.lexical_search(query, user_id=user_id, limit=pool,
                                                   blind=self._blind_index.token if self._blind_index else None))
        return lexical, self.catalog.turn_context(list(lexical))

    def _context(self, vec: np.ndarray, scope: Scope, cands: Candidates, where: Any) -> dict[str, float]:
        """Mean cosine of the fused head's turns and their neighbours (:mod:`agentmem.recall.context`)."""
        fused = fuse(cands.dense, cands.lexical, dense_weight=self.params.dense_weight)
        head = [i for i, _ in best_first(fused)[: self.params.context_depth]]
        # a head entry can be another's neighbour too: each id once (the index refuses duplicates)
        missing = [i for i in dict.fromkeys([*head, *sorted(neighbours(head, cands.places))]) if i not in cands.dense]
        cosine = dict(cands.dense)
        if missing:  # lexical-only hits and neighbours outside the dense pool: one search restricted to them
            cosine.update(self.vectors.query(vec, user_id=scope.user_id, n=len(missing), where=where, ids=missing))
        return context_cosines(head, cands.places, cosine)

    def search(self, query: str, scope: Scope, *, k: int, now: float | None = None,
               query_vector: np.ndarray | None = None, min_score: float | None = None,
               follow_versions: bool = False, chain_stamp: int | None = None,
               head_k: int | None = None) -> list[ScoredRow]:
        """Hybrid dense + lexical search within ``scope``; best first, at most ``k``, each scored with a
        calibrated relevance in [0, 1] (:mod:`agentmem.recall.calibration`), none below ``min_score``. ``head_k``:
        the k the re-ranked head is sized for (default ``k``; :func:`agentmem.recall.head.rank_candidates`).

        ``follow_versions``: a superseded candidate stands for its current version (the active entry at the end of
        its ``superseded_by`` chain, :mod:`agentmem.entries.versions`), which takes the candidate's place
        and rank score before the head is re-ranked and cut — one candidate search, each entry once at its best
        place; the successor must pass ``scope``, the superseded candidate ``scope`` with superseded entries
        admitted; such a successor's ``scores["stands_for"]`` is the score of the superseded candidate whose place it
        took (a mount holds it when that one clears the threshold). ``chain_stamp``: the catalog's chain-cut stamp,
        where the caller read it before this search (:meth:`agentmem.entries.kb_versions.KbVersions.recall_state`);
        None reads it when versions are followed.

        Example:
            >>> paris = mem.remember("I moved to Paris in June.", user_id="u1")  # supersedes rec (Lyon)
            >>> everything = Scope("u1", include_superseded=True)
            >>> sorted(h.row.text for h in store.search("Where do I live?", everything, k=10))
            ['I moved to Lyon last May.', 'I moved to Paris in June.', 'My dog is called Rex.']
            >>> sorted(h.row.text for h in store.search("Where do I live?", everything, k=10, follow_versions=True))
            ['I moved to Paris in June.', 'My dog is called Rex.']
        """
        now = time.time() if now is None else now
        pool = max(self.config.candidate_pool, 4 * k)
        cands, vec = self.candidates(query, scope, pool=pool, query_vector=query_vector)
        hits = self._ranked(query, vec, cands, scope, now, k, follow_versions, chain_stamp, head_k)
        if len(hits) < k and (scope.tags or scope.predicate):
            # Restrictive filters can reject the whole candidate pool: search only the admitted ids.
            allowed = self.ids_in(CatalogScope(user_id=scope.user_id, session_id=scope.session_id, kinds=scope.kinds,
                                               tags=scope.tags, alive_at=now))
            if scope.predicate is not None:  # superseded rows stay in when they stand for their successors
                test = replace(scope, include_superseded=True) if follow_versions else scope
                allowed = [r.id for r in self.catalog.get(allowed) if test.admits(r, now)]
            if allowed:
                cands, vec = self.candidates(query, scope, pool=max(pool, len(allowed)), query_vector=vec,
                                             ids=allowed)
                hits = self._ranked(query, vec, cands, scope, now, k, follow_versions, chain_stamp, head_k)
        hits = hits[:k]
        return hits if min_score is None else [h for h in hits if h.score >= min_score]

    def _ranked(self, query: str, vec: np.ndarray, cands: Candidates, scope: Scope, now: float,
                k: int, follow_versions: bool = False, chain_stamp: int | None = None,
                head_k: int | None = None) -> list[ScoredRow]:
        admitted: list[tuple[EntryRecord, float]] = []
        stands_for: dict[str, EntryRecord] = {}  # successor id -> the superseded candidate whose place it took

        def load(ranked: list[tuple[str, float]], depth: int) -> tuple[list[HeadEntry], list[tuple[str, float]]]:
            """The head's rows, admitted by scope (current versions when following them): agentmem.recall.head."""
            admitted.extend(self._admitted(ranked, depth, scope, now, follow_versions, chain_stamp, stands_for))
            return ([self._head_entry(row, s) for row, s in admitted[:depth]],
                    [(row.id, s) for row, s in admitted[depth:]])

        order = rank_candidates(query, cands, self.params, k, load, model=self.head_model, head_k=head_k)
        by_id = {row.id: row for row, _ in admitted}
        missing = [i for i, _ in order if i not in cands.dense]

        @cache
        def cosine() -> dict[str, float]:
            """Hits from the lexical side or spillover report their cosine too: one search restricted to all of
            their ids, made when the first of them is read (ScoredRow's ``settle``)."""
            return {**cands.dense, **dict(self.vectors.query(vec, user_id=scope.user_id, n=len(missing), ids=missing))}

        asked = stems(query)  # the score reads the query and each hit alone (agentmem.recall.calibration)

        def scored(entry_id: str, score: float, cosines: dict[str, float]) -> tuple[float, dict[str, float]]:
            parts = {"rank": score}
            if entry_id in cosines:  # by the hit's own id: a successor reports its own cosine, not the old text's
                parts["dense"] = cosines[entry_id]
            if entry_id in cands.lexical:
                parts["lexical"] = cands.lexical[entry_id]
            if entry_id in cands.turn_context:
                parts["context"] = cands.turn_context[entry_id]  # cosine of the turn's context vector
            row = by_id[entry_id]
            parts["overlap"] = self._overlap(asked, row)
            own = text_cosine(row.text_vector, vec)  # the text alone: no time or speaker from the line
            if own is not None:
                parts["text_dense"] = own
            cosine = own if own is not None else parts.get("dense", 0.0)
            older = stands_for.get(entry_id)
            older_cosine = None if older is None else text_cosine(older.text_vector, vec)
            if older_cosine is not None:  # the score of the superseded version whose place this hit took
                parts["stands_for"] = self.calibration(cosine=older_cosine, overlap=self._overlap(asked, older))
            return self.calibration(cosine=cosine, overlap=parts["overlap"]), parts

        return [ScoredRow(by_id[entry_id], *scored(entry_id, score, cands.dense)) if entry_id in cands.dense
                else ScoredRow(by_id[entry_id], settle=lambda _, i=entry_id, s=score: scored(i, s, cosine()))
                for entry_id, score in order]

    def _overlap(self, asked: frozenset[str], row: EntryRecord) -> float:
        """The share of the query's words that ``row``'s text holds, a speaker's name left out of the query
        (:func:`~agentmem.entries.records.overlap_leaves_out`)."""
        text = self.sealer.open_text(row.id, "text", row.text)
        return word_overlap(asked, text, overlap_leaves_out(row.kind, row.speaker))

    def _admitted(self, ranked: Sequence[tuple[str, float]], depth: int, scope: Scope, now: float,
                  follow_versions: bool, chain_stamp: int | None,
                  stands_for: dict[str, EntryRecord] | None = None) -> list[tuple[EntryRecord, float]]:
        """The rows of ``ranked``'s best that ``scope`` admits (their current versions with ``follow_versions``),
        best first, loaded page by page until ``depth`` are admitted; ``stands_for`` receives, per successor
        admitted in a superseded candidate's place, that candidate's row."""
        admitted: list[tuple[EntryRecord, float]] = []
        # superseded_by chains looked up ahead of the rows (pages()), so each page is loaded with its successors
        ends: dict[str, str] = {}
        # Load rows best-first in small pages: materialising the whole pool would cost more than the search.
        chains = self.chains.of_user(scope.user_id, stamp=chain_stamp) if follow_versions else None
        for page in pages(ranked, depth, ends, chains):
            ids = [i for i, _ in page]
            rows = self._rows_with_ends(ids, ends, {})
            if follow_versions:
                stale = self.chains.stale(ids, rows, ends)  # remembered chains the loaded rows contradict
                if stale:
                    for entry_id in stale:
                        ends.pop(entry_id, None)
                    ends.update(self.chains.refresh(stale))
                    rows = self._rows_with_ends(stale, ends, rows)
                admitted += self._current_versions(page, rows, ends, scope, now, admitted, stands_for)
            else:
                admitted += [(rows[i], s) for i, s in page if i in rows and scope.admits(rows[i], now)]
            if len(admitted) >= depth:
                break
        return admitted

    def _chain_starts(self, user_id: str) -> list[str]:
        """Ids of ``user_id``'s entries with a ``superseded_by`` (any status): where the user's chains start."""
        return self.ids_in(CatalogScope(user_id=user_id, has_successor=True))

    def _chain_cuts(self) -> int:
        """The catalog's chain-cut stamp (:mod:`agentmem.entries.chain_ends`; 0 until a chain was first cut)."""
        return chain_cuts_value(self.catalog.infos([CHAIN_CUTS_KEY]).get(CHAIN_CUTS_KEY))

    def _rows_with_ends(self, ids: Sequence[str], ends: dict[str, str],
                        rows: dict[str, EntryRecord]) -> dict[str, EntryRecord]:
        """``rows`` plus the rows of ``ids`` and of their chain ends, those not in it yet read in one query."""
        wanted = [i for i in dict.fromkeys([*ids, *(ends[i] for i in ids if i in ends)]) if i not in rows]
        return {**rows, **{r.id: r for r in self.catalog.get(wanted)}} if wanted else rows

    @staticmethod
    def _current_versions(page: Sequence[tuple[str, float]], rows: dict[str, EntryRecord], ends: dict[str, str],
                          scope: Scope, now: float, admitted: Sequence[tuple[EntryRecord, float]],
                          stands_for: dict[str, EntryRecord] | None = None) -> list[tuple[EntryRecord, float]]:
        """The page's candidates as their current versions (``search(follow_versions=True)``), each entry once:
        not again if it is already ``admitted`` from a better place (``stands_for``: see :meth:`_admitted`)."""
        wide = replace(scope, include_superseded=True)
        current = current_versions([rows[i] for i, _ in page if i in rows and wide.admits(rows[i], now)], ends, rows)
        seen = {row.id for row, _ in admitted}
        out: list[tuple[EntryRecord, float]] = []
        for entry_id, score in page:
            row = current.get(entry_id)
            if row is None or row.id in seen or not scope.admits(row, now):
                continue
            seen.add(row.id)
            out.append((row, score))
            if row.id != entry_id and stands_for is not None:
                stands_for[row.id] = rows[entry_id]
        return out

    def _memory_line(self, row: EntryRecord) -> str:
        return self.sealer.open_text(row.id, "memory_text", row.memory_text)

    def _head_entry(self, row: EntryRecord, score: float) -> HeadEntry:
        """What re-ranking reads of a head row: its fields, never its memory line's format (agentmem.recall.rerank)."""
        return HeadEntry(row.id, score, row.speaker, self._memory_line(row),
                         text=self.sealer.open_text(row.id, "text", row.text), occurred_at=row.occurred_at)

    # --- recovery ------------------------------------------------------------------------------
    def recover(self, grace_s: float | None = None) -> dict[str, int]:
        """Finish what crashed writers left: roll back adds and finish deletions recorded more than ``grace_s``
        seconds ago (default ``config.pending_grace_s``), and discard blobs staged as long ago.

        Reads only the rows marked in flight and the blob staging area: O(in flight), never O(store).
        """
        grace = self.config.pending_grace_s if grace_s is None else grace_s
        fixed = {"rolled_back": 0, "deletions_finished": 0, "staged_blobs": 0, "blob_writes": 0}
        with self._lock:
            rows = self.catalog.pending(time.time() - grace)
            gone = [r for r in rows if r.write_state is not None]
            for r in gone:
                fixed["rolled_back" if r.write_state == "adding" else "deletions_finished"] += 1
            if gone:
                self._erase(gone)
            for r in rows:
                if r.write_state is None:  # a blob write on a visible row: keep the blob only if the row names it
                    if not r.kv_path:
                        self.blobs.delete(r.id)
                    self.catalog.set_kv(r.id, {})
                    fixed["blob_writes"] += 1
            for token in self.blobs.list_pending(grace):
                self.blobs.discard(token)
                fixed["staged_blobs"] += 1
        if any(fixed.values()):
            log.info("recovered store %s: %s", self.root, fixed)
        return fixed

    def reconcile(self) -> dict[str, int]:
        """Alias of :meth:`recover` (the name of the old full-scan version)."""
        return self.recover()

    def verify(self) -> dict[str, int]:
        """Consistency report (read-only, O(store)): every row should have its vector and, if it names one, its blob.

        Rows still in flight are counted under ``pending`` and their parts are not orphans.
        """
        with self._lock:
            pending = {r.id for r in self.catalog.pending(float("inf"))}
            vector_ids = set(self.vectors.all_ids()) - pending
            row_ids: set[str] = set()
            with_blob: set[str] = set()
            unindexed: set[str] = set()  # stored without a vector on purpose (LangGraph index=False)
            for page in self.catalog.iter_ids(CatalogScope()):
                row_ids.update(page)
                for r in self.catalog.get(page):
                    if r.kv_path:
                        with_blob.add(r.id)
                    if r.indexed is False:
                        unindexed.add(r.id)
            blob_keys = set(self.blobs.keys()) - pending
        return {
            "rows": len(row_ids),
            "vectors": len(vector_ids),
            "blobs": len(blob_keys & with_blob),
            "pending": len(pending),
            "rows_missing_vector": len(row_ids - vector_ids - unindexed),
            "rows_missing_blob": len(with_blob - blob_keys),
            "orphan_vectors": len(vector_ids - row_ids),
            "orphan_blobs": len(blob_keys - with_blob),
        }

    def close(self) -> None:
        self._lexical_worker.shutdown(wait=True)
        self.catalog.close()
        self.vectors.close()
        self.blobs.close()


def _vector_metadata(row: EntryRecord) -> dict[str, Any]:
    meta: dict[str, Any] = {"kind": row.kind}
    if row.session_id is not None:
        meta["session_id"] = row.session_id
    return meta


__all__ = ["EntryStore", "NewEntry", "Scope", "ScoredRow"]
