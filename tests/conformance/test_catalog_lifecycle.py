"""The Catalog port's lifecycle methods (history, chain ends, replace, events: statuses and sightings) on every catalog.

Same catalogs as tests/conformance/test_catalog.py: SQLite under tmp, a fresh PostgreSQL database and the in-memory one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentmem.ports import Catalog
from agentmem.ports.catalog import ACTIVE, CHAIN_CUTS_KEY, DELETED, SUPERSEDED, HistoryEvent, chain_cuts_value

from tests.conformance.test_catalog import BACKENDS, _add, _row, make_catalog


@pytest.fixture(params=BACKENDS)
def cat(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Catalog]:
    c = make_catalog(request.param, request, tmp_path)
    yield c
    c.close()


def _event(entry_id: str, op: str, at: float, *, version: int = 1, related: str | None = None) -> HistoryEvent:
    return HistoryEvent(entry_id, version, op, f"{op} text of {entry_id}", at, f"why {op}", related)


def _stamp(cat: Catalog) -> int:
    return chain_cuts_value(cat.infos([CHAIN_CUTS_KEY]).get(CHAIN_CUTS_KEY))


def _chain(cat: Catalog, ids: list[str]) -> None:
    """ids[0] -> ids[1] -> ... -> ids[-1]: each but the last superseded by the next."""
    _add(cat, [_row(i, at=float(n)) for n, i in enumerate(ids)])
    for old, new in zip(ids, ids[1:]):
        assert cat.apply_event(_event(old, "supersede", 9.0, related=new))


def test_history_is_kept_oldest_first_and_erased_with_the_entry(cat: Catalog) -> None:
    later, first = _event("a", "update", 5.0, version=2, related="b"), _event("a", "add", 1.0)
    rows = [_row("a"), _row("b")]
    cat.insert(rows, index_texts=[r.text for r in rows], history=[later, first, _event("b", "add", 2.0)])
    assert cat.history("a") == [first, later]  # the same values come back, as plain events
    assert cat.history("nobody") == []
    cat.delete(["b"])
    assert cat.history("b") == [] and cat.history("a")[1].related_id is None  # no trace of b is left
    with pytest.raises(ValueError, match="rename"):
        HistoryEvent("a", 1, "rename", "x", 0.0)


def test_chain_ends_follow_superseded_links_to_the_current_entry(cat: Catalog) -> None:
    _chain(cat, ["v1", "v2", "v3", "v4"])
    _add(cat, [_row("alone")])
    assert cat.chain_ends(["v1", "v2", "v4", "alone", "missing"]) == {"v1": "v4", "v2": "v4"}
    assert cat.chain_ends(["v1"], longest=2) == {"v1": "v3"}  # cut after two links, on a superseded entry
    assert cat.chain_ends([]) == {}


def test_a_status_event_changes_only_active_entries_and_logs_once(cat: Catalog) -> None:
    _add(cat, [_row("old"), _row("new"), _row("dropped")])
    event = _event("old", "supersede", 3.0, related="new")
    assert cat.apply_event(event)
    row = cat.get(["old"])[0]
    assert (row.status, row.superseded_by) == (SUPERSEDED, "new")
    assert not cat.apply_event(_event("old", "delete", 4.0))  # no longer active: nothing written
    assert not cat.apply_event(_event("missing", "delete", 4.0))
    assert cat.history("old") == [event] and cat.history("missing") == []
    assert cat.get(["old"])[0].status == SUPERSEDED
    assert cat.apply_event(_event("dropped", "delete", 5.0))  # retracted: no successor named
    assert (cat.get(["dropped"])[0].status, cat.get(["dropped"])[0].superseded_by) == (DELETED, None)


def test_add_and_update_events_are_not_status_changes(cat: Catalog) -> None:
    _add(cat, [_row("e")])
    for op in ("add", "update"):
        with pytest.raises(ValueError, match=op):
            cat.apply_event(_event("e", op, 2.0))
    assert cat.history("e") == [] and cat.get(["e"])[0].version == 1


def test_restoring_makes_an_entry_current_and_moves_the_chain_cut_stamp(cat: Catalog) -> None:
    _chain(cat, ["a", "b", "c"])
    stamp = _stamp(cat)
    restore = _event("b", "restore", 10.0, version=2, related="c")
    assert cat.apply_event(restore)
    row = cat.get(["b"])[0]
    assert (row.status, row.superseded_by) == (ACTIVE, None)
    assert _stamp(cat) > stamp  # remembered chain ends through b are stale now
    assert cat.chain_ends(["a"]) == {"a": "b"}
    assert not cat.apply_event(_event("b", "restore", 11.0))  # already active: nothing written
    assert not cat.apply_event(_event("zz", "restore", 11.0))
    assert [e.op for e in cat.history("b")] == ["supersede", "restore"]


def test_a_merge_event_counts_a_sighting_on_the_existing_entry(cat: Catalog) -> None:
    _add(cat, [_row("e")])
    before = cat.get(["e"])[0].seen_count
    merge = _event("e", "merge", 42.5)
    assert cat.apply_event(merge)
    row = cat.get(["e"])[0]
    assert (row.seen_count, row.last_seen_at, row.status) == (before + 1, 42.5, ACTIVE)
    assert not cat.apply_event(_event("missing", "merge", 43.0))
    assert cat.history("e") == [merge] and cat.history("missing") == []


def test_replace_entry_rewrites_fields_tags_lexical_document_and_history_together(cat: Catalog) -> None:
    _add(cat, [_row("e", text="the spare key is under the flowerpot")], tags=[["home"]])
    update = _event("e", "update", 2.0, version=2)
    cat.replace_entry("e", {"text": "the spare key is in the mailbox", "version": 2}, index_text="key in the mailbox",
                      tags=["home", "keys", "home"], events=[update])
    row = cat.get(["e"])[0]
    assert (row.text, row.version, row.tags) == ("the spare key is in the mailbox", 2, ("home", "keys"))
    assert [i for i, _ in cat.lexical_search("mailbox", user_id="u", limit=5)] == ["e"]
    assert cat.lexical_search("flowerpot", user_id="u", limit=5) == []
    assert cat.history("e") == [update]
    cat.replace_entry("e", {"version": 3}, index_text=None, tags=None, events=[])  # stored, not indexed
    assert cat.lexical_search("mailbox", user_id="u", limit=5) == [] and cat.get(["e"])[0].tags == ("home", "keys")
    with pytest.raises(LookupError):
        cat.replace_entry("missing", {"version": 2}, index_text="x", tags=None,
                          events=[_event("missing", "update", 3.0)])
    assert cat.history("missing") == []


def test_replace_entry_taking_an_entry_out_of_a_chain_moves_the_stamp(cat: Catalog) -> None:
    _chain(cat, ["a", "b"])
    stamp = _stamp(cat)
    cat.replace_entry("b", {"version": 2}, index_text="t", tags=None, events=[])  # b is current: no chain moves
    assert _stamp(cat) == stamp
    cat.replace_entry("a", {"status": ACTIVE, "superseded_by": None}, index_text="t", tags=None, events=[])
    assert _stamp(cat) > stamp and cat.chain_ends(["a"]) == {}
