"""``AgentMemory``: the facade. It wires the parts together and holds no algorithm of its own.

Example:
    >>> from agentmem import AgentMemory
    >>> with AgentMemory("./memdata") as mem:
    ...     rec = mem.remember("I moved to Lyon last May.", user_id="u1", session_id="s1")
    ...     mem.recall("where does the user live?", user_id="u1", k=3)[0].text
    'I moved to Lyon last May.'
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentmem import factory
from agentmem._fs import private_dir
from agentmem.answer import Answerer
from agentmem.bank import KVBank
from agentmem.config import MemoryConfig
from agentmem.erasure import Erasure, ErasureListeners
from agentmem.forgetting import ErasureJournal, Forgetting, SessionHooks, Sweeper
from agentmem.errors import InvalidInputError
from agentmem.entries.store import EntryStore, NewEntry, Scope
from agentmem.consolidate.store_parts import ConflictDemotion, local_consolidator
from agentmem.entries.kb_versions import KbVersions
from agentmem.reads import Reads
from agentmem.recall import head_cues
from agentmem.recall import query as recall_query
from agentmem.recall.pipeline import Recaller
from agentmem.entries.filters import compile_filters
from agentmem.security import AuditLog, SecretScanner, install_log_filter
from agentmem.security.store_key import open_cipher
from agentmem.validation import (
    check_entry_id, check_entry_ids, check_id, check_k, check_kinds, check_limit_offset, check_score,
    check_session_id, check_tags, check_text,
)
from agentmem.types import Hit, MemoryRecord, MemoryVersion, MountChoice
from agentmem.write import Writer

if TYPE_CHECKING:
    from agentmem.kv.types import GenerationResult, Mode
    from agentmem.ports.catalog import EntryRecord
    from agentmem.consolidate.llm import ConsolidationWorker
    from agentmem.sessions import Session, SessionManager

install_log_filter("agentmem")  # INFO+ logs never carry memory text or KV


class AgentMemory:
    """Long-term memory for an agent: entries in SQLite, vectors in Chroma, KV blobs on disk.

    Args:
        path: directory holding ``catalog.db``, ``chroma/`` and ``kv/`` (created if missing).
        model: the local LLM whose KV is banked: ``None`` = the embedded SmolLM2-135M-Instruct, a local Hugging Face
            model directory, or a loaded ``(model, tokenizer)`` pair. Loaded only when KV is encoded or mounted.
        encryption_key: encrypt texts and KV blobs at rest (or set ``$AGENTMEM_ENCRYPTION_KEY``).
        consolidation_model: with ``consolidation="llm"``, a LangChain ``BaseChatModel`` that decides
            ADD / UPDATE / DELETE / NOOP on a background worker; ``None`` = the local model.
        config: a :class:`MemoryConfig`; keyword overrides may be given instead (``AgentMemory(p, kv_dtype="float16")``).
            Its ``catalog_url`` / ``vector_url`` / ``blob_url`` name the backends (default: embedded, under ``path``).
        catalog, vectors, blobs, embedder: ready-made implementations of :mod:`agentmem.ports` (override the URLs).

    The methods' examples use ``mem``, a store holding user u1's ``rec`` ("I moved to Lyon last May.") and ``dog``
    ("My dog is called Rex."), and its embedded model (tests/infra/test_docstring_examples.py builds it).
    """

    def __init__(self, path: str | Path, *, model: Any = None, config: MemoryConfig | None = None,
                 encryption_key: str | bytes | None = None, catalog: Any = None, vectors: Any = None,
                 blobs: Any = None, embedder: Any = None, consolidation_model: Any = None,
                 **overrides: Any) -> None:
        if config is not None and overrides:
            raise InvalidInputError("give either config= or keyword overrides, not both")
        self.config = config or MemoryConfig(**overrides)
        # absolute from here on: Chroma caches clients by the path string, and the working directory may change
        self.path = private_dir(Path(path).expanduser().resolve())  # a new store is the owner's alone (0700)
        self._cipher = open_cipher(self.path, encryption_key)
        self._scanner = None if self.config.secret_policy == "off" else SecretScanner(self.config.secret_policy)
        self._audit = AuditLog(self.path / "audit.jsonl")
        self._erasures = ErasureListeners()
        self._store = EntryStore(self.path, self.config, cipher=self._cipher, catalog=catalog, vectors=vectors,
                                 blobs=blobs, embedder=embedder)
        self._bank = KVBank(self._store, self.config, model_spec=model)
        self._answer = Answerer(store=self._store, bank=self._bank, config=self.config, path=self.path,
                                cipher=self._cipher, scanner=self._scanner, recall=self._recall,
                                new_entry=self._new_entry, record=self._record)
        self._kb = KbVersions(self._store.catalog)
        self._reads = Reads(self._store)
        # the pairwise weights belong to the bundled embedder
        self._consolidator = local_consolidator(self._store, self.config,
                                                bundled_pairs=embedder is None and self.config.embedding_model is None)
        self._recaller = Recaller(config=self.config, search=self._store.search, recall_state=self._kb.recall_state,
                                  hit_of=self._reads.hit, demotion=ConflictDemotion(self._consolidator, self._store),
                                  has_profile=lambda user: self._store.has_kind(user, "profile"),
                                  embed_query=self._store.embed_query,
                                  unmountable=None if self.config.mount_questions else self._reads.only_asks,
                                  asks=self._reads.only_asks)
        # in-process copies keyed by memory text or holding its vectors leave with the entries (agentmem.erasure)
        for forget_erased in (self._consolidator.forget_erased, head_cues.forget_erased,
                              recall_query.forget_erased, self._bank.forget_erased):  # queries: names, timestamps
            self.on_erase(forget_erased)
        replay_s = self.config.erasure_replay_s or (1.0 if self.config.catalog_url else None)
        self._forgetting = Forgetting(self._store, audit=self._audit, erasures=self._erasures, sessions=SessionHooks(
            end=lambda session, user: self._end_session_kv(session, user_id=user),
            end_user=lambda user: self.sessions.end_user(user) if self._has_sessions() else None,
            sweep=lambda: self._sessions.sweep() if self._sessions is not None else None),  # session TTLs
            journal=ErasureJournal(self._store.catalog) if replay_s else None)
        self._writer = Writer(store=self._store, bank=self._bank, config=self.config, consolidator=self._consolidator,
                              kb=self._kb, scanner=self._scanner,
                              submit_llm=lambda ids: self._llm_worker().submit(ids),
                              end_session_kv=lambda session, user: self._end_session_kv(session, user_id=user))
        self._llm: ConsolidationWorker | None = None
        self._consolidation_model = consolidation_model
        self._sessions: SessionManager | None = None
        self._sessions_lock = threading.Lock()
        self._closed = False
        self._sweeper = Sweeper(self.sweep, self.config.sweep_interval) if self.config.sweep_interval else None
        self._replayer = Sweeper(self.replay_erasures, replay_s, name="agentmem-erasures") if replay_s else None

    # --- context manager -------------------------------------------------------------------------
    def __enter__(self) -> AgentMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._llm is not None:
            self._llm.close()
        for timer in (self._sweeper, self._replayer):
            if timer is not None:
                timer.stop()
        if self._sessions is not None:
            self._sessions.close()
        self._bank.close()
        self._store.close()

    # --- write ---------------------------------------------------------------------------------
    def remember(
        self,
        text: str,
        *,
        user_id: str,
        session_id: str | None = None,
        kind: str = "turn",
        role: str | None = None,
        speaker: str | None = None,
        timestamp: datetime | str | None = None,
        tags: Iterable[str] | None = None,
        ttl: float | timedelta | None = None,
        metadata: Mapping[str, Any] | None = None,
        encode: bool | None = None,
        index: bool = True,
    ) -> MemoryRecord:
        """Store one memory and return its record.

        ``speaker`` and ``timestamp`` (when it happened; default now) are kept in the memory line that is
        indexed and encoded, because questions like "when did I ..." depend on them (the vector leaves the time
        out). ``encode`` forces (True)
        or skips (False) encoding the entry's KV now; by default the store's ``kv_encoding`` policy decides.
        ``index=False`` stores the entry without a vector or lexical document: :meth:`get` and :meth:`list` see it,
        :meth:`recall` does not (LangGraph's ``put(..., index=False)``).

        The record says what the write did (``event``, docs/lifecycle.md): ``"ADD"``; ``"UPDATE"`` (it superseded
        ``record.superseded_ids``); or ``"NOOP"`` (the same statement again: the record is the existing entry
        ``record.matched_id``, its ``seen_count`` raised). A write that differs in any value is never merged.

        Example:
            >>> mem.remember("I take 5 mg of amlodipine daily.", user_id="u1").event
            'ADD'
            >>> mem.remember("i take 5 mg of amlodipine daily", user_id="u1").event
            'NOOP'
        """
        entry = self._new_entry(text, user_id=user_id, session_id=session_id, kind=kind, role=role,
                                speaker=speaker, timestamp=timestamp, tags=tags, ttl=ttl, metadata=metadata,
                                index=index)
        return self._writer.write([entry], encode)[0]

    def remember_many(self, items: Sequence[Mapping[str, Any]], *, consolidate: bool = True,
                      vectors: Any = None) -> list[MemoryRecord]:
        """Store many memories in one all-or-nothing batch (embeddings computed in batches).

        Each item takes the keyword arguments of :meth:`remember`, e.g.
        ``mem.remember_many([{"text": "hi", "user_id": "u1", "speaker": "Ann"}, ...])``. ``consolidate=False``
        stores every item as given (keyed stores that manage their own versions). ``vectors`` (with
        ``consolidate=False``): one embedding per item, of its text, by this store's embedder (:meth:`embed`);
        each item is indexed under it and nothing is embedded (a bulk load that embedded its texts elsewhere).

        Example:
            >>> texts = ["I live in Oslo.", "My cat is Tom."]
            >>> recs = mem.remember_many([{"text": t, "user_id": "u2"} for t in texts],
            ...                          consolidate=False, vectors=mem.embed(texts))
            >>> mem.recall("where do I live?", user_id="u2", k=1)[0].id == recs[0].id
            True
        """
        self._check_open()
        entries = self._writer.item_entries(items)
        given = None if vectors is None else self._writer.given_vectors(vectors, len(entries), consolidate=consolidate)
        return self._writer.write(entries, None, consolidate=consolidate, vectors=given)

    def embed(self, texts: Sequence[str]) -> Any:
        """Unit-length float32 embeddings of ``texts`` by this store's embedder, one row each: what
        :meth:`remember_many` takes as ``vectors`` (secrets redacted first, as a write would).

        Example:
            >>> mem.embed(["I live in Lyon."]).shape
            (1, 384)
        """
        self._check_open()
        return self._writer.embed_texts(texts)

    def remember_messages(
        self,
        messages: Sequence[Any],
        *,
        user_id: str,
        session_id: str | None = None,
        timestamp: datetime | str | None = None,
        tags: Iterable[str] | None = None,
        ttl: float | timedelta | None = None,
        metadata: Mapping[str, Any] | None = None,
        encode: bool | None = None,
    ) -> list[MemoryRecord]:
        """Store chat messages (OpenAI-shaped dicts or LangChain messages) in one all-or-nothing batch.

        Tool results become ``kind="tool"`` entries that keep their call's name and arguments; an assistant
        message that only calls tools is not stored on its own, and system messages are skipped (instructions,
        not memories). A message longer than ``MemoryConfig.message_max_words`` (150) words, e.g. a pasted document,
        is stored as consecutive parts numbered in ``metadata["document"]`` as :meth:`remember_document` numbers
        a document's, so each passage is searched and mounted on its own. Embeddings are computed in one batch;
        ``encode`` as in :meth:`remember`.

        Example:
            >>> call = {"id": "c1", "type": "function", "function": {"name": "get_weather",
            ...                                                       "arguments": '{"city": "Oslo"}'}}
            >>> recs = mem.remember_messages([
            ...     {"role": "user", "content": "Weather in Oslo?"},
            ...     {"role": "assistant", "content": None, "tool_calls": [call]},
            ...     {"role": "tool", "tool_call_id": "c1", "content": "rain, 9 C"}], user_id="u1")
            >>> [(r.role, r.text) for r in recs]
            [('user', 'Weather in Oslo?'), ('tool', 'called with {"city": "Oslo"}, returned: rain, 9 C')]
        """
        self._check_open()
        return self._writer.write(self._writer.message_entries(
            messages, user_id=user_id, session_id=session_id, timestamp=timestamp, tags=tags, ttl=ttl,
            metadata=metadata), encode)

    def remember_document(
        self,
        text: str,
        *,
        user_id: str,
        title: str | None = None,
        max_words: int = 150,
        kind: str = "knowledge",
        session_id: str | None = None,
        timestamp: datetime | str | None = None,
        tags: Iterable[str] | None = None,
        ttl: float | timedelta | None = None,
        metadata: Mapping[str, Any] | None = None,
        encode: bool | None = None,
    ) -> list[MemoryRecord]:
        """Store a long text (a document, a web page, a long tool result) as consecutive parts of at most
        ``max_words`` words, one memory each, in one all-or-nothing write; returns their records in order.

        A single memory that long is embedded only by its beginning and never fits a mount
        (:mod:`agentmem.entries.documents`). Each part's text opens with ``title`` when one is given, so a part
        recalled on its own still says what it is from; ``metadata["document"]`` holds ``id``, ``part`` (from 1),
        ``parts`` and ``title``. Parts are stored as given: they are not merged with or superseding anything.
        Give the document a tag to erase it whole later (``forget(user_id=..., tags=[...])``).

        Example:
            >>> guide = ("The Graslei is Ghent's old port.\\n\\nThe Gravensteen is a castle built in 1180.\\n\\n"
            ...          "Trams 1 and 4 run to the station.")
            >>> parts = mem.remember_document(guide, user_id="u1", title="Ghent guide", max_words=8, tags=["ghent"])
            >>> [p.metadata["document"]["part"] for p in parts], parts[1].text
            ([1, 2, 3], 'Ghent guide: The Gravensteen is a castle built in 1180.')
            >>> mem.recall("When was the Gravensteen built?", user_id="u1", k=1)[0].id == parts[1].id
            True
        """
        self._check_open()
        entries = self._writer.document_entries(
            text, title=title, max_words=max_words, metadata=metadata, user_id=user_id, kind=kind,
            session_id=session_id, timestamp=timestamp, tags=tags, ttl=ttl)
        return self._writer.write(entries, encode, consolidate=False)

    def _new_entry(self, text: str, **fields: Any) -> NewEntry:
        self._check_open()
        return self._writer.new_entry(text, **fields)

    # --- lifecycle: versions and history ---------------------------------------------------------
    def update(
        self,
        entry_id: str,
        text: str,
        *,
        tags: Iterable[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        ttl: float | timedelta | None = None,
        reason: str | None = None,
        index: bool | None = None,
        clear_ttl: bool = False,
        timestamp: datetime | str | None = None,
        user_id: str | None = None,
    ) -> MemoryRecord:
        """Replace an entry's text with a new version; its vector, lexical document and KV blob are replaced in the
        same all-or-nothing write (a stale KV blob is never mounted). ``tags`` / ``metadata`` / ``ttl`` replace the
        old ones when given (``clear_ttl`` removes the expiry); ``index=False`` keeps the entry stored but not
        searchable (no vector, no lexical document). ``timestamp`` is when the new text became true (default now;
        an import restoring an entry's versions gives the original one). The old text stays in :meth:`history`
        until the entry is forgotten. With ``user_id``, an entry of another user is not found (:class:`NotFoundError`,
        as in :meth:`get`), and nothing is written.

        Example:
            >>> mem.update(rec.id, "I moved to Paris.").version     # mem0's update(memory_id, data) shape
            2
            >>> [v.op for v in mem.history(rec.id)]
            ['add', 'update']
        """
        self._check_open()
        if ttl is not None and clear_ttl:
            raise InvalidInputError("give ttl or clear_ttl, not both")
        return self._writer.update(self._live_row(entry_id, user_id), text=text, tags=tags, metadata=metadata, ttl=ttl,
                                   reason=reason, index=index, clear_ttl=clear_ttl, timestamp=timestamp)

    def restore(self, entry_id: str, version: int | None = None, *, user_id: str | None = None) -> MemoryRecord:
        """Undo a consolidation the store got wrong: a superseded (or retracted) entry becomes active again, the
        newer entry that replaced it stays (forget it if it is wrong); ``version=n`` also brings back the text of
        the entry's version ``n`` as a new version. Logged as a ``restore`` event (``related_id``: the entry that
        had superseded it). Raises :class:`InvalidInputError` when there is nothing to restore, and, with
        ``user_id``, :class:`NotFoundError` for an entry of another user.

        Example:
            >>> blue = mem.remember("My favorite color is blue.", user_id="u1")
            >>> green = mem.remember("My favorite color is green now.", user_id="u1")
            >>> green.superseded_ids == (blue.id,), mem.restore(blue.id).status
            (True, 'active')
        """
        self._check_open()
        return self._writer.restore(self._live_row(entry_id, user_id), version)

    def history(self, entry_id: str, *, user_id: str | None = None) -> list[MemoryVersion]:
        """The entry's versions and events, oldest first: ``op`` is add / update / supersede / merge / delete /
        restore. With ``user_id``, an entry of another user is not found (:class:`NotFoundError`).

        Example:
            >>> mem.remember("I moved to Paris in June.", user_id="u1").event
            'UPDATE'
            >>> [(v.op, v.text) for v in mem.history(rec.id)]
            [('add', 'I moved to Lyon last May.'), ('supersede', 'I moved to Lyon last May.')]
        """
        self._check_open()
        self._live_row(entry_id, user_id)
        return self._reads.history(entry_id)

    def _live_row(self, entry_id: str, user_id: str | None = None) -> EntryRecord:
        """The entry's live row; with ``user_id``, only if it is that user's (the same check as :meth:`get`)."""
        return self._reads.live(check_id(entry_id, "entry_id", required=True) or "",
                                owner=check_id(user_id, "user_id", required=False))

    def _record(self, row: EntryRecord) -> MemoryRecord:
        return self._writer.record(row)

    # --- read ----------------------------------------------------------------------------------
    def recall(
        self,
        query: str,
        *,
        user_id: str,
        k: int = 5,
        session_id: str | None = None,
        kinds: Iterable[str] | None = None,
        tags: Iterable[str] | None = None,
        filters: Mapping[str, Any] | None = None,
        min_score: float | None = None,
        include_superseded: bool = False,
    ) -> list[Hit]:
        """The ``k`` memories of ``user_id`` most relevant to ``query`` (hybrid dense + lexical), best first.

        ``Hit.score`` is how likely the memory answers the query, in [0, 1], the same on any store (>= 0.5: as likely
        as not; see :class:`~agentmem.types.Hit`); ``min_score`` drops hits below it, the rest stay in rank order.
        ``Hit.scores`` keeps the parts: ``dense`` (cosine similarity), ``overlap`` (share of the query's words),
        ``lexical`` (BM25), ``context`` (the cosine of a turn's context vector) and ``rank`` (the fused ranking score).
        Never returns another user's entries, nor expired ones (even before a sweep). Entries a newer memory
        superseded (or consolidation retracted) are left out unless ``include_superseded``; knowledge entries
        are those of the stable knowledge version (and unversioned ones).

        Example:
            >>> [h.text for h in mem.recall("where do I live?", user_id="u1", k=1)]
            ['I moved to Lyon last May.']
            >>> [h.id for h in mem.recall("What is my dog called?", user_id="u1", min_score=0.5)] == [dog.id]
            True
        """
        return self._recall(query, user_id=user_id, k=k, session_id=session_id, kinds=kinds, tags=tags,
                            filters=filters, include_superseded=include_superseded, min_score=min_score)

    def recall_for_mount(self, query: str, *, user_id: str, k: int = 4, kinds: Iterable[str] | None = None,
                         tags: Iterable[str] | None = None, filters: Mapping[str, Any] | None = None,
                         min_score: float | None = None, asking_session: str | None = None) -> list[Hit]:
        """``recall`` under the one mount policy (generate, sessions, the chat endpoint, the proxy, the LangGraph
        node): no roles of ``MemoryConfig.unmounted_roles`` (the assistant's replies), no earlier question of the
        user (``MemoryConfig.mount_questions``), no hit scoring below
        ``MemoryConfig.mount_min_score`` (or ``min_score`` if higher); ``asking_session`` picks the KB version.

        Example:
            >>> [h.text for h in mem.recall_for_mount("What is my dog called?", user_id="u1")]
            ['My dog is called Rex.']
        """
        return self.mount_choice(query, user_id=user_id, k=k, kinds=kinds, tags=tags, filters=filters,
                                 min_score=min_score, asking_session=asking_session).mounted

    def mount_choice(self, query: str, *, user_id: str, k: int = 4, kinds: Iterable[str] | None = None,
                     tags: Iterable[str] | None = None, filters: Mapping[str, Any] | None = None,
                     min_score: float | None = None, asking_session: str | None = None) -> MountChoice:
        """:meth:`recall_for_mount`'s hits, the recalled hits it left out for scoring below the threshold in force,
        and those it left out because a newer recalled memory contradicts them (one search: what a mount explains,
        e.g. the server's inspector).

        Example:
            >>> choice = mem.mount_choice("What is my dog called?", user_id="u1")
            >>> choice.threshold, [h.text for h in choice.mounted], [h.text for h in choice.below_threshold]
            (0.3, ['My dog is called Rex.'], ['I moved to Lyon last May.'])
        """
        below: list[Hit] = []
        contradicted: list[Hit] = []
        mounted = self._recall(query, user_id=user_id, k=k, kinds=kinds, tags=tags, filters=filters,
                               asking_session=asking_session, for_mount=True, min_score=min_score, below=below,
                               contradicted=contradicted)
        threshold = self._recaller.mount_threshold(check_score(min_score, "min_score")) or 0.0
        return MountChoice(mounted=mounted, below_threshold=below, threshold=threshold, contradicted=contradicted)

    def _recall(self, query: str, *, user_id: str, k: int, session_id: str | None = None,
                kinds: Iterable[str] | None = None, tags: Iterable[str] | None = None,
                filters: Mapping[str, Any] | None = None, include_superseded: bool = False,
                asking_session: str | None = None, for_mount: bool = False,
                min_score: float | None = None, below: list[Hit] | None = None,
                contradicted: list[Hit] | None = None) -> list[Hit]:
        """``recall``'s inputs checked, then the recall pipeline (:class:`agentmem.recall.pipeline.Recaller`):
        ``asking_session`` picks the knowledge version served, ``for_mount`` applies the mount policy, ``below`` /
        ``contradicted`` (lists) receive the ranked hits the threshold / a newer contradicting hit left out."""
        self._check_open()
        query = check_text(query, "query")
        scope = Scope(
            user_id=check_id(user_id, "user_id", required=True) or "",
            session_id=check_id(session_id, "session_id", required=False),
            kinds=check_kinds(kinds), tags=check_tags(tags) or None, predicate=compile_filters(filters),
            include_superseded=bool(include_superseded),
        )
        return self._recaller.recall(query, scope, k=check_k(k), min_score=check_score(min_score, "min_score"),
                                     asking_session=asking_session, for_mount=for_mount, below=below,
                                     contradicted=contradicted)

    def get(self, entry_id: str, *, user_id: str | None = None) -> MemoryRecord:
        """The entry with that id; raises :class:`NotFoundError` if it does not exist or has expired.

        With ``user_id``, an entry of another user is not found either (servers always pass it).
        """
        self._check_open()
        entry_id, owner = check_entry_id(entry_id), check_id(user_id, "user_id", required=False)
        return self._record(self._reads.live(entry_id, owner=owner))

    def list(
        self,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        kinds: Iterable[str] | None = None,
        tags: Iterable[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[MemoryRecord]:
        """Entries in the order they were stored (oldest first); expired entries are left out."""
        self._check_open()
        if user_id is None and session_id is None:
            raise InvalidInputError("list needs user_id or session_id")
        limit, offset = check_limit_offset(limit, offset)
        rows = self._store.list_rows(
            user_id=check_id(user_id, "user_id", required=False),
            session_id=check_id(session_id, "session_id", required=False),
            kinds=check_kinds(kinds), tags=check_tags(tags), alive_at=time.time(), limit=limit, offset=offset,
        )
        return [self._record(r) for r in rows]

    @property
    def kb_version(self) -> str | None:
        """The stable knowledge-base version (served to every session not in a staged rollout)."""
        return self._kb.stable

    def set_kb_version(self, version: str, *, rollout: float = 1.0) -> None:
        """Declare a knowledge-base version: knowledge entries written from now on belong to it.

        ``rollout=1`` (default) makes it stable at once; ``rollout=0.1`` stages it for ~10 % of sessions (stable per
        session) until :meth:`promote` or :meth:`rollback`. A session is served its version's knowledge (plus
        unversioned entries), never two versions at once; session caches built on another version are rebuilt.

        Example:
            >>> mem.set_kb_version("v2", rollout=0.1)
            >>> mem.remember("Returns are accepted for 60 days.", user_id="shop", kind="knowledge").kind
            'knowledge'
            >>> mem.kb_version, mem.promote(), mem.kb_version
            (None, 'v2', 'v2')
        """
        self._check_open()
        self._kb.set(version, rollout=rollout)

    def promote(self) -> str:
        """Serve the staged knowledge version to every session (it becomes :attr:`kb_version`); returns it."""
        self._check_open()
        return self._kb.promote()

    def rollback(self) -> str:
        """Withdraw the staged knowledge version: every session is served the stable one again; returns it."""
        self._check_open()
        return self._kb.rollback()

    def verify(self) -> dict[str, int]:
        """Check the store's consistency (rows, vectors, blobs; orphans and missing parts). Read-only.

        Example:
            >>> report = mem.verify()
            >>> report["rows"], report["orphan_vectors"], report["rows_missing_vector"]
            (2, 0, 0)
        """
        self._check_open()
        return self._store.verify()

    def stored_vectors(self, entry_ids: Sequence[str], *, user_id: str) -> dict[str, Any]:
        """The vectors the index holds for ``user_id``'s ``entry_ids`` (float32 numpy arrays; ids it does not hold
        are left out). For audits: an erasure check looks for these exact bytes in the store's files afterwards.

        Example:
            >>> mem.stored_vectors([rec.id], user_id="u1")[rec.id].shape, mem.stored_vectors([rec.id], user_id="u2")
            ((384,), {})
        """
        self._check_open()
        owner = check_id(user_id, "user_id", required=True) or ""
        return self._reads.vectors(owner, check_entry_ids(entry_ids))

    def stats(self) -> dict[str, Any]:
        """Counters: KV blob loads, fingerprint mismatches, corrupted blobs, entries encoded at mount time;
        consolidation outcomes (``lifecycle``: merged, superseded, llm decisions)."""
        life = dict(self._writer.stats) | ({} if self._llm is None else self._llm.stats())
        return {"kv": self._bank.stats.as_dict(), "model_loaded": self._bank.loaded, "lifecycle": life}

    def wait_consolidation(self, timeout: float | None = 30.0) -> bool:
        """Block until the background consolidation worker (``consolidation="llm"``) has decided everything queued.

        Example:
            >>> mem.wait_consolidation()      # nothing queued: this store consolidates locally, as it writes
            True
        """
        return True if self._llm is None else self._llm.wait(timeout)

    def _llm_worker(self) -> ConsolidationWorker:
        with self._sessions_lock:
            if self._llm is None:
                from agentmem.consolidate.llm import local_chat, store_worker

                chat = self._consolidation_model or local_chat(lambda: self._bank.engine)
                self._llm = store_worker(self._store, chat, clock=self._writer.clock)
            return self._llm

    # --- answering with mounted memories (agentmem/answer.py) -----------------------------------
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
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        entry_ids: Sequence[str] | None = None,
        on_text: Callable[[str], None] | None = None,
        logits_processor: Callable[[Any, Any], Any] | None = None,
        cancel: threading.Event | None = None,
        stop: Sequence[str] | None = None,
        json_schema: Mapping[str, Any] | None = None,
        repetition_penalty: float | None = None,
        logit_bias: Mapping[int | str, float] | None = None,
    ) -> GenerationResult:
        """Recall the ``k`` most relevant memories of ``user_id``, mount them, and answer ``question``.

        ``logits_processor`` (transformers' ``(ids, scores) -> scores``) constrains decoding, e.g. to a grammar.
        ``json_schema`` holds the answer to that JSON schema (constrained decoding, :mod:`agentmem.kv.constrain`);
        ``stop`` ends the answer at the first of these strings (left out of ``out.text`` and of ``on_text``);
        ``logit_bias`` ({token id: -100..100}, OpenAI's) is added to those tokens' logits (-100 in effect bans one).
        Sampling settings left None (``do_sample``, ``temperature``, ``top_p``, ``repetition_penalty``) are the
        model's own (its ``generation_config``; the embedded SmolLM2's: agentmem/kv/model.py).

        ``entry_ids`` skips recall and mounts exactly those entries of ``user_id`` (in that order), e.g. what a
        LangGraph node already chose.

        ``mode="kv"`` mounts stored KV (re-positioned exactly); ``"kv+fix"`` also recomputes a few tokens of each
        entry in context; ``"text"`` re-encodes the same memories as text (the baseline). Memories are recalled
        across all of the user's sessions; ``session_id`` names the conversation asking. Entries that do not fit in
        what ``budget_tokens`` (default ``mount_budget_tokens``) and the model's context leave, taken best first,
        are dropped and listed in ``out.dropped``; a shorter one after them is still mounted. ``on_text`` receives
        each piece of the answer as soon as it is decoded (streaming), on the calling thread. Setting ``cancel`` (a
        ``threading.Event``, from any thread, e.g. when the client hung up) stops decoding before its next step:
        ``out.cancelled`` is then True.

        Example:
            >>> out = mem.generate("What is my dog called?", user_id="u1", k=4, max_new_tokens=4)
            >>> out.mounted == [dog.id], len(out.token_ids) <= 4, out.timings["ttft"] > 0
            (True, True, True)
        """
        self._check_open()
        return self._answer.generate(
            question, user_id=user_id, session_id=session_id, k=k, mode=mode, max_new_tokens=max_new_tokens,
            tags=tags, kinds=kinds, filters=filters, budget_tokens=budget_tokens, strict=strict, do_sample=do_sample,
            temperature=temperature, top_p=top_p, seed=seed, entry_ids=entry_ids, on_text=on_text,
            logits_processor=logits_processor, cancel=cancel, stop=stop, json_schema=json_schema,
            repetition_penalty=repetition_penalty, logit_bias=logit_bias)

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
            >>> manual = "To reset the device, hold its power button down for ten seconds."
            >>> entry = mem.train(manual, user_id="u1", tags=["manual"], tokens=4, steps=2, progress=False)
            >>> out = mem.generate("How do I reset the device?", user_id="u1", tags=["manual"], max_new_tokens=2)
            >>> entry.kind, out.mounted == [entry.id]
            ('trained', True)
        """
        self._check_open()
        return self._answer.train(
            document, user_id=user_id, session_id=session_id, tags=tags, tokens=tokens, steps=steps, seed=seed, lr=lr,
            ttl=ttl, metadata=metadata, progress=progress, checkpoint_path=checkpoint_path, options=options)

    def fidelity(self, question: str, *, user_id: str, answer: str, entry_ids: Sequence[str],
                 tokens: int = 8) -> dict[str, float | int]:
        """Score ``answer``'s first ``tokens`` tokens with ``entry_ids`` mounted as KV and re-encoded as text.

        Returns ``{"kl", "top1_agree", "tokens"}`` (KL(text ‖ kv), near 0 when mounting is exact); the server's
        fidelity monitor calls it on a share of live answers.

        Example:
            >>> out = mem.generate("What is my dog called?", user_id="u1", max_new_tokens=4)
            >>> score = mem.fidelity("What is my dog called?", user_id="u1", answer=out.text, entry_ids=out.mounted)
            >>> sorted(score), score["kl"] < 0.05
            (['kl', 'tokens', 'top1_agree'], True)
        """
        self._check_open()
        return self._answer.fidelity(question, user_id=user_id, answer=answer, entry_ids=entry_ids, tokens=tokens)

    def tool_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """Instructions describing ``tools`` (OpenAI function-tool dicts) the way the local LLM's chat template
        renders them (a Hermes-style fallback for templates without tool support); loads the model.

        Example:
            >>> mem.tool_prompt([{"type": "function", "function": {"name": "get_weather"}}])
            '# Tools...<tools>...get_weather...</tools>...'
        """
        self._check_open()
        return self._answer.tool_prompt(tools)

    def count_tokens(self, text: str) -> int:
        """``text``'s length in the local LLM's tokens, e.g. to budget memories pasted into another model's prompt.

        Example:
            >>> mem.count_tokens("Alice likes tea.")
            4
        """
        self._check_open()
        return self._answer.count_tokens(check_text(text, "text"))

    def warmup(self) -> dict[str, float]:
        """Do the one-time work of a first run now, not inside the first request; returns seconds per step.

        Converts the embedded model once (cached), loads it, encodes the shared preamble, compiles the mount path
        (the numba re-rotation kernel), and exports the query embedder to ONNX (cached). Safe to call again.

        Example:
            >>> sorted(mem.warmup().items())      # doctest: +ELLIPSIS
            [('embedder', ...), ('engine', ...), ('model', ...)]
        """
        self._check_open()
        return self._answer.warmup()

    def load_model(self) -> None:
        """Load the local LLM now (it otherwise loads on the first encode or mount)."""
        self._check_open()
        self._answer.load_model()

    def encode_pending(self, *, user_id: str | None = None, batch_size: int = 16, progress: bool = True) -> int:
        """Encode KV for every entry that has none for the loaded model (bulk loads, model changes).

        Shows a progress bar; returns how many entries were encoded.
        """
        self._check_open()
        return self._answer.encode_pending(user_id=user_id, batch_size=batch_size, progress=progress)

    # --- sessions ------------------------------------------------------------------------------
    @property
    def sessions(self) -> SessionManager:
        """The session cache manager (hot / warm / cold tiers of each conversation's working KV)."""
        with self._sessions_lock:
            if self._sessions is None:
                self._sessions = factory.build_session_manager(
                    factory.BuildContext(root=self.path, config=self.config, cipher=self._cipher),
                    engine=lambda: self._bank.engine, retrieve=self._answer.mountable,
                    remember_turn=self._remember_turn, kb_version=self._kb.state_key,  # a rollout change rebuilds
                    scan=self._scanner.apply if self._scanner is not None else (lambda text: text),
                    embed_texts=self._store.embed_texts)
            return self._sessions

    def session(self, session_id: str, *, user_id: str) -> Session:
        """Open (or restore) a conversation whose working KV is reused across turns.

        Example:
            >>> chat = mem.session("s1", user_id="u1")
            >>> chat.send("My sister is called Inès.", max_new_tokens=2).reused_tokens
            0
            >>> chat.send("What is my sister called?", max_new_tokens=2).reused_tokens > 0
            True
        """
        self._check_open()
        return self.sessions.open(check_session_id(session_id, required=True, scanner=self._scanner) or "",
                                  user_id=check_id(user_id, "user_id", required=True) or "")

    def _remember_turn(self, user_id: str, session_id: str, role: str, text: str) -> list[MemoryRecord]:
        return self.remember_messages([{"role": role, "content": text}], user_id=user_id, session_id=session_id)

    # --- erase ---------------------------------------------------------------------------------
    def forget(
        self,
        entry_id: str | None = None,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        tags: Iterable[str] | None = None,
    ) -> int:
        """Erase entries (row, vector, KV blob) by id, or all of a user / session / tag set; returns the count.

        Scoped erasure pages through everything: there is no cap. ``forget(entry_id, user_id=...)`` erases the
        entry only if it belongs to that user (0 otherwise), as ``forget(session_id=..., user_id=...)`` erases only
        that user's entries of the session. Every argument is checked before anything is erased.
        """
        self._check_open()
        check_id(user_id, "user_id", required=False)
        check_id(session_id, "session_id", required=False)
        tag_list = check_tags(tags)
        if entry_id is not None:
            entry_id = check_entry_id(entry_id)
            if session_id is not None or tags is not None:
                raise InvalidInputError("forget takes an entry id (and optionally its user_id) or a scope "
                                        "(session_id/tags), not both")
            return self._forgetting.entry(entry_id, user_id=user_id)
        if user_id is None and session_id is None and not tag_list:
            raise InvalidInputError("forget needs an entry id, user_id, session_id or tags; refusing to erase everything")
        return self._forgetting.scope(user_id=user_id, session_id=session_id, tags=tag_list)

    def sweep(self) -> int:
        """Erase every expired entry everywhere (row, vector, blob); returns how many."""
        self._check_open()
        return self._forgetting.expired()

    def replay_erasures(self) -> int:
        """Apply the erasures other processes on this store (another server on the same PostgreSQL, the CLI's
        ``forget``) journalled since the last call: this process drops its in-memory copies of the erased entries
        (the :meth:`on_erase` listeners are told, the sessions holding them lose their working KV). Runs every
        ``erasure_replay_s`` on its own for a shared catalog; returns how many erasures were applied.

        Example:
            >>> mem.replay_erasures()      # nothing erased by another process
            0
        """
        self._check_open()
        return self._forgetting.replay()

    def on_erase(self, listener: Callable[[Erasure], None]) -> Callable[[], None]:
        """Call ``listener(erasure)`` after every ``forget`` and ``sweep`` (ids only, never text); returns a function
        that stops it. For in-process copies of memory text (a request log, a cache) that must go with the entries.

        Example:
            >>> stop = mem.on_erase(lambda e: print(e.action, sorted(e.user_ids)))
            >>> mem.forget(user_id="u1")
            forget_user ['u1']
            2
            >>> stop()
        """
        return self._erasures.add(listener)

    def _has_sessions(self) -> bool:
        # a shared cold store may hold this store's sessions even if this process never opened one
        return self._sessions is not None or self.config.session_store_url is not None or (
            self.path / "sessions").exists()

    def _end_session_kv(self, session_id: str, *, user_id: str | None) -> None:
        if self._has_sessions():
            self.sessions.end(session_id, user_id=user_id)

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidInputError("this AgentMemory is closed")


__all__ = ["AgentMemory"]
