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

from agentmem.api_keys import KEYS_FILE, ApiKeyRecord, ApiKeyRecords, open_api_keys
from agentmem.errors import InvalidInputError
from agentmem.validation import check_id

__all__ = ["ANY_USER", "KEYS_FILE", "KeyStore", "Principal"]


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
    """The server's API keys for one store directory: the policy (making, hashing and checking keys) over the key
    records the factory opens (``api_keys.db``, a SQLite file of its own, so the catalog stays the SDK's; or the
    store ``url`` names, as :func:`agentmem.api_keys.open_api_keys` takes it)."""

    def __init__(self, store_path: str | Path | None, *, url: str | None = None) -> None:
        self._records: ApiKeyRecords = open_api_keys(store_path, url=url)

    def close(self) -> None:
        self._records.close()

    def add(self, users: Iterable[str], *, label: str | None = None) -> str:
        """Create a key for ``users``; returns the key (only its hash is kept, so it is shown once)."""
        if isinstance(users, str):
            raise InvalidInputError("users must be a list of user ids, not one string")
        # the API's own id rule: a key bound to an id every request would refuse could never be used
        bound = tuple(sorted({check_id(u, "user id", required=True) or "" for u in users}))
        if not bound:
            raise InvalidInputError("a key needs at least one user id (--user)")
        key_id = secrets.token_hex(6)
        key = f"am_{key_id}_{secrets.token_urlsafe(32)}"
        self._records.insert(ApiKeyRecord(id=key_id, key_hash=_hash(key), users=bound, label=label,
                                          created_at=time.time()))
        return key

    def list(self, *, include_revoked: bool = False) -> list[dict[str, Any]]:
        """Every key's id, users, label and dates (never the key itself)."""
        return [{"id": r.id, "users": list(r.users), "label": r.label, "created_at": r.created_at,
                 "revoked_at": r.revoked_at}
                for r in self._records.records() if include_revoked or r.revoked_at is None]

    def revoke(self, key_id: str) -> bool:
        """Revoke a key by id (``keys list`` shows ids); False if it was already revoked."""
        return self._records.revoke(key_id, at=time.time())

    def count(self) -> int:
        """How many keys are usable (``serve`` refuses to start with none, unless ``--no-auth``)."""
        return len(self.list())

    def authenticate(self, key: str | None) -> Principal | None:
        """The principal for ``key``, or None if it is missing, malformed, unknown or revoked."""
        if not key or not key.startswith("am_") or key.count("_") < 2:
            return None
        record = self._records.get(key.split("_", 2)[1])
        if record is None or record.revoked_at is not None or not hmac.compare_digest(record.key_hash, _hash(key)):
            return None
        return Principal(key_id=record.id, users=frozenset(record.users))
