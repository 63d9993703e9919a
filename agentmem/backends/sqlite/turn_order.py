"""The SQL catalogs' reads of a conversation's turn order and of a user's version chains (SQLite and PostgreSQL
alike, SQLAlchemy Core): what :class:`~agentmem.backends.sqlite.catalog.SqliteCatalog` answers for
``Catalog.turn_neighbours`` and ``Catalog.session_edge``.

"Previous turn" is what the catalog's turn context means by it: the latest committed turn (``kind="turn"``) of the
same user and session created before it. Rows being written or deleted are never anyone's neighbour.

Example:
    >>> from agentmem.backends.sqlite.catalog import SqliteCatalog
    >>> from agentmem.ports.catalog import EntryRecord
    >>> cat = SqliteCatalog(":memory:")
    >>> cat.insert([EntryRecord(id=f"t{i}", user_id="u", session_id="s", kind="turn", text="x", memory_text="x",
    ...                      created_at=float(i)) for i in range(3)], index_texts=["x"] * 3)
    >>> turn_neighbours(cat.engine, ["t1"], after=False), session_edge(cat.engine, "u", "s", 9.0, after=False)
    ({'t1': ('s', 't0')}, 't2')
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import aliased

from agentmem.backends.sqlite.rows import EntryRow


def turn_neighbours(engine: Engine, ids: Sequence[str], *, after: bool,
                    committed: bool = True) -> dict[str, tuple[str, str | None]]:
    """For the turns among ``ids`` (committed ones only unless ``committed=False``: rows marked for deletion still
    know their place): ``(session_id, the previous (or, ``after``, next) committed turn of the same user and
    session, or None)``."""
    e, n = aliased(EntryRow), aliased(EntryRow)
    near = (select(n.id).where(n.user_id == e.user_id, n.session_id == e.session_id, n.kind == "turn",
                               n.write_state.is_(None),
                               n.created_at > e.created_at if after else n.created_at < e.created_at)
            .order_by(n.created_at.asc() if after else n.created_at.desc()).limit(1)
            .correlate(e).scalar_subquery())
    out: dict[str, tuple[str, str | None]] = {}
    with engine.connect() as conn:
        for start in range(0, len(ids), 500):
            stmt = select(e.id, e.session_id, near).where(e.id.in_(list(ids[start:start + 500])),
                                                           e.kind == "turn", e.session_id.is_not(None))
            if committed:
                stmt = stmt.where(e.write_state.is_(None))
            out.update({i: (s, m) for i, s, m in conn.execute(stmt)})
    return out


def session_edge(engine: Engine, user_id: str, session_id: str, created_at: float, *, after: bool) -> str | None:
    """The latest committed turn of a session created before ``created_at`` (a new turn's predecessor), or,
    ``after``, the first one created after it."""
    when = EntryRow.created_at > created_at if after else EntryRow.created_at < created_at
    stmt = (select(EntryRow.id).where(EntryRow.user_id == user_id, EntryRow.session_id == session_id,
                                      EntryRow.kind == "turn", EntryRow.write_state.is_(None), when)
            .order_by(EntryRow.created_at.asc() if after else EntryRow.created_at.desc()).limit(1))
    with engine.connect() as conn:
        return conn.execute(stmt).scalar()


__all__ = ["session_edge", "turn_neighbours"]
