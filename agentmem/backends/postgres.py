"""PostgreSQL catalog through SQLAlchemy 2.0 (psycopg 3): the same ORM rows as the SQLite catalog, PostgreSQL's
full-text search for the lexical index, scored with BM25 from per-user statistics.

Lexical scoring: every entry's document is a ``tsvector`` (``english`` configuration: stemming and stop words, like
SQLite's porter tokenizer); ``lexical_users`` (documents, total length) and ``lexical_terms`` (document frequency
of each term) are kept per user in the writing transaction, so a term's rarity is the user's own, as with the
per-user FTS5 tables. A query matches through the GIN index and is scored with Okapi BM25 (k1 = 1.2, b = 0.75, the
FTS5 defaults). Statistic rows are updated in sorted order, so concurrent writers cannot deadlock on them.

Several processes and hosts may share one database: there is no process-local state to go stale, writes are
visible to every reader once committed, and migrations take an advisory lock.

Example:
    >>> cat = PostgresCatalog(postgres_url)  # postgresql+psycopg://postgres@127.0.0.1:5432/agentmem, say
    >>> texts = {"a1": "I bought a red kayak.", "a2": "The car is blue."}
    >>> cat.insert([EntryRecord(id=i, user_id="alice", kind="fact", text=t, memory_text=t, created_at=0.0)
    ...             for i, t in texts.items()], index_texts=list(texts.values()))
    >>> [i for i, _ in cat.lexical_search("red kayaks", user_id="alice", limit=5)]  # stemmed: kayaks matches kayak
    ['a1']
    >>> cat.lexical_search("red kayaks", user_id="bob", limit=5)  # another user's entries are not searched
    []
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, create_engine, delete, select, text
from sqlalchemy.orm import Session, sessionmaker

from agentmem.backends.sqlite.catalog import SqliteCatalog, chunks, add_rows, fts_query
from agentmem.backends.sqlite.api_keys import SqlApiKeyRecords
from agentmem.backends.sqlite.history import erase_lifecycle, history_rows
from agentmem.backends.sqlite.rows import EntryRow, TagRow
from agentmem.backends.sqlite.entry_records import record_of
from agentmem.ports.catalog import EntryRecord, HistoryEvent, TurnContext
from agentmem.backends.lexical_bounds import B as _B, K1 as _K1, can_stop, term_bound, token_count

_TS_CONFIG = "english"
_ADVISORY_KEY = 0x616D656D  # "amem": serialises migrations across processes and hosts
# The query's distinct lexemes, each with the user's document frequency (NULL: unseen), and the user's totals.
_TERM_STATS = text(
    "SELECT t.term, lt.df, us.n_docs, us.total_len, lt.max_tf, us.min_len FROM lexical_users us "
    "LEFT JOIN (SELECT DISTINCT unnest(tsvector_to_array(to_tsvector(CAST(:cfg AS regconfig), :q))) AS term) t ON TRUE "
    "LEFT JOIN lexical_terms lt ON lt.user_id = us.user_id AND lt.term = t.term WHERE us.user_id = :u")
# Okapi BM25 from the postings of the query's terms (an index-only scan of (user, term) with tf and length
# included), best first; ties by id like the SQLite catalog. Unnesting each matching tsvector instead cost 300 ms
# at 100,000 entries, where a common term matches thousands of documents.
_BM25 = text(
    "SELECT p.entry_id, sum(w.idf * p.tf * (:k1 + 1) / (p.tf + :k1 * (1 - :b + :b * p.doc_len / :avg))) AS s "
    "FROM lexical_postings p JOIN unnest(CAST(:terms AS varchar[]), CAST(:idf AS float8[])) AS w(term, idf) "
    " ON p.term = w.term "
    "WHERE p.user_id = :u AND p.term = ANY(CAST(:terms AS varchar[])) GROUP BY p.entry_id "
    "ORDER BY s DESC, p.entry_id LIMIT :n")
# The same, over only the documents holding every query term (found through the GIN index, each scored from its
# own postings by primary key): the early answer of agentmem.backends.lexical_bounds. A join let the planner hash every
# posting of the terms (thousands) to keep a few hundred; the correlated sum reads only those documents' postings.
_BM25_ALL_TERMS = text(
    "SELECT c.id, (SELECT sum(w.idf * p.tf * (:k1 + 1) / (p.tf + :k1 * (1 - :b + :b * p.doc_len / :avg))) "
    " FROM lexical_postings p JOIN unnest(CAST(:terms AS varchar[]), CAST(:idf AS float8[])) AS w(term, idf) "
    " ON p.term = w.term WHERE p.user_id = :u AND p.entry_id = c.id AND p.term = ANY(CAST(:terms AS varchar[]))) AS s "
    "FROM (SELECT d.id FROM lexical_docs d WHERE d.user_id = :u AND d.doc @@ CAST(:all AS tsquery)) c "
    "ORDER BY s DESC, c.id LIMIT :n")
# A document per entry (stemmed, stop words out) with its length in tokens, as FTS5 counts it; then its postings.
_INDEX_DOCS = text(
    "INSERT INTO lexical_docs (id, user_id, doc, doc_len) SELECT x.id, x.u, to_tsvector(CAST(:cfg AS regconfig), x.t), "
    "x.n FROM unnest(CAST(:ids AS varchar[]), CAST(:us AS varchar[]), CAST(:ts AS text[]), CAST(:lens AS int[])) "
    "AS x(id, u, t, n) RETURNING user_id, tsvector_to_array(doc), doc_len")
_INDEX_POSTINGS = text(
    "INSERT INTO lexical_postings (user_id, term, entry_id, tf, doc_len) SELECT d.user_id, u.lexeme, d.id, "
    "coalesce(array_length(u.positions, 1), 1), d.doc_len FROM lexical_docs d, unnest(d.doc) u "
    "WHERE d.id = ANY(CAST(:ids AS varchar[])) RETURNING user_id, term, tf")


class PostgresCatalog(SqliteCatalog):
    """The catalog in PostgreSQL (``postgresql+psycopg://user@host:port/db``)."""

    def __init__(self, url: str, *, pool_size: int = 5) -> None:  # noqa: D107 - see class docstring
        self.url = url
        self.engine = create_engine(url, pool_pre_ping=True, pool_size=pool_size, max_overflow=pool_size)
        self._write_lock = contextlib.nullcontext()  # the database serialises writers itself
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # Reads of one statement each (a recall makes ~8) on their own autocommit pool: no BEGIN / ROLLBACK
        # around each, which were 16 of a recall's 34 round trips. Each statement sees its own snapshot, as under
        # READ COMMITTED inside a transaction; writes keep the transactional engine above.
        self.read_engine = create_engine(url, pool_pre_ping=True, pool_size=pool_size, max_overflow=pool_size,
                                         isolation_level="AUTOCOMMIT")
        self._reads = sessionmaker(self.read_engine, expire_on_commit=False)
        self._lexical_tables = set()
        self.early_stops = 0  # lexical searches answered by the documents holding every term
        from agentmem.backends.migrations import apply_migrations
        from agentmem.backends.sqlite.schema import MIGRATIONS

        with self.engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_KEY})
            apply_migrations(conn, MIGRATIONS)

    def _bump(self, s: Session) -> None:
        s.execute(text("SELECT nextval('agentmem_changes')"))  # a sequence: writers never wait on one hot row

    def change_token(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(text("SELECT last_value + CAST(is_called AS INTEGER) FROM agentmem_changes")).scalar_one())

    # --- writes --------------------------------------------------------------------------------
    def insert(self, records: Sequence[EntryRecord], *, index_texts: Sequence[str | None], pending: bool = False,
               extra: Callable[[Session], None] | None = None, history: Sequence[HistoryEvent] = ()) -> None:
        """Insert rows, tags, lexical documents (None: not indexed), statistics and history events in one
        transaction; ``extra`` runs inside it too (pgvector adds the vectors there, so row and vector commit together)."""
        with self._sessions.begin() as s:
            add_rows(s, records, pending=pending)
            s.add_all(history_rows(history))
            indexed = [(r, t) for r, t in zip(records, index_texts) if t is not None]
            self._index(s, [r.id for r, _ in indexed], [r.user_id for r, _ in indexed], [t for _, t in indexed])
            if extra is not None:
                extra(s)
            self._bump(s)

    def _index(self, s: Session, ids: Sequence[str], users: Sequence[str], texts: Sequence[str]) -> None:
        """Lexical documents, their postings and their share of the statistics, inside transaction ``s``."""
        if not ids:
            return
        docs = s.execute(_INDEX_DOCS, {"cfg": _TS_CONFIG, "ids": list(ids), "us": list(users), "ts": list(texts),
                                       "lens": [token_count(t) for t in texts]}).all()
        most: dict[tuple[str, str], int] = {}  # (user, term) -> largest tf written now (a BM25 bound)
        for user, term, tf in s.execute(_INDEX_POSTINGS, {"ids": list(ids)}):
            most[user, term] = max(most.get((user, term), 0), int(tf))
        self._count_terms(s, _stats_of(docs), +1, most_tf=most)

    def _unindex(self, s: Session, ids: Sequence[str]) -> None:
        """Remove entries' lexical documents, postings and statistics, inside transaction ``s``."""
        s.execute(text("DELETE FROM lexical_postings WHERE entry_id IN :ids")
                  .bindparams(bindparam("ids", expanding=True)), {"ids": list(ids)})
        gone = s.execute(text("DELETE FROM lexical_docs WHERE id IN :ids RETURNING user_id, tsvector_to_array(doc), "
                              "doc_len").bindparams(bindparam("ids", expanding=True)), {"ids": list(ids)}).all()
        self._count_terms(s, _stats_of(gone), -1)

    def replace_lexical(self, s: Session, user_id: str, entry_id: str, content: str | None) -> None:
        """Inside transaction ``s``: replace an entry's lexical document (``None``: drop it)."""
        self._unindex(s, [entry_id])
        if content is not None:
            self._index(s, [entry_id], [user_id], [content])

    @staticmethod
    def _count_terms(s: Session, stats: dict[str, tuple[int, int, dict[str, int], int | None]], sign: int, *,
                     most_tf: dict[tuple[str, str], int] | None = None) -> None:
        """Add (or remove) documents to each user's BM25 statistics, in sorted key order (no deadlocks).

        Adding also loosens the bounds of early termination (a term's largest tf, the user's shortest document);
        removing leaves them, since a looser bound is still a bound."""
        most_tf = most_tf or {}
        for user in sorted(stats):
            n_docs, total_len, terms, min_len = stats[user]
            s.execute(text(
                "INSERT INTO lexical_users (user_id, n_docs, total_len, min_len) VALUES (:u, :n, :l, :m) "
                "ON CONFLICT (user_id) DO UPDATE SET n_docs = lexical_users.n_docs + :n, "
                "total_len = lexical_users.total_len + :l, min_len = least(lexical_users.min_len, EXCLUDED.min_len)"),
                {"u": user, "n": sign * n_docs, "l": sign * total_len, "m": min_len if sign > 0 else None})
            if terms:
                s.execute(text(
                    "INSERT INTO lexical_terms (user_id, term, df, max_tf) VALUES (:u, :t, :d, :x) "
                    "ON CONFLICT (user_id, term) DO UPDATE SET df = lexical_terms.df + :d, "
                    "max_tf = greatest(lexical_terms.max_tf, EXCLUDED.max_tf)"),
                    [{"u": user, "t": t, "d": sign * terms[t], "x": most_tf.get((user, t)) if sign > 0 else None}
                     for t in sorted(terms)])
            if sign < 0:
                s.execute(text("DELETE FROM lexical_terms WHERE user_id = :u AND df <= 0"), {"u": user})
                s.execute(text("DELETE FROM lexical_users WHERE user_id = :u AND n_docs <= 0"), {"u": user})

    def delete(self, ids: Sequence[str]) -> list[EntryRecord]:
        """Delete rows, tags, lexical documents (and their share of the statistics); returns what was deleted."""
        if not ids:
            return []
        out: list[EntryRecord] = []
        with self._sessions.begin() as s:
            for chunk in chunks(list(ids), 500):
                rows = [record_of(r) for r in s.scalars(select(EntryRow).where(EntryRow.id.in_(chunk)))]
                if not rows:
                    continue
                found = [r.id for r in rows]
                self._unindex(s, found)
                s.execute(delete(TagRow).where(TagRow.entry_id.in_(found)))
                erase_lifecycle(s, found)
                s.execute(delete(EntryRow).where(EntryRow.id.in_(found)))
                out += rows
            if out:
                self._bump(s)
        return out

    # --- reads ---------------------------------------------------------------------------------
    def lexical_tables(self) -> list[str]:
        return ["lexical_docs", "lexical_postings", "lexical_terms", "lexical_users"]

    def lexical_search(self, query: str, *, user_id: str, limit: int,
                       blind: Callable[[str], str] | None = None) -> list[tuple[str, float]]:
        """Okapi BM25 over ``user_id``'s documents: [(id, score)], best first, score > 0.

        At scale the documents holding every query term are scored first; when they fill ``limit`` and no
        document missing a term can beat the last of them (:mod:`agentmem.backends.lexical_bounds`: each term's
        largest tf and the user's shortest document bound its share), that is the answer. Otherwise every
        posting of the query terms is scored. Same scores either way; only ties at the cut may differ.
        """
        match = fts_query(query, blind=blind)
        if match is None:
            return []
        words = [w.strip('"') for w in match.split(" OR ")]
        with self.read_engine.connect() as conn:
            # one round trip: the query's lexemes with the user's document frequency, and the user's totals
            stats = conn.execute(_TERM_STATS, {"cfg": _TS_CONFIG, "q": " ".join(words), "u": user_id}).all()
            if not stats or not stats[0][2]:
                return []
            n_docs, avg_len = int(stats[0][2]), max(float(stats[0][3]) / float(stats[0][2]), 1.0)
            # FTS5's idf (floored at 1e-6 for terms in over half the documents), so both catalogs rank alike
            held = {t: (df, max_tf) for t, df, _, _, max_tf, _ in stats if t is not None and df}
            idf = {t: max(math.log((n_docs - df + 0.5) / (df + 0.5)), 1e-6) for t, (df, _) in held.items()}
            if not idf:
                return []
            terms = sorted(idf)
            params = {"u": user_id, "terms": terms, "idf": [idf[t] for t in terms], "avg": avg_len, "k1": _K1,
                      "b": _B, "n": int(limit)}
            min_len = stats[0][5]
            if len(terms) >= 2 and n_docs >= self.prune_min_docs and min_len is not None \
                    and all(held[t][1] for t in terms):
                params["all"] = " & ".join(_tsquery_lexeme(t) for t in terms)
                rows = conn.execute(_BM25_ALL_TERMS, params).all()
                bounds = [term_bound(idf[t], max_tf=held[t][1], min_len=int(min_len), avg_len=avg_len) for t in terms]
                if len(rows) >= limit and can_stop(theta=float(rows[-1][1]), bounds=bounds):
                    self.early_stops += 1
                    return [(i, float(sc)) for i, sc in rows if sc > 0]
            # scored and cut to ``limit`` in the server: only the best rows cross the wire (at 100,000 entries a
            # common term matches thousands of documents, and shipping them to Python cost more than the search)
            rows = conn.execute(_BM25, params).all()
        return [(i, float(sc)) for i, sc in rows if sc > 0]

    def turn_context(self, ids: Sequence[str], *, window: int = 2, committed: bool = True) -> dict[str, TurnContext]:
        """Session and nearest turns of the same user and session before / after each entry (the port's
        ``turn_context``; indexed on (session_id, user_id, created_at))."""
        if not ids:
            return {}
        w = int(window)
        sql = text(
            "SELECT e.id, e.session_id, (e.kind = 'turn' AND e.session_id IS NOT NULL), "
            f"(SELECT string_agg(p.id, ' ' ORDER BY p.created_at DESC) FROM (SELECT id, created_at FROM entries p "
            f" WHERE p.session_id = e.session_id AND p.user_id = e.user_id AND p.kind = 'turn' AND p.write_state IS NULL "
            f" AND p.created_at < e.created_at ORDER BY p.created_at DESC LIMIT {w}) p), "
            f"(SELECT string_agg(n.id, ' ' ORDER BY n.created_at ASC) FROM (SELECT id, created_at FROM entries n "
            f" WHERE n.session_id = e.session_id AND n.user_id = e.user_id AND n.kind = 'turn' AND n.write_state IS NULL "
            f" AND n.created_at > e.created_at ORDER BY n.created_at ASC LIMIT {w}) n) "
            # ``= ANY(array)``: one statement text whatever the number of ids, so psycopg keeps it parsed and, after
            # a few runs, prepared on the server (``IN`` expanded to one bind per id was a new statement each time)
            f"FROM entries e WHERE {'e.write_state IS NULL AND ' if committed else ''}e.id = ANY(CAST(:ids AS varchar[]))")
        out: dict[str, TurnContext] = {}
        with self.read_engine.connect() as conn:
            for chunk in chunks(list(ids), 500):
                for entry_id, session_id, is_turn, prev, nxt in conn.execute(sql, {"ids": chunk}).all():
                    out[entry_id] = TurnContext(session_id, tuple(prev.split()) if is_turn and prev else (),
                                                tuple(nxt.split()) if is_turn and nxt else (), bool(is_turn))
        return out

    def scrub(self, user_ids: Iterable[str] | None = None, *, vacuum: bool = False) -> None:
        """With ``vacuum``: VACUUM the tables an erasure touched, so deleted tuples' space is reclaimed and reused
        (PostgreSQL does not zero freed space: see docs/backends.md). Without it there is nothing to push out."""
        if not vacuum:
            return
        tables = ["entries", "entry_tags", "lexical_docs", "lexical_postings", "lexical_terms"]
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            tables += [t for t in ("vectors", "vectors_context") if _has_table(conn, t)]  # every vector space
            conn.execute(text("VACUUM " + ", ".join(tables)))


def _stats_of(docs: Iterable[Any]) -> dict[str, tuple[int, int, dict[str, int], int | None]]:
    """Per user: documents, total length, document frequency of each term and the shortest length, from
    (user, lexemes, length)."""
    out: dict[str, tuple[int, int, dict[str, int], int | None]] = {}
    for user, lexemes, length in docs:
        n, total, terms, shortest = out.get(user, (0, 0, {}, None))
        for t in set(lexemes or ()):
            terms[t] = terms.get(t, 0) + 1
        length = int(length or 0)
        out[user] = (n + 1, total + length, terms, length if shortest is None else min(shortest, length))
    return out


def _tsquery_lexeme(term: str) -> str:
    """``term`` as one quoted lexeme of tsquery's input syntax (taken as is: no parsing, no stemming).

    Example:
        >>> _tsquery_lexeme("don't")
        "'don''t'"
    """
    return "'" + term.replace("\\", "\\\\").replace("'", "''") + "'"


def _has_table(conn: Any, table: str) -> bool:
    return bool(conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": table}).scalar())


def _psycopg_url(url: str | None) -> str:
    if url is not None and url.startswith(("postgresql://", "postgres://")):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return url or ""


def build_catalog(url: str | None, ctx: Any) -> PostgresCatalog:
    """Factory builder for ``postgresql://`` / ``postgresql+psycopg://`` catalog URLs."""
    return PostgresCatalog(_psycopg_url(url))


def build_api_keys(url: str | None, _ctx: Any) -> SqlApiKeyRecords:
    """Factory builder for a ``postgresql://`` API-key store, which several servers share (the catalog's database
    may be named: the ``api_keys`` table is the server's own, beside the catalog's tables)."""
    return SqlApiKeyRecords(_psycopg_url(url), pool_pre_ping=True)


__all__ = ["PostgresCatalog", "build_api_keys", "build_catalog"]
