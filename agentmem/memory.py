"""``AgentMemory``: the facade. It wires the parts together and holds no algorithm of its own.

Example:
    >>> from agentmem import AgentMemory
    >>> with AgentMemory("./memdata") as mem:                                     # doctest: +SKIP
    ...     rec = mem.remember("I moved to Lyon last May.", user_id="u1", session_id="s1")
    ...     mem.recall("where does the user live?", user_id="u1", k=3)[0].text
    'I moved to Lyon last May.'
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from agentmem.config import MemoryConfig
from agentmem.errors import InvalidInputError, NotFoundError
from agentmem.store.catalog import EntryRow
from agentmem.store.entries import EntryStore, NewEntry, Scope
from agentmem.store.filters import compile_filters
from agentmem.store.records import (
    check_id, check_k, check_kind, check_kinds, check_metadata, check_tags, check_text, check_ttl,
    format_timestamp, memory_line, message_fields, to_hit, to_record,
)
from agentmem.types import Hit, MemoryRecord

log = logging.getLogger("agentmem")


class AgentMemory:
    """Long-term memory for an agent: entries in SQLite, vectors in Chroma, KV blobs on disk.

    Args:
        path: directory holding ``catalog.db``, ``chroma/`` and ``kv/`` (created if missing).
        config: a :class:`MemoryConfig`; keyword overrides may be given instead (``AgentMemory(p, kv_dtype="float16")``).
    """

    def __init__(self, path: str | Path, *, config: MemoryConfig | None = None, **overrides: Any) -> None:
        if config is not None and overrides:
            raise InvalidInputError("give either config= or keyword overrides, not both")
        self.config = config or MemoryConfig(**overrides)
        self.path = Path(path)
        self._store = EntryStore(self.path, self.config)
        self._closed = False
        self._sweeper: threading.Thread | None = None
        self._stop = threading.Event()
        if self.config.sweep_interval:
            self._start_sweeper(self.config.sweep_interval)

    # --- context manager -------------------------------------------------------------------------
    def __enter__(self) -> AgentMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._sweeper is not None:
            self._sweeper.join(timeout=5)
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
    ) -> MemoryRecord:
        """Store one memory and return its record.

        ``speaker`` and ``timestamp`` (when it happened; default now) are kept in the memory line that is
        embedded and encoded, because questions like "when did I ..." depend on them.
        """
        entry = self._new_entry(text, user_id=user_id, session_id=session_id, kind=kind, role=role,
                                speaker=speaker, timestamp=timestamp, tags=tags, ttl=ttl, metadata=metadata)
        self._store.add([entry])
        return to_record(entry.row)

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
    ) -> list[MemoryRecord]:
        """Store chat messages (dicts with role/content or LangChain messages) in one all-or-nothing batch.

        Tool results become ``kind="tool"`` entries; system messages are skipped (they are instructions,
        not memories). Embeddings are computed in one batch.
        """
        if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence):
            raise InvalidInputError("messages must be a list of chat messages")
        entries = []
        for message in messages:
            role, content, name = message_fields(message)
            if role == "system":
                continue
            entries.append(self._new_entry(
                content, user_id=user_id, session_id=session_id, kind="tool" if role == "tool" else "turn",
                role=role, speaker=name, timestamp=timestamp, tags=tags, ttl=ttl, metadata=metadata,
            ))
        self._store.add(entries)
        return [to_record(e.row) for e in entries]

    def _new_entry(self, text: str, *, user_id: str, session_id: str | None, kind: str, role: str | None,
                   speaker: str | None, timestamp: datetime | str | None, tags: Iterable[str] | None,
                   ttl: float | timedelta | None, metadata: Mapping[str, Any] | None) -> NewEntry:
        self._check_open()
        text = check_text(text)
        check_id(user_id, "user_id", required=True)
        check_id(session_id, "session_id", required=False)
        check_kind(kind)
        tag_list = check_tags(tags)
        ttl_s = check_ttl(ttl)
        meta = check_metadata(metadata)
        now = time.time()
        occurred = format_timestamp(timestamp if timestamp is not None else datetime.now().astimezone())
        line = memory_line(text, kind=kind, speaker=speaker, role=role, occurred_at=occurred)
        row = EntryRow(
            id=str(uuid.uuid4()), user_id=user_id, session_id=session_id, kind=kind, role=role, speaker=speaker,
            occurred_at=occurred, text=text, memory_text=line, metadata_json=meta, created_at=now,
            expires_at=None if ttl_s is None else now + ttl_s,
        )
        return NewEntry(row=row, embed_text=line, index_text=line, tags=tag_list)

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
    ) -> list[Hit]:
        """The ``k`` memories of ``user_id`` most relevant to ``query`` (hybrid dense + lexical), best first.

        Never returns another user's entries, nor expired ones (even before a sweep).
        """
        self._check_open()
        query = check_text(query, "query")
        scope = Scope(
            user_id=check_id(user_id, "user_id", required=True) or "",
            session_id=check_id(session_id, "session_id", required=False),
            kinds=check_kinds(kinds), tags=check_tags(tags) or None, predicate=compile_filters(filters),
        )
        return [to_hit(s.row, s.score, s.scores) for s in self._store.search(query, scope, k=check_k(k))]

    def get(self, entry_id: str) -> MemoryRecord:
        """The entry with that id; raises :class:`NotFoundError` if it does not exist or has expired."""
        self._check_open()
        rows = self._store.catalog.get([entry_id])
        if not rows or (rows[0].expires_at is not None and rows[0].expires_at <= time.time()):
            raise NotFoundError(f"no memory entry with id {entry_id!r}")
        return to_record(rows[0])

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
        q = self._store.catalog.scope_select(
            user_id=check_id(user_id, "user_id", required=False),
            session_id=check_id(session_id, "session_id", required=False),
            kinds=check_kinds(kinds), tags=check_tags(tags), alive_at=time.time(),
        )
        return [to_record(r) for r in self._store.catalog.list_rows(q, limit=limit, offset=offset)]

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

        Scoped erasure pages through everything: there is no cap.
        """
        self._check_open()
        if entry_id is not None:
            if any(x is not None for x in (user_id, session_id, tags)):
                raise InvalidInputError("forget takes an entry id or a scope (user_id/session_id/tags), not both")
            return self._store.delete([entry_id])
        tag_list = check_tags(tags)
        if user_id is None and session_id is None and not tag_list:
            raise InvalidInputError("forget needs an entry id, user_id, session_id or tags; refusing to erase everything")
        q = self._store.catalog.scope_select(
            user_id=check_id(user_id, "user_id", required=False),
            session_id=check_id(session_id, "session_id", required=False), tags=tag_list,
        )
        ids = [i for page in self._store.catalog.iter_ids(q) for i in page]
        return self._store.delete(ids)

    def sweep(self) -> int:
        """Erase every expired entry everywhere (row, vector, blob); returns how many."""
        self._check_open()
        return self._store.delete(self._store.catalog.expired_ids(time.time()))

    def _start_sweeper(self, interval: float) -> None:
        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.sweep()
                except Exception:  # a failed sweep must not kill the timer; the next one retries
                    log.exception("background sweep failed")

        self._sweeper = threading.Thread(target=loop, name="agentmem-sweeper", daemon=True)
        self._sweeper.start()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidInputError("this AgentMemory is closed")


__all__ = ["AgentMemory"]
