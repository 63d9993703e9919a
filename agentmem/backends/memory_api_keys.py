"""In-process API-key records (``open_api_keys(..., url="memory")``): a dict under a lock, written only against
the port, persisting nothing. For tests and short-lived servers, and the second implementation that shows
:class:`~agentmem.ports.api_keys.ApiKeyRecords` says everything the server needs (tests/conformance/test_api_keys.py).

Example:
    >>> keys = MemoryApiKeyRecords()
    >>> keys.insert(ApiKeyRecord(id="k1", key_hash="ab" * 32, users=("u1",), label=None, created_at=1.0))
    >>> keys.get("k1").users, keys.get("k2")
    (('u1',), None)
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from agentmem.errors import NotFoundError
from agentmem.ports.api_keys import ApiKeyRecord


class MemoryApiKeyRecords:
    """:class:`~agentmem.ports.api_keys.ApiKeyRecords` in a dict (records are frozen, so they are shared safely)."""

    def __init__(self) -> None:
        self._records: dict[str, ApiKeyRecord] = {}
        self._lock = threading.Lock()

    def insert(self, record: ApiKeyRecord) -> None:
        with self._lock:
            self._records[record.id] = record

    def get(self, key_id: str) -> ApiKeyRecord | None:
        return self._records.get(key_id)

    def records(self) -> list[ApiKeyRecord]:
        with self._lock:
            return sorted(self._records.values(), key=lambda r: r.created_at)

    def revoke(self, key_id: str, *, at: float) -> bool:
        with self._lock:
            record = self._records.get(key_id)
            if record is None:
                raise NotFoundError(f"no API key with id {key_id!r}")
            if record.revoked_at is not None:
                return False
            self._records[key_id] = dataclasses.replace(record, revoked_at=at)
            return True

    def close(self) -> None:
        pass


def build_api_keys(url: str | None, ctx: Any) -> MemoryApiKeyRecords:
    """The factory's builder for ``memory``."""
    return MemoryApiKeyRecords()


__all__ = ["MemoryApiKeyRecords", "build_api_keys"]
