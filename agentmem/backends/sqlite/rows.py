"""The SQL model of the catalog (SQLAlchemy 2.0 typed ORM): entries, their tags, their history, store facts.

Both SQL catalogs share it: :class:`~agentmem.backends.sqlite.catalog.SqliteCatalog` and the PostgreSQL catalog
built on it. Its schema is reached by the numbered migrations of :mod:`agentmem.backends.sqlite.schema`.

Example:
    >>> EntryRow(id="e1", user_id="u", kind="turn", text="hi", memory_text="hi", created_at=0.0).id
    'e1'
    >>> sorted(Base.metadata.tables)
    ['entries', 'entry_history', 'entry_tags', 'store_info']
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, LargeBinary, String, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

_sql = text  # the class body below shadows `text` with the column of that name


class Base(DeclarativeBase):
    pass


class EntryRow(Base):
    __tablename__ = "entries"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    user_id: Mapped[str] = mapped_column(String, index=True)
    session_id: Mapped[str | None] = mapped_column(String, index=True, default=None)
    kind: Mapped[str] = mapped_column(String(16), index=True)
    role: Mapped[str | None] = mapped_column(String(32), default=None)
    speaker: Mapped[str | None] = mapped_column(String, default=None)
    occurred_at: Mapped[str | None] = mapped_column(String, default=None)
    text: Mapped[str] = mapped_column(Text)
    memory_text: Mapped[str] = mapped_column(Text)
    metadata_json: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float, index=True)
    expires_at: Mapped[float | None] = mapped_column(Float, index=True, default=None)
    # KV blob attached by the KV bank (all None until the entry is encoded)
    kv_path: Mapped[str | None] = mapped_column(String, default=None)
    kv_tokens: Mapped[int | None] = mapped_column(Integer, default=None)
    kv_fingerprint: Mapped[str | None] = mapped_column(String(64), default=None)
    kv_dtype: Mapped[str | None] = mapped_column(String(16), default=None)
    kb_version: Mapped[str | None] = mapped_column(String, default=None)
    # write state (schema 3): NULL = committed and visible; "adding" / "deleting" = hidden, in flight or abandoned
    write_state: Mapped[str | None] = mapped_column(String(8), default=None)
    write_since: Mapped[float | None] = mapped_column(Float, default=None)
    kv_staged_at: Mapped[float | None] = mapped_column(Float, default=None)  # a blob write in flight
    # --- lifecycle (schema 4; see agentmem/entries/lifecycle.py) ---
    version: Mapped[int] = mapped_column(Integer, default=1)
    # "active" | "superseded" (replaced by superseded_by) | "deleted" (retracted by consolidation): only active
    # entries are recalled by default and the others are never mounted; forget() still erases them all
    status: Mapped[str] = mapped_column(String(16), default="active", index=True)
    superseded_by: Mapped[str | None] = mapped_column(String(36), default=None)
    seen_count: Mapped[int] = mapped_column(Integer, default=1)
    last_seen_at: Mapped[float | None] = mapped_column(Float, default=None)
    indexed: Mapped[bool] = mapped_column(Boolean, default=True)  # False: stored but not embedded (LangGraph index=False)
    # schema 6: the unit vector of the plain text (float16 bytes), set by consolidation at write; None = not computed
    text_vector: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    # schema 10: a text of several sentences, the unit vectors of its stated sentences (float16 bytes); None = not
    # computed or one sentence (agentmem/entries/text_vectors.py)
    sentence_vectors: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)

    __table_args__ = (
        Index("ix_entries_session_created", "session_id", "created_at"),
        Index("ix_entries_pending", "write_since", sqlite_where=_sql("write_state IS NOT NULL"),
              postgresql_where=_sql("write_state IS NOT NULL")),
        Index("ix_entries_kv_staged", "kv_staged_at", sqlite_where=_sql("kv_staged_at IS NOT NULL"),
              postgresql_where=_sql("kv_staged_at IS NOT NULL")),
        # schema 9: turn_context's neighbour look-ups read this index alone
        # (agentmem.backends.sqlite.schema._turn_order_by_user)
        Index("ix_entries_session_user_turns", "session_id", "user_id", "created_at", "id", "kind", "write_state",
              sqlite_where=_sql("kind = 'turn' AND write_state IS NULL"),
              postgresql_where=_sql("kind = 'turn' AND write_state IS NULL")),
    )

    tag_rows: Mapped[list[TagRow]] = relationship(
        back_populates="entry", cascade="all, delete-orphan", lazy="selectin"
    )

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(sorted(t.tag for t in self.tag_rows))


class TagRow(Base):
    __tablename__ = "entry_tags"

    entry_id: Mapped[str] = mapped_column(ForeignKey("entries.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String, primary_key=True, index=True)
    entry: Mapped[EntryRow] = relationship(back_populates="tag_rows")


class HistoryRow(Base):
    """One version of an entry: what it said and why it changed (texts sealed like the entry's own)."""

    __tablename__ = "entry_history"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    entry_id: Mapped[str] = mapped_column(ForeignKey("entries.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    op: Mapped[str] = mapped_column(String(16))  # add | update | supersede | merge | delete
    text: Mapped[str] = mapped_column(Text)
    at: Mapped[float] = mapped_column(Float)
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    related_id: Mapped[str | None] = mapped_column(String(36), default=None)


class StoreInfo(Base):
    """Key/value facts about the store: schema version, kb version, ..."""

    __tablename__ = "store_info"

    key: Mapped[str] = mapped_column(String, primary_key=True)
    value: Mapped[str] = mapped_column(String)


COMMITTED = EntryRow.write_state.is_(None)  # what readers may see

__all__ = ["COMMITTED", "Base", "EntryRow", "HistoryRow", "StoreInfo", "TagRow"]
