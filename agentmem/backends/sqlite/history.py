"""The lifecycle's SQL, shared by both SQL catalogs: history events, statuses, version chains, the chain-cut stamp.

Each function runs inside the caller's write transaction ``s`` (an ORM session), so a status change and the event
recording it commit together; :class:`~agentmem.backends.sqlite.catalog.SqliteCatalog` (and PostgreSQL's catalog,
which inherits it) opens that transaction and exposes them as the Catalog port's lifecycle methods.

Example:
    >>> from agentmem.backends.sqlite.catalog import SqliteCatalog
    >>> from agentmem.ports.catalog import EntryRecord
    >>> catalog = SqliteCatalog(":memory:")
    >>> notes = [EntryRecord(id=i, user_id="u", kind="note", text=i, memory_text=i, created_at=0.0) for i in ("a", "b")]
    >>> catalog.insert(notes, index_texts=[None, None])
    >>> why = HistoryEvent("a", 1, "supersede", "a", 1.0, related_id="b")
    >>> catalog.apply_event(why), catalog.chain_ends(["a", "b"])
    (True, {'a': 'b'})
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, delete, select, text, update
from sqlalchemy.orm import Session

from agentmem.backends.sqlite.rows import EntryRow, HistoryRow, TagRow
from agentmem.ports.catalog import ACTIVE, CHAIN_CUTS_KEY, STATUS_OF, SUPERSEDED, HistoryEvent

_BUMP_CHAIN_CUTS = text(f"""INSERT INTO store_info("key", value) VALUES ('{CHAIN_CUTS_KEY}', '1') ON CONFLICT ("key")
    DO UPDATE SET value = CAST(CAST(store_info.value AS INTEGER) + 1 AS VARCHAR)""")  # SQLite >= 3.24, PostgreSQL

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


def bump_chain_cuts(s: Session) -> None:
    """Inside the write's transaction: move the chain-cut stamp (readers of remembered chain ends then forget them,
    :mod:`agentmem.entries.chain_ends`). Only cuts move it, not every write: remembered chains survive new
    memories."""
    s.execute(_BUMP_CHAIN_CUTS)


def erase_lifecycle(s: Session, ids: Sequence[str]) -> None:
    """Inside a deletion's transaction: erase the entries' history (every version) and every reference to them
    (``superseded_by`` of older entries, ``related_id`` of other entries' events), so no trace of an id is left."""
    s.execute(delete(HistoryRow).where(HistoryRow.entry_id.in_(ids)))
    if s.execute(update(EntryRow).where(EntryRow.superseded_by.in_(ids)).values(superseded_by=None)).rowcount:
        bump_chain_cuts(s)  # a superseded_by chain is cut: every process's remembered chain ends are stale
    s.execute(update(HistoryRow).where(HistoryRow.related_id.in_(ids)).values(related_id=None))


def history_rows(events: Iterable[HistoryEvent]) -> list[HistoryRow]:
    """The ORM rows recording ``events``."""
    return [HistoryRow(entry_id=e.entry_id, version=e.version, op=e.op, text=e.text, at=e.at, reason=e.reason,
                       related_id=e.related_id) for e in events]


def read_history(s: Session, entry_id: str) -> list[HistoryEvent]:
    """The entry's events, oldest first."""
    rows = s.scalars(select(HistoryRow).where(HistoryRow.entry_id == entry_id).order_by(HistoryRow.at, HistoryRow.id))
    return [HistoryEvent(r.entry_id, r.version, r.op, r.text, r.at, r.reason, r.related_id) for r in rows]


def chain_ends(s: Session, ids: Sequence[str], longest: int) -> dict[str, str]:
    """Each chain's last id, in ONE recursive query whatever the chains' length (Catalog.chain_ends)."""
    ends: dict[str, tuple[int, str]] = {}
    for origin, end, hops in s.execute(_CHAIN_ENDS, {"ids": list(ids), "longest": longest, "superseded": SUPERSEDED}):
        if hops > ends.get(origin, (0, ""))[0]:  # the last link of each chain
            ends[origin] = (hops, end)
    return {origin: end for origin, (_, end) in ends.items()}


def replace_fields(s: Session, entry_id: str, fields: dict[str, Any], tags: Sequence[str] | None) -> EntryRow:
    """Overwrite an entry's columns and (when given) its tags; returns the live row. LookupError if it is gone."""
    live = s.get(EntryRow, entry_id)
    if live is None:
        raise LookupError(entry_id)
    was = (live.status, live.superseded_by)
    for key, value in fields.items():
        setattr(live, key, value)
    if was[1] is not None and (live.status, live.superseded_by) != was:
        bump_chain_cuts(s)  # an entry inside a chain is current again (update): the chains through it end here
    if tags is not None:
        s.execute(delete(TagRow).where(TagRow.entry_id == entry_id))
        s.flush()
        live.tag_rows = [TagRow(tag=t) for t in dict.fromkeys(tags)]
    return live


def apply_event(s: Session, event: HistoryEvent) -> bool:
    """The change ``event`` records (Catalog.apply_event), logged with it; False, nothing written, if the entry is
    gone or not in the state the change starts from."""
    if event.op == "merge":  # one more sighting, counted in SQL: two processes' merges both count
        done = s.execute(update(EntryRow).where(EntryRow.id == event.entry_id)
                         .values(seen_count=EntryRow.seen_count + 1, last_seen_at=event.at)).rowcount
    elif event.op not in STATUS_OF:
        raise ValueError(f"a {event.op!r} event is not a status change (insert / replace_entry write it)")
    elif STATUS_OF[event.op] != ACTIVE:
        done = s.execute(update(EntryRow).where(EntryRow.id == event.entry_id, EntryRow.status == ACTIVE)
                         .values(status=STATUS_OF[event.op], superseded_by=event.related_id)).rowcount
    else:
        done = s.execute(update(EntryRow).where(EntryRow.id == event.entry_id, EntryRow.status != ACTIVE)
                         .values(status=ACTIVE, superseded_by=None)).rowcount
        if done:
            bump_chain_cuts(s)  # the chains through it end here now: every process's remembered ends are stale
    if done:
        s.add_all(history_rows([event]))
    return bool(done)


__all__ = ["apply_event", "bump_chain_cuts", "chain_ends", "erase_lifecycle", "history_rows", "read_history",
           "replace_fields"]
