"""The catalog: one SQLite row per memory entry, through SQLAlchemy 2.0's typed ORM.

It knows nothing about vectors or tensors. It also holds the lexical index (SQLite FTS5, written in the
same transaction as the row), so a row and its lexical document can never disagree. Each user has an FTS5 table
of their own, like their own Chroma collection: BM25's document frequencies and lengths are then the user's own
(one shared table let other users' words decide what is rare), and a user's erasure drops a whole table.

Example:
    >>> cat = SqliteCatalog(":memory:")
    >>> cat.insert([EntryRecord(id="e1", user_id="u", kind="turn", text="hi", memory_text="hi", created_at=0.0)],
    ...            index_texts=["hi"])
    >>> [r.id for r in cat.get(["e1"])]
    ['e1']
"""

from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
import threading
import time
from contextlib import contextmanager
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, delete, event, func, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from agentmem.backends.lexical_bounds import WILDCARD, can_stop, idf, prefix_of, term_bound
from agentmem.backends.migrations import apply_migrations, schema_version
from agentmem.backends.sqlite import history as lifecycle_sql
from agentmem.backends.sqlite.entry_records import read_records, record_of, row_of
from agentmem.backends.sqlite.history import bump_chain_cuts, erase_lifecycle
from agentmem.backends.sqlite.lexical import LEXICAL_PREFIX, lexical_ddl, lexical_table, record_bounds
from agentmem.backends.sqlite.rows import COMMITTED, EntryRow, StoreInfo, TagRow
from agentmem.backends.sqlite.schema import MIGRATIONS, SCHEMA_VERSION
from agentmem.ports.catalog import (CHAIN_CUTS_KEY, KV_FIELDS, CatalogScope, EntryRecord, HistoryEvent, TurnContext,
                                    chain_cuts_value)
from agentmem.text import STOPWORDS

log = logging.getLogger(__name__)


def _table_exists(conn: Any, name: str) -> bool:
    """Whether ``name`` is a table of the file (``conn``: a SQLAlchemy connection or session)."""
    return conn.execute(text("SELECT 1 FROM sqlite_master WHERE name = :n"), {"n": name}).first() is not None


_WORD = re.compile(r"[A-Za-z0-9]+(?:'[A-Za-z]+)?")


def fts_query(query: str, *, blind: Callable[[str], str] | None = None) -> str | None:
    """Turn free text into a safe FTS5 OR-query of its content words (None when nothing is left).

    ``blind`` maps each word to its keyed hash when the index is blinded (encrypted stores).
    """
    words: list[str] = []
    for w in _WORD.findall(query.lower()):
        w = w.split("'")[0]
        if not w or w in STOPWORDS:
            continue
        if blind is not None:
            w = blind(w)
        if w not in words:
            words.append(w)
    return " OR ".join(f'"{w}"' for w in words) or None


class SqliteCatalog:
    """SQLite catalog of entries (WAL mode, busy timeout, secure delete)."""

    def __init__(self, path: str, *, busy_timeout_ms: int = 30_000) -> None:
        url = "sqlite://" if path == ":memory:" else f"sqlite:///{path}"
        kwargs: dict[str, Any] = {"connect_args": {"timeout": busy_timeout_ms / 1000, "check_same_thread": False}}
        if path == ":memory:":
            kwargs["poolclass"] = StaticPool
        self.engine: Engine = create_engine(url, **kwargs)
        self._write_lock = threading.Lock()  # one writer per process; other processes wait on busy_timeout

        @event.listens_for(self.engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            _switch_to_wal(cur, deadline=time.monotonic() + busy_timeout_ms / 1000)
            cur.execute("PRAGMA foreign_keys=ON")
            # Erased memories must not linger in free pages of the file.
            cur.execute("PRAGMA secure_delete=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.read_engine: Engine = self.engine  # single-statement reads (PostgreSQL: an autocommit pool)
        self._reads = self._sessions
        self._lexical_tables: set[str] = set()  # seen to exist; a read that finds one gone refreshes it
        self.early_stops = 0  # lexical searches answered by the documents holding every term (lexical_bounds)
        self._migrate(None if path == ":memory:" else Path(path).with_name(Path(path).name + ".migrate.lock"))

    def _migrate(self, lock_path: Path | None) -> None:
        """Apply pending schema migrations; a file lock keeps two processes opening a new store from racing."""
        with self.engine.connect() as conn:
            if schema_version(conn) == SCHEMA_VERSION:
                return
        with self._write_lock, _file_lock(lock_path), self.engine.begin() as conn:
            applied = apply_migrations(conn, MIGRATIONS)
        if applied:
            log.info("catalog migrated to schema %d (applied %s)", SCHEMA_VERSION, applied)


    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One write transaction (the process-wide write lock held): for multi-table lifecycle changes."""
        with self._write_lock, self._sessions.begin() as s:
            yield s

    def replace_lexical(self, s: Session, user_id: str, entry_id: str, content: str | None) -> None:
        """Inside transaction ``s``: replace an entry's lexical document (``None``: drop it)."""
        table = lexical_table(user_id)
        s.execute(text(lexical_ddl(table)))
        s.execute(text(f"DELETE FROM {table} WHERE id = :id"), {"id": entry_id})
        if content is not None:
            s.execute(text(f"INSERT INTO {table}(id, content) VALUES (:id, :c)"), {"id": entry_id, "c": content})
            record_bounds(s, table, [content])
        self._lexical_tables.add(table)

    def read(self) -> Session:
        """A read-only ORM session (use as a context manager)."""
        return self._reads()

    def lexical_tables(self) -> list[str]:
        """Every user's FTS5 table in the file (for scrubbing and checks)."""
        with self.engine.connect() as conn:
            return [r[0] for r in conn.exec_driver_sql(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%' "
                "AND name LIKE ?", (LEXICAL_PREFIX + "%",))]

    def _has_lexical_table(self, table: str, *, refresh: bool = False) -> bool:
        if refresh:
            self._lexical_tables.discard(table)
        if table not in self._lexical_tables:
            with self.engine.connect() as conn:
                if _table_exists(conn, table):
                    self._lexical_tables.add(table)
        return table in self._lexical_tables

    # --- writes --------------------------------------------------------------------------------
    def insert(self, records: Sequence[EntryRecord], *, index_texts: Sequence[str | None], pending: bool = False,
               history: Sequence[HistoryEvent] = ()) -> None:
        """Insert entries, their tags, lexical documents (None: stored, not indexed) and history events in one
        transaction (all or nothing).

        ``pending`` records the rows as writes in flight ("adding"): readers do not see them until :meth:`commit`.
        """
        with self._write_lock, self._sessions.begin() as s:
            add_rows(s, records, pending=pending)
            s.add_all(lifecycle_sql.history_rows(history))
            for user_id in dict.fromkeys(r.user_id for r in records):
                table = lexical_table(user_id)
                # always IF NOT EXISTS: another process may have dropped it; DDL rolls back with the rows
                s.execute(text(lexical_ddl(table)))
                docs = [{"id": r.id, "c": t} for r, t in zip(records, index_texts) if r.user_id == user_id and t is not None]
                if docs:
                    s.execute(text(f"INSERT INTO {table}(id, content) VALUES (:id, :c)"), docs)
                    record_bounds(s, table, [d["c"] for d in docs])
            self._bump(s)
        self._lexical_tables.update(lexical_table(r.user_id) for r in records)

    def commit(self, ids: Sequence[str]) -> None:
        """Make pending rows visible: their vectors and blobs are in place."""
        with self._write_lock, self._sessions.begin() as s:
            for chunk in chunks(list(ids), 500):
                s.execute(update(EntryRow).where(EntryRow.id.in_(chunk), EntryRow.write_state == "adding")
                          .values(write_state=None, write_since=None))
            self._bump(s)

    def mark_deleting(self, ids: Sequence[str]) -> list[EntryRecord]:
        """Hide committed rows and record their deletion as in flight; returns the entries marked."""
        if not ids:
            return []
        now = time.time()
        out: list[EntryRecord] = []
        with self._write_lock, self._sessions.begin() as s:
            for chunk in chunks(list(ids), 500):
                rows = list(s.scalars(select(EntryRow).where(EntryRow.id.in_(chunk), COMMITTED)))
                for row in rows:
                    row.write_state, row.write_since = "deleting", now
                out += map(record_of, rows)
            self._bump(s)
        return out

    def pending(self, older_than: float) -> list[EntryRecord]:
        """Rows whose add, deletion or blob write was recorded before ``older_than`` and not finished.

        Served by two partial indexes that hold only in-flight rows: the cost is O(in flight), not O(store).
        """
        with self._sessions() as s:
            rows = list(s.scalars(select(EntryRow).where(EntryRow.write_state.is_not(None),
                                                         EntryRow.write_since <= older_than)))
            rows += s.scalars(select(EntryRow).where(EntryRow.kv_staged_at.is_not(None),
                                                     EntryRow.kv_staged_at <= older_than, COMMITTED))
            return [record_of(r) for r in rows]

    def set_kv(self, entry_id: str, kv: Mapping[str, Any] | None, *, version: int | None = None) -> bool:
        """Mark a blob write in flight on a committed row (``kv=None``; at ``version`` when given), or end it: set
        the KV fields ``kv`` and clear the mark (any row: a deletion in flight erases what it names). False if
        there is no such row."""
        if kv is not None and not set(kv) <= KV_FIELDS:
            raise ValueError(f"not KV fields: {set(kv) - KV_FIELDS}")
        where = [EntryRow.id == entry_id] + ([EntryRow.version == version] if version is not None else [])
        with self._write_lock, self._sessions.begin() as s:
            if kv is None:
                marked = s.execute(update(EntryRow).where(*where, COMMITTED).values(kv_staged_at=time.time()))
                return bool(marked.rowcount)
            done = bool(s.execute(update(EntryRow).where(*where).values(**kv, kv_staged_at=None)).rowcount)
            if done:
                self._bump(s)
            return done

    def _bump(self, s: Session) -> None:
        _bump(s)

    def change_token(self) -> int:
        """The store's change counter: it moves on every committed write, whichever process made it."""
        with self._sessions() as s:
            value = s.get(StoreInfo, "changes")
            return int(value.value) if value is not None else 0

    def delete(self, ids: Sequence[str]) -> list[EntryRecord]:
        """Delete rows (and tags, lexical docs); return what was deleted so callers can erase blobs/vectors."""
        if not ids:
            return []
        with self._write_lock, self._sessions.begin() as s:
            rows = [record_of(r) for r in s.scalars(select(EntryRow).where(EntryRow.id.in_(ids)))]
            found = [r.id for r in rows]
            if found:
                s.execute(delete(TagRow).where(TagRow.entry_id.in_(found)))
                erase_lifecycle(s, found)
                s.execute(delete(EntryRow).where(EntryRow.id.in_(found)))
                self._bump(s)
                for user_id in {r.user_id for r in rows}:
                    table = lexical_table(user_id)
                    if not _table_exists(s, table):  # inside the transaction: another process may have dropped it
                        continue
                    if s.scalar(select(func.count()).select_from(EntryRow).where(EntryRow.user_id == user_id)) == 0:
                        # the user's last entry: drop the whole index (nothing of theirs stays in its segments)
                        s.execute(text(f"DROP TABLE {table}"))
                        s.execute(text("DELETE FROM lexical_bounds WHERE tbl = :t"), {"t": table})
                        self._lexical_tables.discard(table)
                        continue
                    for chunk in chunks([r.id for r in rows if r.user_id == user_id], 500):
                        s.execute(
                            text(f"DELETE FROM {table} WHERE id IN ({','.join(':i%d' % i for i in range(len(chunk)))})"),
                            {f"i{i}": v for i, v in enumerate(chunk)},
                        )
            return rows

    def set_info(self, key: str, value: str) -> None:
        with self._write_lock, self._sessions.begin() as s:
            s.merge(StoreInfo(key=key, value=value))

    def get_info(self, key: str) -> str | None:
        # a Core select, not Session.get: read on every recall (kb_versions), where an ORM session cost 4x the query
        with self.read_engine.connect() as conn:
            return conn.execute(select(StoreInfo.value).where(StoreInfo.key == key)).scalar()

    def infos(self, keys: Sequence[str]) -> dict[str, str]:
        """Several ``store_info`` values in one read (keys without a value are left out): every recall asks which
        knowledge version it is served and the chain-cut stamp (two ORM reads cost ~0.9 ms per recall at 10,000
        entries; this one Core read ~0.15 ms)."""
        with self.read_engine.connect() as conn:
            return dict(conn.execute(select(StoreInfo.key, StoreInfo.value).where(StoreInfo.key.in_(list(keys)))).all())

    def info_items(self, prefix: str, *, after: str = "") -> list[tuple[str, str]]:
        with self.read_engine.connect() as conn:
            q = (select(StoreInfo.key, StoreInfo.value)
                 .where(StoreInfo.key.startswith(prefix, autoescape=True), StoreInfo.key > after)
                 .order_by(StoreInfo.key))
            return [(k, v) for k, v in conn.execute(q).all()]

    def delete_infos(self, keys: Sequence[str]) -> None:
        if keys:
            with self._write_lock, self._sessions.begin() as s:
                s.execute(delete(StoreInfo).where(StoreInfo.key.in_(list(keys))))

    # --- reads ---------------------------------------------------------------------------------
    def get(self, ids: Sequence[str]) -> list[EntryRecord]:
        """Committed entries for ``ids``, in the order given (missing ids skipped), as plain records read with one
        Core SELECT a chunk (:mod:`agentmem.backends.sqlite.entry_records`: no ORM instances on recall's path).

        Example:
            >>> SqliteCatalog(":memory:").get(["nope"])
            []
        """
        if not ids:
            return []
        by_id: dict[str, EntryRecord] = {}
        with self.read_engine.connect() as conn:
            for chunk in chunks(list(ids), 500):
                by_id.update(read_records(conn, chunk))
        return [by_id[i] for i in ids if i in by_id]

    @staticmethod
    def _select(scope: CatalogScope) -> Any:
        """The SELECT of committed entry ids in ``scope``; every tag must be present (AND)."""
        q = select(EntryRow.id).where(COMMITTED)
        if scope.user_id is not None:
            q = q.where(EntryRow.user_id == scope.user_id)
        if scope.session_id is not None:
            q = q.where(EntryRow.session_id == scope.session_id)
        if scope.kinds:
            q = q.where(EntryRow.kind.in_(list(scope.kinds)))
        for tag in scope.tags or ():
            q = q.where(EntryRow.id.in_(select(TagRow.entry_id).where(TagRow.tag == tag)))
        if scope.alive_at is not None:
            q = q.where((EntryRow.expires_at.is_(None)) | (EntryRow.expires_at > scope.alive_at))
        if scope.expired_by is not None:
            q = q.where(EntryRow.expires_at <= scope.expired_by)
        if scope.has_successor is not None:
            q = q.where(EntryRow.superseded_by.is_not(None) if scope.has_successor else EntryRow.superseded_by.is_(None))
        if scope.created_after is not None:
            q = q.where(EntryRow.created_at > scope.created_after)
        if scope.created_before is not None:
            q = q.where(EntryRow.created_at < scope.created_before)
        return q

    def iter_ids(self, scope: CatalogScope, *, page_size: int = 1000) -> Iterator[list[str]]:
        """Page through every id in ``scope`` (no silent cap)."""
        query, last = self._select(scope), ""
        while True:
            with self._sessions() as s:
                page = list(s.scalars(query.where(EntryRow.id > last).order_by(EntryRow.id).limit(page_size)))
            if not page:
                return
            yield page
            last = page[-1]

    def list_entries(self, scope: CatalogScope, *, limit: int | None = None, offset: int = 0,
                     newest_first: bool = False) -> list[EntryRecord]:
        """The entries in ``scope`` by (created_at, id) (``newest_first``: the reverse), ``offset`` skipped, at
        most ``limit``. A session's newest turn before a time reads the (session_id, created_at) index backwards
        and stops at the first row."""
        order = (EntryRow.created_at.desc(), EntryRow.id.desc()) if newest_first else (EntryRow.created_at, EntryRow.id)
        ids_q = self._select(scope).order_by(*order).offset(offset)
        if limit is not None:
            ids_q = ids_q.limit(limit)
        with self._sessions() as s:
            ids = list(s.scalars(ids_q))
        return self.get(ids)

    def all_kv_paths(self) -> set[str]:
        with self._sessions() as s:
            return {p for p in s.scalars(select(EntryRow.kv_path).where(EntryRow.kv_path.is_not(None)))}

    def existing(self, ids: Sequence[str]) -> set[str]:
        out: set[str] = set()
        with self._sessions() as s:
            for chunk in chunks(list(ids), 500):
                out.update(s.scalars(select(EntryRow.id).where(EntryRow.id.in_(chunk), COMMITTED)))
        return out

    # Below this many documents a user's exhaustive BM25 costs less than the look-ups that prove a shortcut safe.
    prune_min_docs = 2000

    def lexical_search(self, query: str, *, user_id: str, limit: int,
                       blind: Callable[[str], str] | None = None) -> list[tuple[str, float]]:
        """BM25 search over the user's lexical documents: [(id, score)], best first, score > 0.

        At scale, the documents holding every query term are scored first; when they fill ``limit`` and no
        document missing a term can beat the last of them (:mod:`agentmem.backends.lexical_bounds`), that is the
        answer, and FTS5 never scores the thousands of documents holding one common term. Otherwise (or for a
        small table) every matching document is scored. Same scores either way; only the order of tied scores
        at the cut may differ.
        """
        match = fts_query(query, blind=blind)
        table = lexical_table(user_id)
        if match is None or not self._has_lexical_table(table):
            return []
        try:
            with self.engine.connect() as conn:
                early = self._all_terms_top(conn, table, match, limit)
                if early is not None:
                    return early
                return _bm25_top(conn, table, match, limit)
        except OperationalError:
            if self._has_lexical_table(table, refresh=True):
                raise
            return []  # another process erased the user's last entry meanwhile

    def _all_terms_top(self, conn: Any, table: str, match: str, limit: int) -> list[tuple[str, float]] | None:
        """The top ``limit`` from the documents holding every query term, when that is provably the whole top
        ``limit`` (see :mod:`agentmem.backends.lexical_bounds`); None when it is not, or not worth asking."""
        phrases = match.split(" OR ")
        if len(phrases) < 2:
            return None
        n_docs, total_len = _fts5_totals(conn, table)
        if n_docs < self.prune_min_docs or total_len <= 0:
            return None
        count = f"SELECT count(*) FROM {table} WHERE {table} MATCH ?"
        dfs = [int(conn.exec_driver_sql(count, (p,)).scalar()) for p in phrases]
        held = [(p, df) for p, df in zip(phrases, dfs) if df > 0]  # a term no document holds adds 0 to every score
        if len(held) < 2:
            return None
        top = _bm25_top(conn, table, " AND ".join(p for p, _ in held), limit)
        if len(top) < limit:
            return None
        prefixes = [prefix_of(p.strip('"')) for p, _ in held]
        min_len, most = _bounds_of(conn, table, prefixes)
        if min_len is None or not all(x in most for x in prefixes):
            return None  # documents written without bounds (nothing to prove the shortcut with)
        wildcard, avg_len = most.get(WILDCARD, 0), total_len / n_docs
        bounds = [term_bound(idf(n_docs, df), max_tf=most[x] + wildcard, min_len=min_len, avg_len=avg_len)
                  for x, (_, df) in zip(prefixes, held)]
        if not can_stop(theta=top[-1][1], bounds=bounds):
            return None
        self.early_stops += 1
        return top

    def turn_context(self, ids: Sequence[str], *, window: int = 2, committed: bool = True) -> dict[str, TurnContext]:
        """For entries among ``ids``: their session and, for conversation turns, the ``window`` committed turns of
        the same user and session before and after them (nearest first); ``committed=False``: rows in flight too.

        Indexed look-ups on (session_id, created_at): cost grows with the candidates, not with the store. Plain
        driver SQL because the statement changes with the number of ids and SQLAlchemy would compile each one.
        """
        if not ids:
            return {}
        before = (f"(SELECT group_concat(id, ' ') FROM (SELECT p.id FROM entries p WHERE p.session_id = e.session_id "
                  f"AND p.user_id = e.user_id AND p.kind = 'turn' AND p.write_state IS NULL "
                  f"AND p.created_at < e.created_at ORDER BY p.created_at DESC LIMIT {int(window)}))")
        after = (f"(SELECT group_concat(id, ' ') FROM (SELECT n.id FROM entries n WHERE n.session_id = e.session_id "
                 f"AND n.user_id = e.user_id AND n.kind = 'turn' AND n.write_state IS NULL "
                 f"AND n.created_at > e.created_at ORDER BY n.created_at ASC LIMIT {int(window)}))")
        visible = "e.write_state IS NULL AND " if committed else ""
        out: dict[str, TurnContext] = {}
        with self.engine.connect() as conn:
            for chunk in chunks(list(ids), 500):
                sql = (f"SELECT e.id, e.session_id, e.kind = 'turn' AND e.session_id IS NOT NULL, {before}, {after} "
                       f"FROM entries e WHERE {visible}e.id IN ({','.join('?' * len(chunk))})")
                # .all(): one fetchall, not a Python fetchone per row (~130 rows a recall on the critical path)
                for entry_id, session_id, is_turn, prev, nxt in conn.exec_driver_sql(sql, tuple(chunk)).all():
                    # group_concat keeps the ordered sub-select's order (nearest first); ids contain no spaces
                    out[entry_id] = TurnContext(session_id, tuple(prev.split()) if is_turn and prev else (),
                                                tuple(nxt.split()) if is_turn and nxt else (), bool(is_turn))
        return out

    def scrub(self, user_ids: Iterable[str] | None = None, *, vacuum: bool = False) -> None:
        """Push erased rows' bytes out of FTS5 segments and the WAL (run after an erasure batch).

        ``user_ids`` limits the FTS5 ``optimize`` to those users' tables (the ones an erasure touched).
        ``vacuum``: secure_delete alone left a whole deleted row in a page of the file (measured after erasing
        1,100 entries, tests/unit/test_hardening_erasure.py); VACUUM rewrites every page.
        """
        from agentmem.security.erase import scrub_sqlite

        tables = (self.lexical_tables() if user_ids is None
                  else [t for t in map(lexical_table, set(user_ids)) if self._has_lexical_table(t)])
        with self._write_lock:
            conn = self.engine.raw_connection()
            try:
                scrub_sqlite(conn, fts_tables=tables, vacuum=vacuum)
            finally:
                conn.close()

    # --- lifecycle (the port's versions, statuses and history; SQL in backends/sqlite/history.py) --------------
    def history(self, entry_id: str) -> list[HistoryEvent]:
        """The entry's events, oldest first."""
        with self.read() as s:
            return lifecycle_sql.read_history(s, entry_id)

    def chain_ends(self, ids: Sequence[str], *, longest: int = 8) -> dict[str, str]:
        """Each superseded id's chain end, in one recursive query (the port's ``chain_ends``)."""
        if not ids:
            return {}
        with self.read() as s:
            return lifecycle_sql.chain_ends(s, ids, longest)

    def replace_entry(self, entry_id: str, fields: dict[str, Any], *, index_text: str | None,
                      tags: Sequence[str] | None, events: Sequence[HistoryEvent]) -> None:
        """Overwrite an entry's columns, lexical document, tags and log ``events`` in one transaction."""
        with self.transaction() as s:
            live = lifecycle_sql.replace_fields(s, entry_id, fields, tags)
            self.replace_lexical(s, live.user_id, entry_id, index_text)
            s.add_all(lifecycle_sql.history_rows(events))

    def apply_event(self, event: HistoryEvent) -> bool:
        """Make the change ``event`` records (a status change or a sighting) and log it, one transaction; False
        if the entry is gone or not in the state the change starts from."""
        with self.transaction() as s:
            return lifecycle_sql.apply_event(s, event)

    def close(self) -> None:
        self.engine.dispose()
        if self.read_engine is not self.engine:
            self.read_engine.dispose()


def _bm25_top(conn: Any, table: str, match: str, limit: int) -> list[tuple[str, float]]:
    """The best ``limit`` documents of FTS5 ``table`` for ``match``: [(id, score)], best first (``bm25()`` is
    negative, lower is better: flipped so higher is better, as every lexical score here)."""
    sql = f"SELECT id, bm25({table}) AS s FROM {table} WHERE {table} MATCH ? ORDER BY s LIMIT ?"
    return [(r[0], -float(r[1])) for r in conn.exec_driver_sql(sql, (match, limit))]


def _fts5_totals(conn: Any, table: str) -> tuple[int, int]:
    """(documents, total tokens) of an FTS5 table, as its bm25() reads them: the "averages" record (rowid 1 of
    ``<table>_data``: varints, the row count then each column's token total). A direct look-up, where count(*)
    would scan the table."""
    row = conn.exec_driver_sql(f"SELECT block FROM {table}_data WHERE id = 1").first()
    if row is None or not row[0]:
        return 0, 0
    values, blob, i = [], bytes(row[0]), 0
    while i < len(blob):
        value, i = _varint(blob, i)
        values.append(value)
    return values[0], sum(values[1:])


def _varint(blob: bytes, i: int) -> tuple[int, int]:
    """SQLite's varint at ``blob[i]``: 7 bits a byte, high bit set while more follow, the ninth byte whole."""
    value = 0
    for k in range(9):
        byte = blob[i]
        i += 1
        if k == 8:
            return (value << 8) | byte, i
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, i
    raise AssertionError("unreachable")


def _bounds_of(conn: Any, table: str, prefixes: Sequence[str]) -> tuple[int | None, dict[str, int]]:
    """(shortest document length, {prefix: most tokens in one document}) recorded for ``table``, for ``prefixes``
    and the wildcard."""
    wanted = sorted({"", WILDCARD, *prefixes})
    min_len, most = None, {}
    sql = f"SELECT prefix, value FROM lexical_bounds WHERE tbl = ? AND prefix IN ({','.join('?' * len(wanted))})"
    for prefix, value in conn.exec_driver_sql(sql, (table, *wanted)):
        if prefix == "":
            min_len = int(value)
        else:
            most[prefix] = int(value)
    return min_len, most


_CHAIN_CUTS = text(f"""SELECT value FROM store_info WHERE "key" = '{CHAIN_CUTS_KEY}'""")


def chain_cuts(catalog: SqliteCatalog) -> int:
    """The store's chain-cut stamp (0 until a chain was first cut), one plain read on the catalog's read pool.

    Example:
        >>> chain_cuts(SqliteCatalog(":memory:"))
        0
    """
    with catalog.read_engine.connect() as conn:
        return chain_cuts_value(conn.execute(_CHAIN_CUTS).scalar())


def add_rows(s: Session, records: Sequence[EntryRecord], *, pending: bool) -> None:
    """Add entries with their tags to an ORM session (marked "adding" when ``pending``, else committed whatever
    the records say) and flush them."""
    now = time.time()
    for record in records:
        row = row_of(record)
        row.write_state, row.write_since = ("adding", now) if pending else (None, None)
        s.add(row)
    s.flush()


def _bump(s: Session) -> None:
    """Move the change counter inside the write's own transaction (readers of derived caches compare it)."""
    s.execute(text("""UPDATE store_info SET value = CAST(CAST(value AS INTEGER) + 1 AS VARCHAR) WHERE "key" = 'changes'"""))


def _switch_to_wal(cur: Any, *, deadline: float) -> None:
    """Put the file in WAL mode, waiting out other connections that hold it.

    SQLite answers ``PRAGMA journal_mode=WAL`` with "database is locked" at once, without calling the busy
    handler, while another connection (say, a second process opening the same new store) holds a lock; so the
    switch is retried here until ``deadline``, the same patience the busy timeout gives every other statement.
    """
    pause = 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


@contextlib.contextmanager
def _file_lock(path: Path | None) -> Iterator[None]:
    """An exclusive lock across processes on ``path`` (no-op for in-memory catalogs and where fcntl is missing)."""
    if path is None:
        yield
        return
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def chunks(items: list[str], n: int) -> Iterator[list[str]]:
    """``items`` in slices of at most ``n`` (SQL ``IN`` lists stay under the drivers' parameter limits).

    Example:
        >>> list(chunks(["a", "b", "c"], 2))
        [['a', 'b'], ['c']]
    """
    for i in range(0, len(items), n):
        yield items[i : i + n]


__all__ = ["CHAIN_CUTS_KEY", "SqliteCatalog", "add_rows", "bump_chain_cuts", "chain_cuts", "chain_cuts_value", "chunks",
           "erase_lifecycle", "fts_query"]
