"""The API-key stores: ``api_keys.db``, a SQLite file of its own beside the catalog (the embedded default), or a
PostgreSQL database several servers share (SQLAlchemy 2.0, one table either way).

A file of its own so the catalog stays the SDK's: a store used without the server has no key table, and erasing or
exporting memories never touches keys. The table is the one the server has always written (``api_keys``: id, key
hash, users as JSON, label, created / revoked times), so key files made by earlier versions open as they are.

Example:
    >>> import pathlib, tempfile
    >>> keys = SqliteApiKeyRecords(pathlib.Path(tempfile.mkdtemp()) / "api_keys.db")
    >>> keys.insert(ApiKeyRecord(id="k1", key_hash="ab" * 32, users=("u1",), label="laptop", created_at=1.0))
    >>> [(r.id, r.users, r.label) for r in keys.records()]
    [('k1', ('u1',), 'laptop')]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import JSON, Float, String, create_engine, select, update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from agentmem.errors import NotFoundError
from agentmem.ports.api_keys import ApiKeyRecord


class _Base(DeclarativeBase):
    pass


class ApiKeyRow(_Base):
    """One API key: its id, the hash of the whole key, and the users it may act for."""

    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    key_hash: Mapped[str] = mapped_column(String(64))
    users: Mapped[list[str]] = mapped_column(JSON)
    label: Mapped[str | None] = mapped_column(String, default=None)
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, default=None)


def _record(row: ApiKeyRow) -> ApiKeyRecord:
    return ApiKeyRecord(id=row.id, key_hash=row.key_hash, users=tuple(row.users), label=row.label,
                        created_at=row.created_at, revoked_at=row.revoked_at)


class SqlApiKeyRecords:
    """:class:`~agentmem.ports.api_keys.ApiKeyRecords` in any SQLAlchemy database (the table created if missing):
    a SQLite file (:class:`SqliteApiKeyRecords`), or PostgreSQL, where several servers share one set of keys."""

    def __init__(self, url: str, **engine_options: Any) -> None:
        self._engine = create_engine(url, **engine_options)
        _Base.metadata.create_all(self._engine)

    def insert(self, record: ApiKeyRecord) -> None:
        with Session(self._engine) as s, s.begin():
            s.add(ApiKeyRow(id=record.id, key_hash=record.key_hash, users=list(record.users), label=record.label,
                            created_at=record.created_at, revoked_at=record.revoked_at))

    def get(self, key_id: str) -> ApiKeyRecord | None:
        with Session(self._engine) as s:
            row = s.get(ApiKeyRow, key_id)
            return None if row is None else _record(row)

    def records(self) -> list[ApiKeyRecord]:
        with Session(self._engine) as s:
            return [_record(r) for r in s.scalars(select(ApiKeyRow).order_by(ApiKeyRow.created_at))]

    def revoke(self, key_id: str, *, at: float) -> bool:
        # one conditional UPDATE: of two revocations racing on one key, exactly one reports True
        with Session(self._engine) as s, s.begin():
            done = s.execute(update(ApiKeyRow).where(ApiKeyRow.id == key_id, ApiKeyRow.revoked_at.is_(None))
                             .values(revoked_at=at))
            if done.rowcount == 1:
                return True
            if s.get(ApiKeyRow, key_id) is None:
                raise NotFoundError(f"no API key with id {key_id!r}")
            return False

    def close(self) -> None:
        self._engine.dispose()


class SqliteApiKeyRecords(SqlApiKeyRecords):
    """The key records in one SQLite file (created with its table if missing)."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        super().__init__(f"sqlite:///{self.path}", connect_args={"timeout": busy_timeout_s})


__all__ = ["ApiKeyRow", "SqlApiKeyRecords", "SqliteApiKeyRecords"]
