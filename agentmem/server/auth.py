"""API keys bound to the user ids they may touch, stored hashed beside the memory store (``api_keys.db``).

A key reads ``am_<key id>_<secret>``; only the key id and the SHA-256 of the whole key are stored (keys are 256
random bits, so a fast hash is enough: there is nothing to brute-force). A request without a valid key gets 401;
a request naming a user its key is not bound to gets 403.

Example:
    >>> keys = KeyStore("./memdata")
    >>> key = keys.add(["u1", "u2"], label="laptop")          # shown once; use it as a Bearer token
    >>> sorted(keys.authenticate(key).users)
    ['u1', 'u2']
    >>> keys.revoke(key.split("_")[1])
    True
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, Float, String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from agentmem._fs import private_dir, private_file
from agentmem.errors import InvalidInputError, NotFoundError
from agentmem.validation import check_id

__all__ = ["ANY_USER", "ApiKeyRow", "KeyStore", "Principal"]

KEYS_FILE = "api_keys.db"


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


class _AnyUser(frozenset):
    """Stands for every user id (a server started with ``--no-auth``, loopback only)."""

    def __contains__(self, item: object) -> bool:
        return True

    def __repr__(self) -> str:
        return "ANY_USER"


ANY_USER: frozenset[str] = _AnyUser()


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key id (None without auth) and the user ids it may touch."""

    key_id: str | None
    users: frozenset[str]

    def may(self, user_id: str) -> bool:
        """Whether this caller may read or write ``user_id``'s memories."""
        return user_id in self.users

    def visible_users(self) -> list[str]:
        """The users to list in the inspector (empty for an unbound, no-auth caller: it names users itself)."""
        return [] if isinstance(self.users, _AnyUser) else sorted(self.users)


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyStore:
    """The server's API keys for one store directory (a SQLite file of its own, so the catalog stays the SDK's)."""

    def __init__(self, store_path: str | Path) -> None:
        path = private_dir(Path(store_path).expanduser().resolve())
        self.path = private_file(path / KEYS_FILE)  # 0600 before SQLite opens it: key hashes are nobody else's
        self._engine = create_engine(f"sqlite:///{self.path}", connect_args={"timeout": 30})
        _Base.metadata.create_all(self._engine)

    def close(self) -> None:
        self._engine.dispose()

    def add(self, users: Iterable[str], *, label: str | None = None) -> str:
        """Create a key for ``users``; returns the key (only its hash is kept, so it is shown once)."""
        if isinstance(users, str):
            raise InvalidInputError("users must be a list of user ids, not one string")
        # the API's own id rule: a key bound to an id every request would refuse could never be used
        bound = sorted({check_id(u, "user id", required=True) or "" for u in users})
        if not bound:
            raise InvalidInputError("a key needs at least one user id (--user)")
        key_id = secrets.token_hex(6)
        key = f"am_{key_id}_{secrets.token_urlsafe(32)}"
        with Session(self._engine) as s, s.begin():
            s.add(ApiKeyRow(id=key_id, key_hash=_hash(key), users=bound, label=label, created_at=time.time()))
        return key

    def list(self, *, include_revoked: bool = False) -> list[dict[str, Any]]:
        """Every key's id, users, label and dates (never the key itself)."""
        with Session(self._engine) as s:
            rows = s.scalars(select(ApiKeyRow).order_by(ApiKeyRow.created_at)).all()
            return [
                {"id": r.id, "users": list(r.users), "label": r.label, "created_at": r.created_at,
                 "revoked_at": r.revoked_at}
                for r in rows if include_revoked or r.revoked_at is None
            ]

    def revoke(self, key_id: str) -> bool:
        """Revoke a key by id (``keys list`` shows ids); False if it was already revoked."""
        with Session(self._engine) as s, s.begin():
            row = s.get(ApiKeyRow, key_id)
            if row is None:
                raise NotFoundError(f"no API key with id {key_id!r}")
            if row.revoked_at is not None:
                return False
            row.revoked_at = time.time()
            return True

    def count(self) -> int:
        """How many keys are usable (``serve`` refuses to start with none, unless ``--no-auth``)."""
        return len(self.list())

    def authenticate(self, key: str | None) -> Principal | None:
        """The principal for ``key``, or None if it is missing, malformed, unknown or revoked."""
        if not key or not key.startswith("am_") or key.count("_") < 2:
            return None
        key_id = key.split("_", 2)[1]
        with Session(self._engine) as s:
            row = s.get(ApiKeyRow, key_id)
            if row is None or row.revoked_at is not None or not hmac.compare_digest(row.key_hash, _hash(key)):
                return None
            return Principal(key_id=row.id, users=frozenset(row.users))
