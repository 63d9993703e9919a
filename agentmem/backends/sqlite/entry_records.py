"""The SQL catalogs' rows as the port's plain :class:`~agentmem.ports.catalog.EntryRecord` values, both ways.

Reads use one Core SELECT (:func:`read_records`); writes and the rows a deletion returns go through the ORM and
are converted with :func:`row_of` / :func:`record_of` inside the backend, so no caller ever holds an ORM row.

Why not the ORM: recall loads ~40 rows (the head it re-ranks, and their chain ends) on every call and only reads
them. Building ORM instances (identity map, attribute instrumentation, the joined ``tag_rows`` collection, the
session around them) cost more than the query itself (research/notes/retrieval-lab-notes.md, "Latency"). A Core ``SELECT`` of the
entry's columns, left-joined with its tags, returns tuples that become
:class:`~agentmem.ports.catalog.EntryRecord` objects: the same
attribute names and values as :class:`~agentmem.backends.sqlite.rows.EntryRow` (``tags`` sorted, as ``EntryRow.tags``),
so everything recall does with a row (scope checks, re-ranking, the conflict check, ``Hit`` building) works
unchanged. A record is not attached to any session and is never written back.

Example:
    >>> from agentmem.backends.sqlite.catalog import SqliteCatalog
    >>> cat = SqliteCatalog(":memory:")
    >>> cat.insert([EntryRecord(id="e1", user_id="u", kind="turn", text="hi", memory_text="hi", created_at=0.0,
    ...                         tags=("b", "a"))], index_texts=["hi"])
    >>> [(r.id, r.tags, r.status) for r in cat.get(["e1", "gone"])]
    [('e1', ('a', 'b'), 'active')]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from sqlalchemy import ARRAY, Select, String, any_, bindparam, select
from sqlalchemy.engine import Connection

from agentmem.backends.sqlite.rows import EntryRow, TagRow
from agentmem.ports.catalog import EntryRecord


# the mapped columns in EntryRecord's order (a column added to EntryRow without a field here fails at import)
_FIELDS = tuple(f.name for f in fields(EntryRecord))[:-1]
if set(_FIELDS) != {a.key for a in EntryRow.__mapper__.column_attrs}:
    raise RuntimeError("EntryRecord's fields must be EntryRow's mapped columns (agentmem/backends/sqlite/entry_records.py)")
_COLUMNS = [EntryRow.__mapper__.column_attrs[name].columns[0] for name in _FIELDS]  # table columns, no ORM
_TAG = TagRow.__table__.c


def _query(dialect: str) -> Select[Any]:
    """The statement, built once per dialect and reused: SQLAlchemy then takes its compiled form from the cache
    without matching a new statement's columns to it (for ORM-annotated columns that matching built ~30 SQL
    expressions a call, most of what this read cost). ``:ids`` binds one array on PostgreSQL (one statement text
    for any number of ids, as ``PostgresCatalog._among``), an expanding ``IN`` elsewhere."""
    query = _QUERIES.get(dialect)
    if query is None:
        entry_id = _COLUMNS[0]
        among = (entry_id == any_(bindparam("ids", type_=ARRAY(String))) if dialect == "postgresql"
                 else entry_id.in_(bindparam("ids", expanding=True)))
        query = _QUERIES[dialect] = (select(*_COLUMNS, _TAG.tag)
                                     .select_from(EntryRow.__table__.outerjoin(TagRow.__table__, _TAG.entry_id == entry_id))
                                     .where(among, EntryRow.__table__.c.write_state.is_(None)))
    return query


_QUERIES: dict[str, Select[Any]] = {}


def read_records(conn: Connection, ids: Sequence[str]) -> dict[str, EntryRecord]:
    """The committed entries among ``ids`` with their tags, by id, in one query.

    One row comes back per (entry, tag), or one with tag NULL for an untagged entry; the entry's columns are read
    from its first row only.

    Example:
        >>> from agentmem.backends.sqlite.catalog import SqliteCatalog
        >>> cat = SqliteCatalog(":memory:")
        >>> entry = lambda i: EntryRecord(id=i, user_id="u", kind="fact", text=i, memory_text=i, created_at=0.0,
        ...                               tags=("b", "a"))
        >>> cat.insert([entry("e1")], index_texts=["e1"])
        >>> cat.insert([entry("e2")], index_texts=["e2"], pending=True)  # e2: a write still in flight
        >>> with cat.engine.connect() as conn:
        ...     found = read_records(conn, ["e1", "e2", "gone"])
        >>> {i: (r.text, r.tags) for i, r in found.items()}
        {'e1': ('e1', ('a', 'b'))}
    """
    values: dict[str, Sequence[Any]] = {}
    tags: dict[str, list[str]] = {}
    for row in conn.execute(_query(conn.dialect.name), {"ids": list(ids)}).all():  # fetchall, not row by row
        entry_id = row[0]
        if entry_id not in values:
            values[entry_id], tags[entry_id] = row, []
        if row[-1] is not None:
            tags[entry_id].append(row[-1])
    return {i: EntryRecord(**dict(zip(_FIELDS, v[:-1])), tags=tuple(sorted(tags[i]))) for i, v in values.items()}


def record_of(row: EntryRow) -> EntryRecord:
    """The plain record of an ORM row (its tags loaded), for a port method that returns rows it wrote or deleted.

    Example:
        >>> record_of(EntryRow(id="e1", user_id="u", kind="turn", text="", memory_text="", created_at=0.0)).id
        'e1'
    """
    return EntryRecord(**{name: getattr(row, name) for name in _FIELDS}, tags=row.tags)


def row_of(record: EntryRecord) -> EntryRow:
    """A new ORM row holding ``record``'s columns and tags (each tag once), for :meth:`Catalog.insert`.

    Example:
        >>> row_of(EntryRecord(id="e1", user_id="u", kind="turn", text="", memory_text="", created_at=0.0,
        ...                    tags=("a", "a"))).tags
        ('a',)
    """
    row = EntryRow(**{name: getattr(record, name) for name in _FIELDS})
    row.tag_rows = [TagRow(tag=t) for t in dict.fromkeys(record.tags)]
    return row


__all__ = ["EntryRecord", "read_records", "record_of", "row_of"]
