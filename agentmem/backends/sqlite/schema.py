"""The catalog's schema history: every migration ever applied to a store, oldest first (see
:mod:`agentmem.backends.migrations`). One list for SQLite and PostgreSQL; the ORM model in
:mod:`agentmem.backends.sqlite.rows` must equal what these produce (a test compares them).

Append new steps at the end; never edit a landed one (stores in the field ran it as written).

Example:
    >>> from agentmem.backends.sqlite.schema import MIGRATIONS
    >>> [m.version for m in MIGRATIONS][:3]
    [1, 2, 3]
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from agentmem.backends.migrations import Migration, latest_version
from agentmem.backends.sqlite.lexical import (BOUNDS_DDL, LEXICAL_PREFIX, lexical_ddl, lexical_table,
                                              record_bounds)

# Frozen as the ORM compiled it at schema 1 (types both SQLite and PostgreSQL accept).
_BASELINE = (
    """CREATE TABLE IF NOT EXISTS entries (
        id VARCHAR(36) NOT NULL, user_id VARCHAR NOT NULL, session_id VARCHAR, kind VARCHAR(16) NOT NULL,
        role VARCHAR(32), speaker VARCHAR, occurred_at VARCHAR, text TEXT NOT NULL, memory_text TEXT NOT NULL,
        metadata JSON NOT NULL, created_at FLOAT NOT NULL, expires_at FLOAT, kv_path VARCHAR, kv_tokens INTEGER,
        kv_fingerprint VARCHAR(64), kv_dtype VARCHAR(16), kb_version VARCHAR, PRIMARY KEY (id))""",
    "CREATE INDEX IF NOT EXISTS ix_entries_expires_at ON entries (expires_at)",
    "CREATE INDEX IF NOT EXISTS ix_entries_session_created ON entries (session_id, created_at)",
    "CREATE INDEX IF NOT EXISTS ix_entries_user_id ON entries (user_id)",
    "CREATE INDEX IF NOT EXISTS ix_entries_kind ON entries (kind)",
    "CREATE INDEX IF NOT EXISTS ix_entries_created_at ON entries (created_at)",
    "CREATE INDEX IF NOT EXISTS ix_entries_session_id ON entries (session_id)",
    """CREATE TABLE IF NOT EXISTS store_info ("key" VARCHAR NOT NULL, value VARCHAR NOT NULL, PRIMARY KEY ("key"))""",
    """CREATE TABLE IF NOT EXISTS entry_tags (
        entry_id VARCHAR(36) NOT NULL, tag VARCHAR NOT NULL, PRIMARY KEY (entry_id, tag),
        FOREIGN KEY(entry_id) REFERENCES entries (id) ON DELETE CASCADE)""",
    "CREATE INDEX IF NOT EXISTS ix_entry_tags_tag ON entry_tags (tag)",
)
LEGACY_FTS = "entries_fts"  # schema 1 (SQLite): one FTS5 table for every user


# PostgreSQL's lexical index: one tsvector per entry, plus per-user BM25 statistics (documents, total length,
# document frequency of each term), kept in the writing transaction. (Added to step 1 before any PostgreSQL store
# existed; SQLite stores never run this branch.)
_PG_LEXICAL = (
    """CREATE TABLE IF NOT EXISTS lexical_docs (
        id VARCHAR(36) PRIMARY KEY REFERENCES entries (id) ON DELETE CASCADE, user_id VARCHAR NOT NULL,
        doc TSVECTOR NOT NULL, doc_len INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS ix_lexical_docs_doc ON lexical_docs USING gin (doc)",
    "CREATE INDEX IF NOT EXISTS ix_lexical_docs_user ON lexical_docs (user_id)",
    """CREATE TABLE IF NOT EXISTS lexical_users (
        user_id VARCHAR PRIMARY KEY, n_docs BIGINT NOT NULL, total_len BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS lexical_terms (
        user_id VARCHAR NOT NULL, term VARCHAR NOT NULL, df BIGINT NOT NULL, PRIMARY KEY (user_id, term))""",
    "CREATE SEQUENCE IF NOT EXISTS agentmem_changes",
)


def _baseline(conn: Connection) -> None:
    for ddl in _BASELINE:
        conn.execute(text(ddl))
    if conn.dialect.name == "sqlite":
        conn.execute(text(f"CREATE VIRTUAL TABLE IF NOT EXISTS {LEGACY_FTS} USING fts5("
                          "id UNINDEXED, user_id UNINDEXED, content, tokenize='porter unicode61')"))
    elif conn.dialect.name == "postgresql":
        for ddl in _PG_LEXICAL:
            conn.execute(text(ddl))


def _per_user_lexical(conn: Connection) -> None:
    """SQLite: split the shared FTS5 table into one per user (their own BM25 statistics), then drop it."""
    if conn.dialect.name != "sqlite":
        return
    if conn.execute(text("SELECT 1 FROM sqlite_master WHERE name = :n"), {"n": LEGACY_FTS}).first() is None:
        return
    for (user_id,) in conn.execute(text(f"SELECT DISTINCT user_id FROM {LEGACY_FTS}")).all():
        table = lexical_table(user_id)
        conn.execute(text(lexical_ddl(table)))
        conn.execute(text(f"INSERT INTO {table}(id, content) SELECT id, content FROM {LEGACY_FTS} WHERE user_id = :u"),
                     {"u": user_id})
    conn.execute(text(f"DROP TABLE {LEGACY_FTS}"))


def _write_state(conn: Connection) -> None:
    """Pending writes recorded on the row (recovery reads only these) and a change counter for caches."""
    for ddl in (
        "ALTER TABLE entries ADD COLUMN write_state VARCHAR(8)",  # NULL = committed; 'adding' / 'deleting'
        "ALTER TABLE entries ADD COLUMN write_since FLOAT",
        "ALTER TABLE entries ADD COLUMN kv_staged_at FLOAT",  # a blob write in flight for a visible row
        # partial indexes: they hold only in-flight rows, so recovery's look-up costs O(in flight), not O(store)
        "CREATE INDEX IF NOT EXISTS ix_entries_pending ON entries (write_since) WHERE write_state IS NOT NULL",
        "CREATE INDEX IF NOT EXISTS ix_entries_kv_staged ON entries (kv_staged_at) WHERE kv_staged_at IS NOT NULL",
    ):
        conn.execute(text(ddl))
    exists = conn.execute(text("""SELECT 1 FROM store_info WHERE "key" = 'changes'""")).first()
    if exists is None:
        conn.execute(text("""INSERT INTO store_info("key", value) VALUES ('changes', '0')"""))


def _lifecycle(conn: Connection) -> None:
    """Versions, statuses (superseded / deleted), seen-again counts, unindexed entries, and the history table."""
    serial = "SERIAL" if conn.dialect.name == "postgresql" else "INTEGER"
    for ddl in (
        "ALTER TABLE entries ADD COLUMN version INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE entries ADD COLUMN status VARCHAR(16) NOT NULL DEFAULT 'active'",
        "ALTER TABLE entries ADD COLUMN superseded_by VARCHAR(36)",
        "ALTER TABLE entries ADD COLUMN seen_count INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE entries ADD COLUMN last_seen_at FLOAT",
        "ALTER TABLE entries ADD COLUMN indexed BOOLEAN NOT NULL DEFAULT TRUE",
        "CREATE INDEX IF NOT EXISTS ix_entries_status ON entries (status)",
        f"""CREATE TABLE IF NOT EXISTS entry_history (
            id {serial} NOT NULL, entry_id VARCHAR(36) NOT NULL, version INTEGER NOT NULL, op VARCHAR(16) NOT NULL,
            text TEXT NOT NULL, at FLOAT NOT NULL, reason TEXT, related_id VARCHAR(36), PRIMARY KEY (id),
            FOREIGN KEY(entry_id) REFERENCES entries (id) ON DELETE CASCADE)""",
        "CREATE INDEX IF NOT EXISTS ix_entry_history_entry_id ON entry_history (entry_id)",
    ):
        conn.execute(text(ddl))


def _pg_postings(conn: Connection) -> None:
    """PostgreSQL: one posting per (user, term, entry) with its term frequency and document length, so BM25 reads
    only the query terms' postings (an index-only scan) instead of unnesting every matching document; document
    lengths become token counts, as FTS5 counts them (rebuilt here from each document's last position)."""
    if conn.dialect.name != "postgresql":
        return
    for ddl in (
        """CREATE TABLE IF NOT EXISTS lexical_postings (
            user_id VARCHAR NOT NULL, term VARCHAR NOT NULL, entry_id VARCHAR(36) NOT NULL, tf INTEGER NOT NULL,
            doc_len INTEGER NOT NULL, PRIMARY KEY (user_id, term, entry_id) INCLUDE (tf, doc_len))""",
        "CREATE INDEX IF NOT EXISTS ix_lexical_postings_entry ON lexical_postings (entry_id)",
        """UPDATE lexical_docs SET doc_len = coalesce((SELECT max(p) FROM unnest(doc) u, unnest(u.positions) p),
            doc_len)""",
        """UPDATE lexical_users us SET total_len = coalesce((SELECT sum(d.doc_len) FROM lexical_docs d
            WHERE d.user_id = us.user_id), 0)""",
        """INSERT INTO lexical_postings (user_id, term, entry_id, tf, doc_len) SELECT d.user_id, u.lexeme, d.id,
            coalesce(array_length(u.positions, 1), 1), d.doc_len FROM lexical_docs d, unnest(d.doc) u
            ON CONFLICT DO NOTHING""",
    ):
        conn.execute(text(ddl))


def _text_vectors(conn: Connection) -> None:
    """Each entry's unit text vector (float16), written by consolidation, so recall's conflict check reads it with
    the row instead of re-embedding every recalled text in each new process (NULL: not computed yet)."""
    blob = "BYTEA" if conn.dialect.name == "postgresql" else "BLOB"
    conn.execute(text(f"ALTER TABLE entries ADD COLUMN text_vector {blob}"))


def _sentence_vectors(conn: Connection) -> None:
    """The unit vectors of the stated sentences of an entry of several sentences (float16), written with the row, so
    recall's conflict check can weigh a newer memory against the one sentence of an older message it contradicts
    without embedding them on every recall (NULL: one sentence, or not computed yet: embedded when needed)."""
    blob = "BYTEA" if conn.dialect.name == "postgresql" else "BLOB"
    conn.execute(text(f"ALTER TABLE entries ADD COLUMN sentence_vectors {blob}"))


def _lexical_bounds(conn: Connection) -> None:
    """BM25 bounds for early termination (agentmem.backends.lexical_bounds). SQLite: a ``lexical_bounds`` table (per
    FTS5 table: shortest document, most tokens per prefix in one document), filled from every stored document.
    PostgreSQL: each term's largest term frequency and each user's shortest document, from the postings."""
    if conn.dialect.name == "sqlite":
        conn.execute(text(BOUNDS_DDL))
        tables = [r[0] for r in conn.execute(text(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%' "
            "AND name LIKE :p"), {"p": LEXICAL_PREFIX + "%"})]
        for table in tables:
            result = conn.execute(text(f"SELECT content FROM {table}"))
            while batch := [r[0] for r in result.fetchmany(5000) if r[0] is not None]:
                record_bounds(conn, table, batch)
    elif conn.dialect.name == "postgresql":
        for ddl in (
            "ALTER TABLE lexical_terms ADD COLUMN max_tf INTEGER",
            "ALTER TABLE lexical_users ADD COLUMN min_len INTEGER",
            """UPDATE lexical_terms lt SET max_tf = m.tf FROM (SELECT user_id, term, max(tf) AS tf
                FROM lexical_postings GROUP BY user_id, term) m WHERE m.user_id = lt.user_id AND m.term = lt.term""",
            """UPDATE lexical_users us SET min_len = m.len FROM (SELECT user_id, min(doc_len) AS len
                FROM lexical_docs GROUP BY user_id) m WHERE m.user_id = us.user_id""",
            # the early answer finds documents through the GIN index, and every search scans GIN's pending list
            # (up to 4 MB by default: 24 ms at 100,000 documents against 0.5 ms flushed); keep it short
            "ALTER INDEX ix_lexical_docs_doc SET (gin_pending_list_limit = 256)",
            "SELECT gin_clean_pending_list('ix_lexical_docs_doc')",
        ):
            conn.execute(text(ddl))


def _turn_order(conn: Connection) -> None:
    """A partial covering index for recall's conversation placement (``Catalog.turn_context``): the committed
    turns of a session in time order, with their ids, so each look-up of the turns before / after a candidate reads
    the index alone (no table row per neighbour, no rows of other kinds skipped). ``kind`` and ``write_state`` are
    constant in it, yet listed: SQLite (3.40) reads the table for any column the query names that the index lacks,
    even one that only the index's WHERE tests. One statement for SQLite and PostgreSQL. Measured on
    recall_latency.py's 10,000-entry store: ~2.1 -> ~1.3 ms per 130 placed ids (with only the three leading
    columns: ~1.6 ms)."""
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_entries_session_turns ON entries "
                      "(session_id, created_at, id, kind, write_state) WHERE kind = 'turn' AND write_state IS NULL"))


def _turn_order_by_user(conn: Connection) -> None:
    """Schema 8's index with ``user_id`` after ``session_id``: a turn's neighbours are the same user's turns of the
    session (``Catalog.turn_context``; two users may use the same session id), and the index still answers alone.
    Measured on recall_latency.py's 10,000-entry store, 130 placed ids, load ~10: 1.0-1.07 ms without the user
    test, 1.59-1.72 ms with it on schema 8's index, 1.10-1.24 ms with it on this one."""
    conn.execute(text("DROP INDEX IF EXISTS ix_entries_session_turns"))
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_entries_session_user_turns ON entries "
                      "(session_id, user_id, created_at, id, kind, write_state) "
                      "WHERE kind = 'turn' AND write_state IS NULL"))


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "baseline: entries, tags, store info (and SQLite's shared FTS5 index)", _baseline),
    Migration(2, "SQLite: one FTS5 table per user", _per_user_lexical),
    Migration(3, "write state on rows (pending adds/deletes, staged blobs) and a change counter", _write_state),
    Migration(4, "lifecycle: versions, superseded / merged entries, unindexed entries, entry history", _lifecycle),
    Migration(5, "PostgreSQL: BM25 postings (user, term, entry) with tf and token-count lengths", _pg_postings),
    Migration(6, "text vectors on rows (float16, for consolidation's conflict check)", _text_vectors),
    Migration(7, "BM25 bounds for early termination of lexical top-k (SQLite and PostgreSQL)", _lexical_bounds),
    Migration(8, "a partial covering index of committed turns by (session, time, id) for conversation placement",
              _turn_order),
    Migration(9, "the turn-order index keyed by (session, user, time): a turn's neighbours are its own user's",
              _turn_order_by_user),
    Migration(10, "sentence vectors on rows (float16, for the conflict check of a memory of several sentences)",
              _sentence_vectors),
)
SCHEMA_VERSION = latest_version(MIGRATIONS)

__all__ = ["LEGACY_FTS", "MIGRATIONS", "SCHEMA_VERSION"]
