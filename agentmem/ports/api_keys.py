"""Port: the server's API-key records (one row per key: its id, the SHA-256 of the whole key, the users it may act
for, a label and its dates).

The policy — making a key, hashing it, checking a presented key, refusing bad user ids — is the server's
(:class:`agentmem.server.KeyStore`); a key store only keeps the records. Four operations are all the server and the
CLI need: add one, read one by id (every request), list them (``keys list``, ``serve``'s "no key" check) and revoke
one (``keys revoke``: check and stamp in one step, so two revocations of one key cannot both report True).

Example:
    >>> from agentmem.api_keys import open_api_keys
    >>> records = open_api_keys(None, url="memory")          # an in-process store; None = <store>/api_keys.db
    >>> records.insert(ApiKeyRecord(id="k1", key_hash="ab" * 32, users=("u1",), label=None, created_at=1.0))
    >>> records.get("k1").users, records.revoke("k1", at=2.0), records.revoke("k1", at=3.0)
    (('u1',), True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class ApiKeyRecord:
    """One API key as stored: never the key itself, only its id and hash."""

    id: str
    key_hash: str
    users: tuple[str, ...]
    label: str | None
    created_at: float
    revoked_at: float | None = None


@runtime_checkable
class ApiKeyRecords(Protocol):
    """Where a server's API keys are kept (the embedded default: ``api_keys.db`` in the store directory)."""

    def insert(self, record: ApiKeyRecord) -> None:
        """Keep a new key's record (its id is new: ids are random)."""
        ...

    def get(self, key_id: str) -> ApiKeyRecord | None:
        """The record of ``key_id``, revoked or not; None if there is none."""
        ...

    def records(self) -> list[ApiKeyRecord]:
        """Every record, revoked ones too, oldest first."""
        ...

    def revoke(self, key_id: str, *, at: float) -> bool:
        """Stamp ``key_id`` revoked at ``at``; False if it already was, :class:`~agentmem.errors.NotFoundError`
        if there is no such key."""
        ...

    def close(self) -> None:
        """Release the connection (a closed store is not used again)."""
        ...


__all__ = ["ApiKeyRecord", "ApiKeyRecords"]
