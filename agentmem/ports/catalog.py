"""Port: the catalog, source of truth for entries (rows, tags, lexical index, turn context, pending writes).

A write is recorded here first, as *pending*; vectors and blobs follow; then the row is committed. A deletion is
marked first, then its vector and blob are erased, then the row goes. Readers never see a row that is not
committed. Recovery asks :meth:`Catalog.pending` for marked rows older than a grace period and finishes or rolls
them back: it never scans the vectors or the blobs, and it needs no process ids, so it works across hosts.

The port speaks plain values only: entries go in and come out as :class:`EntryRecord` (a slotted dataclass, no
database session behind it), scopes are :class:`CatalogScope` values that each catalog translates itself, history
is :class:`HistoryEvent`. A catalog is written against this module alone: the SQL catalogs
(:mod:`agentmem.backends.sqlite.catalog`, :mod:`agentmem.backends.postgres`) map records to their SQLAlchemy rows
inside the backend; :mod:`agentmem.backends.in_memory` keeps them in dicts. Every catalog passes
tests/conformance/test_catalog*.py.

Example:
    >>> from agentmem.ports.catalog import Catalog
    >>> from agentmem.backends.sqlite.catalog import SqliteCatalog
    >>> cat = SqliteCatalog(":memory:")
    >>> isinstance(cat, Catalog)
    True
    >>> cat.insert([EntryRecord(id="e1", user_id="u", kind="fact", text="hi", memory_text="hi", created_at=0.0,
    ...                         tags=("t",))], index_texts=["hi"])
    >>> [(r.id, r.tags) for r in cat.get(["e1", "gone"])], cat.list_entries(CatalogScope(tags=("t",)))[0].id
    ([('e1', ('t',))], 'e1')
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable


class TurnContext(NamedTuple):
    """Where an entry sits: its session and the nearest conversation turns before / after it (``turn``: whether it
    has a place in the turn order itself, a ``kind="turn"`` entry with a session; other entries have no neighbours).

    Example:
        >>> TurnContext("s1", ("t1",), (), turn=True).before
        ('t1',)
    """

    session_id: str | None
    before: tuple[str, ...]
    after: tuple[str, ...]
    turn: bool = False


@dataclass(slots=True, eq=False, kw_only=True)
class EntryRecord:
    """One entry as the catalog stores it: what :meth:`Catalog.insert` takes and every read returns.

    A plain value with no database session behind it: changing one changes nothing stored (writes go through the
    catalog's methods). ``tags`` is the entry's tag set (sorted when read back). ``eq=False``: records compare and
    hash by identity (recall keys its dicts by id anyway).

    Example:
        >>> r = EntryRecord(id="e1", user_id="u", kind="turn", text="hi", memory_text="hi", created_at=0.0)
        >>> r.status, r.version, r.tags, r.write_state
        ('active', 1, (), None)
    """

    id: str
    user_id: str
    session_id: str | None = None
    kind: str
    role: str | None = None
    speaker: str | None = None
    occurred_at: str | None = None
    text: str
    memory_text: str
    metadata_json: dict[str, Any] = field(default_factory=dict)
    created_at: float
    expires_at: float | None = None
    # KV blob attached by the KV bank (all None until the entry is encoded)
    kv_path: str | None = None
    kv_tokens: int | None = None
    kv_fingerprint: str | None = None
    kv_dtype: str | None = None
    kb_version: str | None = None
    # write state: None = committed and visible; "adding" / "deleting" = hidden, in flight or abandoned
    write_state: str | None = None
    write_since: float | None = None
    kv_staged_at: float | None = None  # a blob write in flight (Catalog.set_kv)
    # lifecycle (agentmem/entries/lifecycle.py)
    version: int = 1
    status: str = "active"
    superseded_by: str | None = None
    seen_count: int = 1
    last_seen_at: float | None = None
    indexed: bool = True  # False: stored but not embedded (LangGraph index=False)
    text_vector: bytes | None = None  # the plain text's unit vector (float16 bytes), None = not computed
    # a text of several sentences: the unit vectors of those that state something (float16 bytes, b"" for none),
    # None = one sentence, or not computed (agentmem.entries.text_vectors)
    sentence_vectors: bytes | None = None
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CatalogScope:
    """Which committed entries a listing or id walk covers: every field given must hold (all ``tags`` present;
    ``kinds``: any of them; ``alive_at``: not expired at that time; ``expired_by``: expired at or before that time,
    what the sweep erases; ``has_successor``: with (True) or without (False) a ``superseded_by``, any status: where
    a user's version chains start; ``created_after`` / ``created_before``: created strictly after / before that
    time, a new turn's neighbours in its session). The empty scope is every entry.

    Example:
        >>> CatalogScope(user_id="u", tags=("a",)).admits(
        ...     EntryRecord(id="e", user_id="u", kind="turn", text="", memory_text="", created_at=0.0, tags=("a", "b")))
        True
    """

    user_id: str | None = None
    session_id: str | None = None
    kinds: Sequence[str] | None = None
    tags: Sequence[str] | None = None
    alive_at: float | None = None
    expired_by: float | None = None
    has_successor: bool | None = None
    created_after: float | None = None
    created_before: float | None = None

    def admits(self, record: EntryRecord) -> bool:
        """Whether a (committed) ``record`` is in the scope: the meaning every catalog's translation keeps."""
        return ((self.user_id is None or record.user_id == self.user_id)
                and (self.session_id is None or record.session_id == self.session_id)
                and (not self.kinds or record.kind in self.kinds)
                and set(self.tags or ()) <= set(record.tags)
                and (self.alive_at is None or record.expires_at is None or record.expires_at > self.alive_at)
                and (self.expired_by is None or (record.expires_at is not None
                                                 and record.expires_at <= self.expired_by))
                and (self.has_successor is None or (record.superseded_by is not None) == self.has_successor)
                and (self.created_after is None or record.created_at > self.created_after)
                and (self.created_before is None or record.created_at < self.created_before))


# Entry statuses (docs/lifecycle.md): ``active`` entries are recalled and mounted; ``superseded`` (a newer entry
# replaced them, ``superseded_by`` names it) and ``deleted`` (consolidation retracted them) stay, never mounted.
ACTIVE, SUPERSEDED, DELETED = "active", "superseded", "deleted"
# the columns Catalog.set_kv writes: the KV blob an entry names
KV_FIELDS = frozenset({"kv_path", "kv_tokens", "kv_fingerprint", "kv_dtype", "kb_version"})
# what a history event can record
OPS = ("add", "update", "supersede", "merge", "delete", "restore")
# the status an event's op moves its entry to (Catalog.apply_event; "merge" leaves it, counting a sighting)
STATUS_OF = {"supersede": SUPERSEDED, "delete": DELETED, "restore": ACTIVE}


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
# chain ends compare it: agentmem.entries.chain_ends)
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
    def insert(self, records: Sequence[EntryRecord], *, index_texts: Sequence[str | None], pending: bool = False,
               history: Sequence[HistoryEvent] = ()) -> None:
        """Insert entries with their tags, lexical documents (None: stored, not indexed) and history events in one
        transaction; ``pending`` hides them until :meth:`commit`. The records' ``write_state`` is not read. (A catalog that a vector index joins,
        :class:`~agentmem.ports.abilities.JoinsCatalogTransaction`, also takes ``extra=``: a callable run inside
        the same transaction.)"""
        ...

    def commit(self, ids: Sequence[str]) -> None:
        """Make pending rows visible (their vectors and blobs are in)."""
        ...

    def mark_deleting(self, ids: Sequence[str]) -> list[EntryRecord]:
        """Hide rows and mark them for deletion; returns the rows marked (to erase their vectors and blobs)."""
        ...

    def delete(self, ids: Sequence[str]) -> list[EntryRecord]:
        """Delete rows, tags and lexical documents; returns what was deleted."""
        ...

    def set_kv(self, entry_id: str, kv: Mapping[str, Any] | None, *, version: int | None = None) -> bool:
        """The one write of an entry's KV blob fields. ``kv=None``: a blob write starts; mark it in flight on the
        committed row (:meth:`pending` lists it until it ends), or return False with nothing written if there is
        none (with ``version``: none at that version, the blob was made from an older text). A mapping of KV
        fields (:data:`KV_FIELDS`; ``{}``: none): the
        write ended; set them and clear the mark; False if the row is gone. Other keys: :class:`ValueError`."""
        ...

    def pending(self, older_than: float) -> list[EntryRecord]:
        """Rows with a write or deletion (or blob write) marked before ``older_than`` (epoch seconds)."""
        ...

    def set_info(self, key: str, value: str) -> None:
        """Keep a fact about the store (``key`` -> ``value``, replacing an earlier one)."""
        ...

    def infos(self, keys: Sequence[str]) -> dict[str, str]:
        """The facts kept under ``keys``, in one read (keys without a value are left out)."""
        ...

    def info_items(self, prefix: str, *, after: str = "") -> list[tuple[str, str]]:
        """``(key, value)`` of the facts whose key starts with ``prefix`` and sorts after ``after``, in key order
        (the erasure journal every process on a shared store reads: :class:`agentmem.forgetting.ErasureJournal`)."""
        ...

    def delete_infos(self, keys: Sequence[str]) -> None:
        """Forget the facts kept under ``keys`` (keys without a value are ignored)."""
        ...

    # --- reads (committed rows only) -------------------------------------------------------------
    def get(self, ids: Sequence[str]) -> list[EntryRecord]:
        """Committed entries for ``ids`` in the order given; missing or uncommitted ids are skipped."""
        ...

    def iter_ids(self, scope: CatalogScope, *, page_size: int = 1000) -> Iterator[list[str]]:
        """Every id in ``scope``, in pages of at most ``page_size``, ascending (no silent cap)."""
        ...

    def list_entries(self, scope: CatalogScope, *, limit: int | None = None, offset: int = 0,
                     newest_first: bool = False) -> list[EntryRecord]:
        """The entries in ``scope`` ordered by (``created_at``, ``id``) (``newest_first``: the reverse), ``offset``
        skipped, at most ``limit``."""
        ...

    def lexical_search(self, query: str, *, user_id: str, limit: int,
                       blind: Callable[[str], str] | None = None) -> list[tuple[str, float]]:
        """Lexical (BM25-like, per-user statistics) search: ``[(id, score)]``, best first, score > 0."""
        ...

    def turn_context(self, ids: Sequence[str], *, window: int = 2, committed: bool = True) -> dict[str, TurnContext]:
        """Where each entry among ``ids`` sits: its session and, for a turn (``kind="turn"`` with a session), the
        ``window`` nearest committed turns of the same user and session before and after it, nearest first (recall's
        placement; ``window=1``: the neighbours context vectors are built from). ``committed=False`` answers for
        rows marked in flight too (rows being erased still know their place); rows in flight are never a
        neighbour. Missing ids are left out."""
        ...

    def scrub(self, user_ids: Iterable[str] | None = None, *, vacuum: bool = False) -> None:
        """Push erased bytes out of the backend's free space and logs, where it can (``vacuum``: rewrite pages)."""
        ...

    # --- lifecycle: versions, statuses and history (agentmem/entries/lifecycle.py), each one transaction --------
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

    def apply_event(self, event: HistoryEvent) -> bool:
        """Make the change ``event`` records on its entry and log it, one transaction, or return False with nothing
        written (the entry is gone or not in the state the change starts from). By ``event.op``
        (:data:`STATUS_OF`): ``supersede`` / ``delete`` mark an :data:`ACTIVE` entry :data:`SUPERSEDED` /
        :data:`DELETED` with ``superseded_by`` = ``event.related_id``; ``restore`` makes a superseded or deleted
        entry active again, clears ``superseded_by`` and moves the chain-cut stamp (:data:`CHAIN_CUTS_KEY`);
        ``merge`` counts one more sighting (``seen_count`` + 1, ``last_seen_at`` = ``event.at``). ``add`` and
        ``update`` are written with :meth:`insert` / :meth:`replace_entry`: :class:`ValueError` here."""
        ...

    def close(self) -> None: ...


__all__ = ["ACTIVE", "CHAIN_CUTS_KEY", "DELETED", "KV_FIELDS", "OPS", "STATUS_OF", "SUPERSEDED", "Catalog", "CatalogScope", "EntryRecord", "HistoryEvent",
           "TurnContext", "chain_cuts_value"]
