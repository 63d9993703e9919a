"""Reads of stored entries for the facade: one live entry (never an expired one, nor another user's when the owner
is given), its history with the texts opened, the vectors the index holds for a user's entries, and a recalled
row as the :class:`~agentmem.types.Hit` recall returns.

Example:
    >>> reads = Reads(store)          # store: an AgentMemory's EntryStore, rec: one of u1's entries
    >>> reads.live(rec.id, owner="u1").text == rec.text, [v.op for v in reads.history(rec.id)]
    (True, ['add'])
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentmem.consolidate.statements import only_asks
from agentmem.entries.records import to_hit
from agentmem.errors import NotFoundError
from agentmem.types import Hit, MemoryVersion, utc_from_epoch

if TYPE_CHECKING:
    from agentmem.entries.store import EntryStore
    from agentmem.ports.catalog import EntryRecord


class Reads:
    """Entries of one store read by id (inputs already checked by the facade)."""

    def __init__(self, store: EntryStore) -> None:
        self._catalog, self._vectors, self._sealer = store.catalog, store.vectors, store.sealer
        self._lifecycle = store.lifecycle

    def live(self, entry_id: str, *, owner: str | None = None) -> EntryRecord:
        """The entry's row; :class:`NotFoundError` if it does not exist, has expired (even before a sweep) or, with
        ``owner``, belongs to another user.

        Example:
            >>> reads.live(rec.id, owner="u2")
            Traceback (most recent call last):
            agentmem.errors.NotFoundError: no memory entry with id '...'
            >>> reads.live("no-such-id")
            Traceback (most recent call last):
            agentmem.errors.NotFoundError: no memory entry with id 'no-such-id'
        """
        rows = self._catalog.get([entry_id])
        if not rows or (rows[0].expires_at is not None and rows[0].expires_at <= time.time()) or (
                owner is not None and rows[0].user_id != owner):
            raise NotFoundError(f"no memory entry with id {entry_id!r}")
        return rows[0]

    def history(self, entry_id: str) -> list[MemoryVersion]:
        """The entry's versions and events, oldest first, their texts opened.

        Example:
            >>> mem.update(rec.id, text="I moved to Paris.").version
            2
            >>> [(v.version, v.op) for v in reads.history(rec.id)]
            [(1, 'add'), (2, 'update')]
        """
        return [MemoryVersion(version=h.version, op=h.op, text=self._sealer.open_text(entry_id, "history", h.text),
                              at=utc_from_epoch(h.at), reason=h.reason, related_id=h.related_id)
                for h in self._lifecycle.history(entry_id)]

    def vectors(self, user_id: str, entry_ids: Sequence[str]) -> dict[str, Any]:
        """The index's vectors of ``user_id``'s ``entry_ids`` (ids it does not hold left out).

        Example:
            >>> reads.vectors("u1", [rec.id])[rec.id].shape, reads.vectors("u2", [rec.id])
            ((384,), {})
        """
        return self._vectors.get(user_id, entry_ids)

    def hit(self, scored: Any, *, contradicted_by: str | None = None) -> Hit:
        """A row recall scored (:class:`~agentmem.recall.pipeline.Scored`) as a :class:`Hit`, its texts opened;
        ``contradicted_by``: the newer recalled memory that contradicts it, if any."""
        row = scored.row
        return to_hit(row, scored.score, scored.scores, text=self._sealer.open_text(row.id, "text", row.text),
                      memory_text=self._sealer.open_text(row.id, "memory_text", row.memory_text),
                      contradicted_by=contradicted_by)

    def only_asks(self, scored: Any) -> bool:
        """Whether a scored row's memory only asks (a user's earlier question): a mount leaves it out, recall ranks
        it last."""
        return only_asks(self._sealer.open_text(scored.row.id, "text", scored.row.text))


__all__ = ["Reads"]
