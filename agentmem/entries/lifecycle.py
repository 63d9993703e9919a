"""Memory lifecycle in the catalog: versions, history events, superseded and merged entries.

History is data, not logs: every event of an entry (``add``, ``update``, ``supersede``, ``merge``, ``delete``) is a
row of ``entry_history`` holding the text of that version (sealed like the entry's own text in encrypted stores),
its time and the reason. Erasing an entry erases its history in the same transaction (``SqliteCatalog.delete``).

Statuses: ``active`` entries are recalled and mounted; ``superseded`` ones (a newer entry replaced them,
``superseded_by`` names it) and ``deleted`` ones (consolidation retracted them) stay in the catalog, visible to
``history()`` and ``recall(include_superseded=True)``, and are never mounted.

Example:
    >>> from agentmem.backends.sqlite.catalog import SqliteCatalog
    >>> from agentmem.backends.sqlite.rows import EntryRow
    >>> cat = SqliteCatalog(":memory:")
    >>> cat.insert([EntryRow(id="e1", user_id="u", kind="turn", text="hi", memory_text="hi", created_at=0.0)],
    ...            index_texts=["hi"])
    >>> life = Lifecycle(cat)
    >>> with cat.transaction() as s:
    ...     life.log(s, HistoryEvent("e1", 1, "add", "hi", 0.0))
    >>> [e.op for e in life.history("e1")]
    ['add']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, delete, select, text, update
from sqlalchemy.orm import Session

from agentmem.backends.sqlite.catalog import SqliteCatalog, bump_chain_cuts
from agentmem.backends.sqlite.rows import EntryRow, HistoryRow, TagRow

OPS = ("add", "update", "supersede", "merge", "delete", "restore")
ACTIVE, SUPERSEDED, DELETED = "active", "superseded", "deleted"


@dataclass(frozen=True)
class HistoryEvent:
    """One event of an entry as stored (``text`` sealed by the caller when the store is encrypted)."""

    entry_id: str
    version: int
    op: str
    text: str
    at: float
    reason: str | None = None
    related_id: str | None = None


# Plain SQL (SQLite and PostgreSQL alike): a third of what the same query costs built with SQLAlchemy's
# expression language per call. No status test on the first step: SQLite would scan the status index for it
# instead of looking the ids up.
_CHAIN_ENDS = text("""
WITH RECURSIVE chain(origin, successor, hops) AS (
    SELECT id, superseded_by, 1 FROM entries WHERE id IN :ids AND superseded_by IS NOT NULL
    UNION ALL
    SELECT chain.origin, e.superseded_by, chain.hops + 1 FROM chain JOIN entries e ON e.id = chain.successor
    WHERE e.status = :superseded AND e.superseded_by IS NOT NULL AND chain.hops < :longest
)
SELECT origin, successor, hops FROM chain""").bindparams(bindparam("ids", expanding=True))


class Lifecycle:
    """History and status changes of catalog entries, each in one transaction with what it records."""

    def __init__(self, catalog: SqliteCatalog) -> None:
        self.catalog = catalog

    @staticmethod
    def log(s: Session, event: HistoryEvent) -> None:
        """Add ``event`` inside the open transaction ``s``."""
        if event.op not in OPS:
            raise ValueError(f"unknown history op {event.op!r}")
        s.add(HistoryRow(entry_id=event.entry_id, version=event.version, op=event.op, text=event.text, at=event.at,
                         reason=event.reason, related_id=event.related_id))

    def log_many(self, events: Iterable[HistoryEvent]) -> None:
        with self.catalog.transaction() as s:
            for event in events:
                self.log(s, event)

    def history(self, entry_id: str) -> list[HistoryRow]:
        """The entry's events, oldest first."""
        with self.catalog.read() as s:
            return list(s.scalars(select(HistoryRow).where(HistoryRow.entry_id == entry_id)
                                  .order_by(HistoryRow.at, HistoryRow.id)))

    def chain_ends(self, ids: Sequence[str], *, longest: int = 8) -> dict[str, str]:
        """For each superseded entry among ``ids``: the id at the end of its ``superseded_by`` chain (A -> B -> C
        gives A: C), in ONE recursive query whatever the chains' length; chains longer than ``longest`` end where
        they are cut (on a still-superseded entry). Ids that are not superseded (no ``superseded_by``) are left out.

        Example:
            >>> life.chain_ends(["old", "current"])                                   # doctest: +SKIP
            {'old': 'current-version-id'}
        """
        if not ids:
            return {}
        ends: dict[str, tuple[int, str]] = {}
        with self.catalog.read() as s:
            for origin, end, hops in s.execute(_CHAIN_ENDS, {"ids": list(ids), "longest": longest, "superseded": SUPERSEDED}):
                if hops > ends.get(origin, (0, ""))[0]:  # the last link of each chain
                    ends[origin] = (hops, end)
        return {origin: end for origin, (_, end) in ends.items()}

    def replace(self, s: Session, row: EntryRow, fields: dict[str, Any], *, index_text: str | None,
                tags: Sequence[str] | None, events: Sequence[HistoryEvent]) -> None:
        """Inside transaction ``s``: overwrite ``row``'s fields, its lexical document (dropped when ``index_text``
        is None: the entry is stored but not indexed), its tags (when given), and log ``events``."""
        live = s.get(EntryRow, row.id)
        if live is None:
            raise LookupError(row.id)
        was = (live.status, live.superseded_by)
        for key, value in fields.items():
            setattr(live, key, value)
        if was[1] is not None and (live.status, live.superseded_by) != was:
            bump_chain_cuts(s)  # an entry inside a chain is current again (update): the chains through it end here
        if tags is not None:
            s.execute(delete(TagRow).where(TagRow.entry_id == row.id))
            s.flush()
            live.tag_rows = [TagRow(tag=t) for t in dict.fromkeys(tags)]
        self.catalog.replace_lexical(s, live.user_id, row.id, index_text)
        for event in events:
            self.log(s, event)

    def set_status(self, entry_id: str, status: str, event: HistoryEvent, *, superseded_by: str | None = None) -> bool:
        """Mark an active entry superseded / deleted and log why; False if it is gone or no longer active."""
        with self.catalog.transaction() as s:
            n = s.execute(update(EntryRow).where(EntryRow.id == entry_id, EntryRow.status == ACTIVE)
                          .values(status=status, superseded_by=superseded_by)).rowcount
            if n:
                self.log(s, event)
            return bool(n)

    def reinstate(self, entry_id: str, event: HistoryEvent) -> bool:
        """A superseded or retracted entry is active again (``restore``); False if it is gone or already active."""
        with self.catalog.transaction() as s:
            n = s.execute(update(EntryRow).where(EntryRow.id == entry_id, EntryRow.status != ACTIVE)
                          .values(status=ACTIVE, superseded_by=None)).rowcount
            if n:
                bump_chain_cuts(s)  # the chains through it end here now: every process's remembered ends are stale
                self.log(s, event)
            return bool(n)

    def seen_again(self, entry_id: str, at: float, event: HistoryEvent) -> bool:
        """A near-duplicate arrived: count it on the existing entry (no new row) and log the merge."""
        with self.catalog.transaction() as s:
            n = s.execute(update(EntryRow).where(EntryRow.id == entry_id)
                          .values(seen_count=EntryRow.seen_count + 1, last_seen_at=at)).rowcount
            if n:
                self.log(s, event)
            return bool(n)


__all__ = ["ACTIVE", "DELETED", "OPS", "SUPERSEDED", "HistoryEvent", "Lifecycle"]
