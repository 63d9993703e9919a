"""The SQL catalogs' read of a session's edge turns (SQLite and PostgreSQL alike, SQLAlchemy Core): what
:class:`~agentmem.backends.sqlite.catalog.SqliteCatalog` answers for ``Catalog.session_edge`` (a turn's own
neighbours are ``Catalog.turn_context``'s).

"Previous turn" is what the catalog's turn context means by it: the latest committed turn (``kind="turn"``) of the
same user and session created before it. Rows being written or deleted are never anyone's neighbour.

Example:
    >>> from agentmem.backends.sqlite.catalog import SqliteCatalog
    >>> from agentmem.ports.catalog import EntryRecord
    >>> cat = SqliteCatalog(":memory:")
    >>> cat.insert([EntryRecord(id=f"t{i}", user_id="u", session_id="s", kind="turn", text="x", memory_text="x",
    ...                      created_at=float(i)) for i in range(3)], index_texts=["x"] * 3)
    >>> session_edge(cat.engine, "u", "s", 1.5, after=False), session_edge(cat.engine, "u", "s", 9.0, after=False)
    ('t1', 't2')
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.engine import Engine

from agentmem.backends.sqlite.rows import EntryRow


def session_edge(engine: Engine, user_id: str, session_id: str, created_at: float, *, after: bool) -> str | None:
    """The latest committed turn of a session created before ``created_at`` (a new turn's predecessor), or,
    ``after``, the first one created after it."""
    when = EntryRow.created_at > created_at if after else EntryRow.created_at < created_at
    stmt = (select(EntryRow.id).where(EntryRow.user_id == user_id, EntryRow.session_id == session_id,
                                      EntryRow.kind == "turn", EntryRow.write_state.is_(None), when)
            .order_by(EntryRow.created_at.asc() if after else EntryRow.created_at.desc()).limit(1))
    with engine.connect() as conn:
        return conn.execute(stmt).scalar()


__all__ = ["session_edge"]
