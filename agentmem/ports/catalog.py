"""Port: the catalog, source of truth for entries (rows, tags, lexical index, turn context, pending writes).

A write is recorded here first, as *pending*; vectors and blobs follow; then the row is committed. A deletion is
marked first, then its vector and blob are erased, then the row goes. Readers never see a row that is not
committed. Recovery asks :meth:`Catalog.pending` for marked rows older than a grace period and finishes or rolls
them back: it never scans the vectors or the blobs, and it needs no process ids, so it works across hosts.

Rows are :class:`agentmem.backends.sqlite.rows.EntryRow` (SQLAlchemy 2.0 typed ORM); both SQL catalogs share the model.
Schema changes are numbered, forward-only migrations applied on open (:mod:`agentmem.backends.migrations`).

Example:
    >>> from agentmem.ports.catalog import Catalog
    >>> from agentmem.backends.sqlite.catalog import SqliteCatalog
    >>> isinstance(SqliteCatalog(":memory:"), Catalog)
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:  # the SQLAlchemy model both SQL catalogs share; the port should speak plain records (issue #36)
    from agentmem.backends.sqlite.rows import EntryRow


class TurnContext(NamedTuple):
    """Where an entry sits: its session and the nearest conversation turns before / after it.

    Example:
        >>> TurnContext("s1", ("t1",), ()).before
        ('t1',)
    """

    session_id: str | None
    before: tuple[str, ...]
    after: tuple[str, ...]


@dataclass(slots=True, eq=False)
class EntryRecord:
    """One committed entry as recall reads it (every column of :class:`EntryRow`, by the same names, and its tags).

    ``eq=False``: records compare and hash by identity, as ORM instances do (recall keys its dicts by id anyway).

    Example:
        >>> EntryRecord.__slots__[:3]
        ('id', 'user_id', 'session_id')
    """

    id: str
    user_id: str
    session_id: str | None
    kind: str
    role: str | None
    speaker: str | None
    occurred_at: str | None
    text: str
    memory_text: str
    metadata_json: dict[str, Any]
    created_at: float
    expires_at: float | None
    kv_path: str | None
    kv_tokens: int | None
    kv_fingerprint: str | None
    kv_dtype: str | None
    kb_version: str | None
    write_state: str | None
    write_since: float | None
    kv_staged_at: float | None
    version: int
    status: str
    superseded_by: str | None
    seen_count: int
    last_seen_at: float | None
    indexed: bool
    text_vector: bytes | None
    tags: tuple[str, ...]


# Entry statuses (docs/lifecycle.md): ``active`` entries are recalled and mounted; ``superseded`` (a newer entry
# replaced them, ``superseded_by`` names it) and ``deleted`` (consolidation retracted them) stay, never mounted.
ACTIVE, SUPERSEDED, DELETED = "active", "superseded", "deleted"
# what a history event can record
OPS = ("add", "update", "supersede", "merge", "delete", "restore")


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One event of an entry as stored (``text`` sealed by the caller when the store is encrypted).

    Example:
        >>> HistoryEvent("e1", 1, "add", "hi", 0.0).op
        'add'
        >>> HistoryEvent("e1", 1, "rename", "hi", 0.0)
        Traceback (most recent call last):
        ValueError: unknown history op 'rename'
    """

    entry_id: str
    version: int
    op: str
    text: str
    at: float
    reason: str | None = None
    related_id: str | None = None

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown history op {self.op!r}")


# the store_info key whose value moves whenever a superseded_by chain is cut or re-pointed (readers of remembered
# chain ends compare it: agentmem.consolidate.chain_ends)
CHAIN_CUTS_KEY = "chain_cuts"


def chain_cuts_value(value: str | None) -> int:
    """The chain-cut stamp from its stored ``store_info`` value (None, no row: 0).

    Example:
        >>> chain_cuts_value(None), chain_cuts_value("3")
        (0, 3)
    """
    return int(value) if value is not None else 0


@runtime_checkable
class Catalog(Protocol):
    """Rows, tags, lexical search and write state of every entry."""

    # --- writes ------------------------------------------------------------------------------
    def insert(self, rows: Sequence[EntryRow], *, index_texts: Sequence[str | None], tags: Sequence[Iterable[str]] = (),
               pending: bool = False, history: Sequence[HistoryEvent] = ()) -> None:
        """Insert rows with their tags, lexical documents (None: stored, not indexed) and history events in one
        transaction; ``pending`` hides them until :meth:`commit`. (A catalog that a vector index joins,
        :class:`~agentmem.ports.abilities.JoinsCatalogTransaction`, also takes ``extra=``: a callable run inside
        the same transaction.)"""
        ...

    def commit(self, ids: Sequence[str]) -> None:
        """Make pending rows visible (their vectors and blobs are in)."""
        ...

    def mark_deleting(self, ids: Sequence[str]) -> list[EntryRow]:
        """Hide rows and mark them for deletion; returns the rows marked (to erase their vectors and blobs)."""
        ...

    def delete(self, ids: Sequence[str]) -> list[EntryRow]:
        """Delete rows, tags and lexical documents; returns what was deleted."""
        ...

    def update_kv(self, entry_id: str, **fields: Any) -> None:
        """Set KV fields (``kv_path``, ``kv_tokens``, ``kv_fingerprint``, ``kv_dtype``, ``kb_version``) and clear
        a blob write marked by :meth:`mark_blob_pending`."""
        ...

    def mark_blob_pending(self, entry_id: str) -> bool:
        """Record that a blob is being written for a visible row; False if the row does not exist."""
        ...

    def pending(self, older_than: float) -> list[EntryRow]:
        """Rows with a write or deletion (or blob write) marked before ``older_than`` (epoch seconds)."""
        ...

    def set_info(self, key: str, value: str) -> None: ...
    def get_info(self, key: str) -> str | None: ...

    def infos(self, keys: Sequence[str]) -> dict[str, str]:
        """Several :meth:`get_info` values in one read (keys without a value are left out)."""
        ...

    # --- reads (committed rows only) -------------------------------------------------------------
    def get(self, ids: Sequence[str]) -> list[EntryRow]:
        """Rows for ``ids`` in the order given; missing or uncommitted ids are skipped."""
        ...

    def records(self, ids: Sequence[str]) -> list[EntryRecord]:
        """Like :meth:`get`, as read-only :class:`EntryRecord` objects (same
        attributes, no ORM session): what recall reads on every call."""
        ...

    def scope_select(self, *, user_id: str | None = None, session_id: str | None = None,
                     kinds: Sequence[str] | None = None, tags: Sequence[str] | None = None,
                     alive_at: float | None = None) -> Any:
        """An opaque scope query for :meth:`iter_ids`, :meth:`list_rows` and :meth:`count`."""
        ...

    def iter_ids(self, query: Any, *, page_size: int = 1000) -> Iterator[list[str]]: ...
    def list_rows(self, query: Any, *, limit: int | None = None, offset: int = 0) -> list[EntryRow]: ...
    def count(self, query: Any) -> int: ...
    def expired_ids(self, now: float) -> list[str]: ...
    def existing(self, ids: Sequence[str]) -> set[str]: ...

    def unindexed_ids(self) -> set[str]:
        """Entries stored without a vector on purpose (``indexed`` false; ``verify()`` only)."""
        ...

    def superseded_ids(self, user_id: str) -> list[str]:
        """Ids of ``user_id``'s entries with a ``superseded_by`` (any status): where the user's version chains
        start (recall remembers their ends)."""
        ...

    def turn_neighbours(self, ids: Sequence[str], *, after: bool,
                        committed: bool = True) -> dict[str, tuple[str, str | None]]:
        """For the turns (``kind="turn"`` with a session) among ``ids``: ``(session_id, the previous committed turn
        of the same user and session, or None)``; ``after``: the next one. ``committed=False`` answers for rows
        marked in flight too (rows being erased still know their place); rows in flight are never a neighbour."""
        ...

    def session_edge(self, user_id: str, session_id: str, created_at: float, *, after: bool) -> str | None:
        """The latest committed turn of the session created before ``created_at`` (``after``: the first one
        created after it), or None."""
        ...

    def lexical_search(self, query: str, *, user_id: str, limit: int,
                       blind: Callable[[str], str] | None = None) -> list[tuple[str, float]]:
        """Lexical (BM25-like, per-user statistics) search: ``[(id, score)]``, best first, score > 0."""
        ...

    def turn_context(self, ids: Sequence[str], *, window: int = 2) -> dict[str, TurnContext]:
        """Session and neighbouring turns of each entry among ``ids``."""
        ...

    def change_token(self) -> int:
        """A number that changes whenever any process commits a write (cheap; for caches of derived data)."""
        ...

    def scrub(self, user_ids: Iterable[str] | None = None, *, vacuum: bool = False) -> None:
        """Push erased bytes out of the backend's free space and logs, where it can (``vacuum``: rewrite pages)."""
        ...

    # --- lifecycle: versions, statuses and history (agentmem/entries/lifecycle.py), each one transaction --------
    def log_history(self, events: Sequence[HistoryEvent]) -> None:
        """Record ``events`` (all or nothing)."""
        ...

    def history(self, entry_id: str) -> list[HistoryEvent]:
        """The entry's events, oldest first (``[]`` for an unknown or erased id)."""
        ...

    def chain_ends(self, ids: Sequence[str], *, longest: int = 8) -> dict[str, str]:
        """For each entry among ``ids`` with a ``superseded_by``: the id at the end of its chain (A -> B -> C gives
        A: C), following only superseded links and at most ``longest`` of them; other ids are left out."""
        ...

    def replace_entry(self, entry_id: str, fields: dict[str, Any], *, index_text: str | None,
                      tags: Sequence[str] | None, events: Sequence[HistoryEvent]) -> None:
        """Overwrite an entry's columns (``fields``), its lexical document (None: dropped), its tags (when given)
        and log ``events``, all or nothing; :class:`LookupError` if the entry is gone. Taking an entry out of a
        chain moves the chain-cut stamp (:data:`CHAIN_CUTS_KEY`)."""
        ...

    def set_status(self, entry_id: str, status: str, event: HistoryEvent, *,
                   superseded_by: str | None = None) -> bool:
        """Mark an :data:`ACTIVE` entry ``status`` (with ``superseded_by``) and log ``event``; False (nothing
        written) if the entry is gone or not active."""
        ...

    def reinstate(self, entry_id: str, event: HistoryEvent) -> bool:
        """Make a superseded or deleted entry :data:`ACTIVE` again (``superseded_by`` cleared, the chain-cut stamp
        moved) and log ``event``; False (nothing written) if it is gone or already active."""
        ...

    def seen_again(self, entry_id: str, at: float, event: HistoryEvent) -> bool:
        """Count one more sighting of an entry (``seen_count`` + 1, ``last_seen_at`` = ``at``) and log ``event``;
        False (nothing written) if the entry is gone."""
        ...

    def close(self) -> None: ...


__all__ = ["ACTIVE", "CHAIN_CUTS_KEY", "DELETED", "OPS", "SUPERSEDED", "Catalog", "EntryRecord", "HistoryEvent",
           "TurnContext", "chain_cuts_value"]
