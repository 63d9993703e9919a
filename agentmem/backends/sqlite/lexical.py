"""The SQLite catalog's lexical tables: one FTS5 table per user, named by a digest of the user id, and the
``lexical_bounds`` table of BM25 bounds that lets a top-k stop early (:mod:`agentmem.backends.lexical_bounds`).
Shared by the catalog (writes) and the migrations that create or back-fill them (:mod:`.schema`).

Example:
    >>> lexical_table("u1").startswith(LEXICAL_PREFIX), len(lexical_table("u1"))
    (True, 36)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import text

from agentmem.backends.lexical_bounds import doc_bounds

LEXICAL_PREFIX = "lex_"


def lexical_table(user_id: str) -> str:
    """Name of ``user_id``'s FTS5 table (a digest, so the name neither leaks the id nor needs quoting)."""
    return LEXICAL_PREFIX + hashlib.sha256(user_id.encode()).hexdigest()[:32]


def lexical_ddl(table: str) -> str:
    """DDL of one user's FTS5 table (``IF NOT EXISTS``)."""
    return f"CREATE VIRTUAL TABLE IF NOT EXISTS {table} USING fts5(id UNINDEXED, content, tokenize='porter unicode61')"


BOUNDS_DDL = ("CREATE TABLE IF NOT EXISTS lexical_bounds (tbl VARCHAR NOT NULL, prefix VARCHAR NOT NULL, "
               "value INTEGER NOT NULL, PRIMARY KEY (tbl, prefix))")


def record_bounds(s: Any, table: str, texts: Sequence[str]) -> None:
    """Inside a write's transaction: loosen ``table``'s BM25 bounds for new documents (row prefix ``''``: the
    shortest document's length; any other prefix: the most tokens with it in one document). Never tightened on
    deletion: a looser bound is still a bound."""
    min_len, most = doc_bounds(texts)
    if min_len is None:
        return
    rows = [{"t": table, "p": "", "v": min_len}] + [{"t": table, "p": p, "v": v} for p, v in sorted(most.items())]
    s.execute(text("INSERT INTO lexical_bounds (tbl, prefix, value) VALUES (:t, :p, :v) ON CONFLICT (tbl, prefix) "
                   "DO UPDATE SET value = CASE WHEN lexical_bounds.prefix = '' THEN min(lexical_bounds.value, "
                   "excluded.value) ELSE max(lexical_bounds.value, excluded.value) END"), rows)


__all__ = ["BOUNDS_DDL", "LEXICAL_PREFIX", "lexical_ddl", "lexical_table", "record_bounds"]
