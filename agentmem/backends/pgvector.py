"""pgvector: entry vectors in the catalog's own PostgreSQL database (``vector_url="pgvector"``).

One ``vectors`` table (id, user, scoping fields, ``vector(dim)``) with an HNSW index for cosine distance, created on
the first write once the dimension is known; the same again per further space (``vectors_context``: turn context
vectors, see :mod:`agentmem.ports.vectors`). Because it shares the catalog's engine, :meth:`PgVectorIndex.add_in`
writes the vectors inside the catalog's insert transaction: row and vector commit together or not at all.
Queries filter by user in SQL; pgvector's iterative index scan (0.8+) keeps filtered searches from coming back
short, and a search that still comes back short (a user with a small share of the table, or pgvector < 0.8) is
re-run exactly over that user's rows through the user index.

Example:
    >>> from agentmem.backends.postgres import PostgresCatalog
    >>> index = PgVectorIndex(PostgresCatalog(postgres_url).engine)  # postgresql+psycopg://postgres@host:5432/db
    >>> index.add(["u", "u"], ["e1", "e2"], np.eye(2, 4, dtype=np.float32), [{"kind": "turn"}] * 2)
    >>> [(i, round(s, 3)) for i, s in index.query(np.eye(4, dtype=np.float32)[0], user_id="u", n=5)]
    [('e1', 1.0), ('e2', 0.0)]
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg
from sqlalchemy import bindparam, text
from sqlalchemy.engine import Connection, Engine

from agentmem.errors import InvalidInputError
from agentmem.ports.vectors import SPACES, check_space, query_each_space

_FIELDS = {"kind", "session_id"}
_ADVISORY_KEY = 0x616D7663  # "amvc": one creator of the table and its index


def _literal(vec: np.ndarray) -> str:
    # tolist(): Python floats in one C call (per-element numpy scalars cost a third of a bulk write); exact for float32
    return "[" + ",".join(map(repr, np.asarray(vec, dtype=np.float32).ravel().tolist())) + "]"


def table_of(space: str = "") -> str:
    """The table holding ``space``'s vectors.

    Example:
        >>> table_of(""), table_of("context")
        ('vectors', 'vectors_context')
    """
    return "vectors" + (f"_{check_space(space)}" if space else "")


def where_sql(where: dict[str, Any] | None, params: dict[str, Any]) -> str:
    """Chroma's ``where`` dialect (``$eq``, ``$in``, ``$and`` on kind / session_id) as SQL; binds go in ``params``.

    Example:
        >>> p = {}; where_sql({"$and": [{"kind": {"$in": ["turn"]}}, {"session_id": "s"}]}, p), sorted(p)
        ('(kind = ANY(:w0) AND session_id = :w1)', ['w0', 'w1'])
    """
    if not where:
        return "TRUE"
    if "$and" in where:
        return "(" + " AND ".join(where_sql(c, params) for c in where["$and"]) + ")"
    (field, cond), = where.items()
    if field not in _FIELDS:
        raise InvalidInputError(f"vector filter: unknown field {field!r}")
    name = f"w{len(params)}"
    if isinstance(cond, dict):
        (op, value), = cond.items()
        if op == "$in":
            params[name] = list(value)
            return f"{field} = ANY(:{name})"
        if op != "$eq":
            raise InvalidInputError(f"vector filter: unsupported operator {op!r}")
        cond = value
    params[name] = cond
    return f"{field} = :{name}"


class PgVectorIndex:
    """Vectors in PostgreSQL with pgvector, sharing ``engine`` (normally the catalog's)."""

    def __init__(self, engine: Engine, *, catalog: Any = None, keep_documents: bool = False,
                 read_engine: Engine | None = None) -> None:
        self.engine = engine
        self.read_engine = engine if read_engine is None else read_engine  # searches (the catalog's autocommit pool)
        self.catalog = catalog  # set: add_in() may run inside this catalog's transactions
        self.keep_documents = keep_documents
        self._ready: set[str] = set()  # tables known to exist
        self._iterative: bool | None = None  # pgvector 0.8+ iterative index scans (None: not asked yet)

    # --- schema ----------------------------------------------------------------------------------
    def _exists(self, conn: Connection, table: str = "vectors") -> bool:
        if table not in self._ready and conn.execute(text(f"SELECT to_regclass('{table}') IS NOT NULL")).scalar():
            self._ready.add(table)
        return table in self._ready

    def _ensure(self, conn: Connection, dim: int, table: str = "vectors") -> None:
        if self._exists(conn, table):
            return
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_KEY})
        conn.execute(text("CREATE EXTENSION IF NOT EXISTS vector"))
        conn.execute(text(
            f"CREATE TABLE IF NOT EXISTS {table} (id VARCHAR(36) PRIMARY KEY, user_id VARCHAR NOT NULL, "
            f"kind VARCHAR(16), session_id VARCHAR, document TEXT, embedding vector({int(dim)}) NOT NULL)"))
        conn.execute(text(f"CREATE INDEX IF NOT EXISTS ix_{table}_user ON {table} (user_id)"))
        conn.execute(text(f"CREATE INDEX IF NOT EXISTS ix_{table}_hnsw ON {table} USING hnsw (embedding vector_cosine_ops)"))
        self._ready.add(table)

    def _tables(self, conn: Connection) -> list[str]:
        """The tables of every space that exist."""
        return [t for t in map(table_of, SPACES) if self._exists(conn, t)]

    # --- writes --------------------------------------------------------------------------------
    def add_in(self, conn: Any, user_ids: Sequence[str], ids: Sequence[str], vectors: np.ndarray,
               metadatas: Sequence[dict[str, Any]], documents: Sequence[str] | None = None, *,
               space: str = "") -> None:
        """Upsert inside the caller's transaction (a SQLAlchemy connection or ORM session)."""
        if not len(ids):
            return
        table = table_of(space)
        self._ensure(conn, int(vectors.shape[1]), table)
        conn.execute(text(
            f"INSERT INTO {table} (id, user_id, kind, session_id, document, embedding) "
            "VALUES (:id, :u, :k, :s, :d, CAST(:e AS vector)) ON CONFLICT (id) DO UPDATE SET user_id = EXCLUDED.user_id, "
            "kind = EXCLUDED.kind, session_id = EXCLUDED.session_id, document = EXCLUDED.document, "
            "embedding = EXCLUDED.embedding"),
            [{"id": i, "u": u, "k": m.get("kind"), "s": m.get("session_id"), "e": _literal(v),
              "d": documents[n] if documents is not None and self.keep_documents else None}
             for n, (i, u, v, m) in enumerate(zip(ids, user_ids, vectors, metadatas))])

    def add(self, user_ids: Sequence[str], ids: Sequence[str], vectors: np.ndarray,
            metadatas: Sequence[dict[str, Any]], documents: Sequence[str] | None = None, *, space: str = "") -> None:
        with self.engine.begin() as conn:
            self.add_in(conn, user_ids, ids, vectors, metadatas, documents, space=space)

    def get(self, user_id: str, ids: Sequence[str], *, space: str = "") -> dict[str, np.ndarray]:
        """The stored vectors of ``ids`` in ``user_id``'s ``space`` (missing ids are left out)."""
        table = table_of(space)
        with self.read_engine.connect() as conn:
            if not ids or not self._exists(conn, table):
                return {}
            rows = conn.execute(text(f"SELECT id, embedding::text FROM {table} WHERE user_id = :u AND id = ANY(:ids)"),
                                {"u": user_id, "ids": list(ids)}).all()
        return {i: np.asarray(json.loads(v), dtype=np.float32) for i, v in rows}

    def delete(self, ids: Sequence[str], *, user_id: str | None = None) -> None:
        if not ids:
            return
        with self.engine.begin() as conn:
            scope = "" if user_id is None else " AND user_id = :u"
            for table in self._tables(conn):  # an entry's vectors in every space
                for i in range(0, len(ids), 1000):
                    conn.execute(text(f"DELETE FROM {table} WHERE id IN :ids{scope}")
                                 .bindparams(bindparam("ids", expanding=True)),
                                 {"ids": list(ids[i:i + 1000]), "u": user_id})

    # --- reads ---------------------------------------------------------------------------------
    def query(self, vector: np.ndarray, *, user_id: str, n: int, where: dict[str, Any] | None = None,
              ids: Sequence[str] | None = None, space: str = "") -> list[tuple[str, float]]:
        params: dict[str, Any] = {"u": user_id, "v": _literal(vector), "n": int(n)}
        clause = where_sql(where, params)
        if ids is not None:
            params["ids"] = list(ids)
            clause += " AND id = ANY(:ids)"
        table = table_of(space)
        select = f"SELECT id, 1 - (embedding <=> CAST(:v AS vector)) FROM {table} WHERE user_id = :u AND {clause} "
        with self.read_engine.connect() as conn:
            self._scan_settings(conn, max(40, min(int(n), 1000)))  # first: before any statement of this connection
            if not self._exists(conn, table):
                return []
            rows = conn.execute(text(select + "ORDER BY embedding <=> CAST(:v AS vector) LIMIT :n"), params).all()
            if len(rows) < n:
                # An HNSW scan filters its candidates after the fact: a user holding a small share of the table
                # (1,000 of 1,000,000 rows) gets fewer than n back, often none, where pgvector < 0.8 cannot iterate.
                # Short means that user's rows are few or scattered: rank them exactly (``+ 0`` keeps the planner
                # off the HNSW index; the user index finds the rows).
                rows = conn.execute(text(select + "ORDER BY (embedding <=> CAST(:v AS vector)) + 0 LIMIT :n"),
                                    params).all()
        # relaxed order: re-sort exactly (the scan may hand rows back slightly out of order)
        return sorted(((i, float(s)) for i, s in rows), key=lambda kv: -kv[1])

    def query_spaces(self, vector: np.ndarray, *, user_id: str, n: int | Sequence[int], spaces: Sequence[str],
                     where: dict[str, Any] | None = None,
                     ids: Sequence[str] | None = None) -> list[list[tuple[str, float]]]:
        """:meth:`query` in each of ``spaces`` (results in their order), one search after the other.

        Example:
            >>> from agentmem.backends.postgres import PostgresCatalog
            >>> index = PgVectorIndex(PostgresCatalog(postgres_url).engine)
            >>> turns = np.eye(2, 4, dtype=np.float32)  # e1 and e2, the context space holding e2's only
            >>> index.add(["u1", "u1"], ["e1", "e2"], turns, [{"kind": "turn"}] * 2)
            >>> index.add(["u1"], ["e2"], turns[:1], [{"kind": "turn"}], space="context")
            >>> dense, context = index.query_spaces(turns[0], user_id="u1", n=(1, 5), spaces=("", "context"))
            >>> dense, [(i, round(c, 3)) for i, c in context]
            ([('e1', 1.0)], [('e2', 1.0)])
        """
        return query_each_space(self, vector, user_id=user_id, n=n, spaces=spaces, where=where, ids=ids)

    def _scan_settings(self, conn: Connection, ef_search: int) -> None:
        """The connection's HNSW scan settings, set once per pooled connection and again only when they change.

        Session-level ``SET``s, remembered in the pool's record of the connection (``conn.info``), instead of a
        ``SET LOCAL`` (and a savepoint to probe ``hnsw.iterative_scan``) inside every query's transaction: those
        were 4 of a vector query's 6 round trips. ``SET`` outside a transaction block is final (autocommit: a later
        rollback of the caller's work does not undo it); only HNSW scans read these settings.
        """
        info = conn.info
        if info.get("hnsw.ef_search") == ef_search and "hnsw.iterative_scan" in info:
            return
        # called before the connection's first statement: idle, so autocommit may be switched on for the SETs
        raw = conn.connection.dbapi_connection
        saved = raw.autocommit
        raw.autocommit = True
        try:
            if "hnsw.iterative_scan" not in info:
                if self._iterative is not False:
                    try:
                        raw.execute("SET hnsw.iterative_scan = relaxed_order")
                        self._iterative = True
                    except psycopg.Error:  # pgvector < 0.8 has no such setting: asked once per process
                        self._iterative = False
                info["hnsw.iterative_scan"] = self._iterative
            raw.execute(f"SET hnsw.ef_search = {int(ef_search)}")
            info["hnsw.ef_search"] = ef_search
        finally:
            raw.autocommit = saved

    def _ids(self, tables: Sequence[str], where: str, params: dict[str, Any]) -> list[str]:
        with self.engine.connect() as conn:
            return [r[0] for t in tables if self._exists(conn, t)
                    for r in conn.execute(text(f"SELECT id FROM {t}{where}"), params)]

    def user_ids(self, user_id: str, *, space: str = "") -> list[str]:
        return self._ids([table_of(space)], " WHERE user_id = :u", {"u": user_id})

    def has_any(self, user_id: str, *, space: str = "") -> bool:
        """Whether ``user_id`` holds a vector in ``space`` (the user index finds one row: O(1)).

        Example:
            >>> from agentmem.backends.postgres import PostgresCatalog
            >>> index = PgVectorIndex(PostgresCatalog(postgres_url).engine)
            >>> index.add(["u2"], ["e3"], np.ones((1, 4), np.float32), [{"kind": "turn"}])
            >>> index.has_any("u2"), index.has_any("u2", space="context"), index.has_any("nobody")
            (True, False, False)
        """
        table = table_of(space)
        with self.engine.connect() as conn:
            return self._exists(conn, table) and conn.execute(
                text(f"SELECT 1 FROM {table} WHERE user_id = :u LIMIT 1"), {"u": user_id}).first() is not None

    def all_ids(self) -> list[str]:
        return self._ids([table_of(s) for s in SPACES], "", {})

    def count(self) -> int:
        with self.engine.connect() as conn:
            return sum(int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in self._tables(conn))

    def erase_residue(self, user_ids: Sequence[str]) -> None:
        """Nothing beyond the delete: the catalog's ``scrub(vacuum=True)`` VACUUMs the ``vectors`` table too."""

    def close(self) -> None:
        """The engine belongs to the catalog (or the caller): nothing to release here."""


def build_vectors(url: str | None, ctx: Any) -> PgVectorIndex:
    """Factory builder for ``vector_url="pgvector"``: the catalog's database (the catalog must be PostgreSQL)."""
    from agentmem.backends.postgres import PostgresCatalog

    if not isinstance(ctx.catalog, PostgresCatalog):
        raise InvalidInputError("vector_url: 'pgvector' keeps vectors in the catalog's PostgreSQL database; "
                                "set catalog_url to a postgresql:// URL")
    return PgVectorIndex(ctx.catalog.engine, catalog=ctx.catalog, read_engine=ctx.catalog.read_engine,
                         keep_documents=ctx.config.keep_text_in_index and ctx.cipher is None)


__all__ = ["PgVectorIndex", "build_vectors", "table_of", "where_sql"]
