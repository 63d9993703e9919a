"""Numbered, forward-only schema migrations, applied on open (LangGraph's checkpointer style).

A store records the number of the last migration applied in ``store_info.schema_version``. Opening it applies every
later migration in order, each in the same transaction as the version bump, so a crash mid-way leaves the schema at
a version that exists. Migrations are never edited once landed: a change is a new migration appended to the list.
Migrations are plain functions over a SQLAlchemy connection, so one list serves SQLite and PostgreSQL (a step that
differs per engine branches on ``conn.dialect.name``).

Example:
    >>> from sqlalchemy import create_engine, text
    >>> eng = create_engine("sqlite://")
    >>> steps = [Migration(1, "info table", lambda c: c.execute(text(
    ...     "CREATE TABLE store_info (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)")))]
    >>> with eng.begin() as conn:
    ...     apply_migrations(conn, steps)
    [1]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection


@dataclass(frozen=True)
class Migration:
    """One schema step: ``upgrade`` turns schema ``version - 1`` into schema ``version``."""

    version: int
    description: str
    upgrade: Callable[[Connection], None]


def schema_version(conn: Connection) -> int:
    """The store's schema version: 0 for an empty database (no ``store_info`` table yet)."""
    if not inspect(conn).has_table("store_info"):
        return 0
    row = conn.execute(text("SELECT value FROM store_info WHERE " + _KEY + " = 'schema_version'")).first()
    return int(row[0]) if row is not None else 0


def latest_version(migrations: Sequence[Migration]) -> int:
    """The version a store has once every migration of the list is applied."""
    return migrations[-1].version if migrations else 0


def apply_migrations(conn: Connection, migrations: Sequence[Migration], *, target: int | None = None) -> list[int]:
    """Apply, inside the caller's transaction, every migration newer than the store's version (up to ``target``).

    Returns the versions applied. Refuses a store written by a newer agentmem (its version is above the list's):
    opening it with older code would silently ignore columns it does not know.
    """
    _check_sequence(migrations)
    current = schema_version(conn)
    newest = latest_version(migrations)
    if current > newest:
        from agentmem.errors import AgentMemError

        raise AgentMemError(f"the store's schema is version {current}, newer than this agentmem knows ({newest}); "
                            "upgrade agentmem")
    applied = []
    for step in migrations:
        if step.version <= current or (target is not None and step.version > target):
            continue
        step.upgrade(conn)
        _record_version(conn, step.version)
        applied.append(step.version)
    return applied


def _record_version(conn: Connection, version: int) -> None:
    updated = conn.execute(text("UPDATE store_info SET value = :v WHERE " + _KEY + " = 'schema_version'"),
                           {"v": str(version)})
    if updated.rowcount == 0:
        conn.execute(text("INSERT INTO store_info(" + _KEY + ", value) VALUES ('schema_version', :v)"),
                     {"v": str(version)})


def _check_sequence(migrations: Sequence[Migration]) -> None:
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migrations must be numbered 1..n without gaps, got {versions}")


_KEY = '"key"'  # quoted: KEY is reserved in some SQL dialects

__all__ = ["Migration", "apply_migrations", "latest_version", "schema_version"]
