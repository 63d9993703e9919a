"""Memory lifecycle: versions, history events, superseded and merged entries, over the Catalog port only.

History is data, not logs: every event of an entry (``add``, ``update``, ``supersede``, ``merge``, ``delete``,
``restore``) is a :class:`HistoryEvent` the catalog keeps, holding the text of that version (sealed like the entry's
own text in encrypted stores), its time and the reason. Erasing an entry erases its history in the same transaction
(``Catalog.delete``).

Statuses: ``active`` entries are recalled and mounted; ``superseded`` ones (a newer entry replaced them,
``superseded_by`` names it) and ``deleted`` ones (consolidation retracted them) stay in the catalog, visible to
``history()`` and ``recall(include_superseded=True)``, and are never mounted. Each change below is one catalog
transaction together with the event recording it (the SQL lives in the backend: ``backends/sqlite/history.py``).

Example:
    >>> from agentmem.backends.sqlite.catalog import SqliteCatalog
    >>> from agentmem.ports.catalog import EntryRecord
    >>> cat = SqliteCatalog(":memory:")
    >>> cat.insert([EntryRecord(id="e1", user_id="u", kind="turn", text="hi", memory_text="hi", created_at=0.0)],
    ...            index_texts=["hi"])
    >>> life = Lifecycle(cat)
    >>> life.apply_event(HistoryEvent("e1", 1, "supersede", "hi", 1.0))
    True
    >>> [e.op for e in life.history("e1")], life.apply_event(HistoryEvent("e1", 1, "restore", "hi", 2.0))
    (['supersede'], True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentmem.ports.catalog import ACTIVE, DELETED, OPS, SUPERSEDED, Catalog, HistoryEvent


class Lifecycle:
    """History and status changes of catalog entries, each in one transaction with what it records."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def history(self, entry_id: str) -> list[HistoryEvent]:
        """The entry's events, oldest first."""
        return self.catalog.history(entry_id)

    def chain_ends(self, ids: Sequence[str], *, longest: int = 8) -> dict[str, str]:
        """For each superseded entry among ``ids``: the id at the end of its ``superseded_by`` chain (A -> B -> C
        gives A: C), in ONE recursive query whatever the chains' length; chains longer than ``longest`` end where
        they are cut (on a still-superseded entry). Ids that are not superseded (no ``superseded_by``) are left out.

        Example:
            >>> from agentmem.backends.sqlite.catalog import SqliteCatalog
            >>> from agentmem.ports.catalog import EntryRecord
            >>> cat = SqliteCatalog(":memory:")
            >>> cat.insert([EntryRecord(id=i, user_id="u", kind="fact", text=i, memory_text=i, created_at=0.0)
            ...             for i in "ABCD"], index_texts=list("ABCD"))
            >>> life = Lifecycle(cat)
            >>> [life.apply_event(HistoryEvent(old, 1, "supersede", old, 1.0, related_id=new))
            ...  for old, new in ["AB", "BC"]]  # A -> B -> C
            [True, True]
            >>> life.chain_ends(["A", "B", "C", "D"]), life.chain_ends(["A"], longest=1)  # C, D: not superseded
            ({'A': 'C', 'B': 'C'}, {'A': 'B'})
        """
        return self.catalog.chain_ends(ids, longest=longest) if ids else {}

    def replace(self, entry_id: str, fields: dict[str, Any], *, index_text: str | None,
                tags: Sequence[str] | None, events: Sequence[HistoryEvent]) -> None:
        """Overwrite the entry's fields, its lexical document (dropped when ``index_text`` is None: the entry is
        stored but not indexed), its tags (when given), and log ``events``, in one transaction."""
        self.catalog.replace_entry(entry_id, fields, index_text=index_text, tags=tags, events=events)

    def apply_event(self, event: HistoryEvent) -> bool:
        """Make the change ``event`` records, logged with it (``supersede`` / ``delete``: an active entry is
        superseded by / retracted in favour of ``event.related_id``; ``restore``: an inactive one is active again;
        ``merge``: a near-duplicate arrived, counted on the existing entry, no new row); False if the entry is gone
        or not in the state the change starts from."""
        return self.catalog.apply_event(event)


__all__ = ["ACTIVE", "DELETED", "OPS", "SUPERSEDED", "HistoryEvent", "Lifecycle"]
