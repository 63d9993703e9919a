"""Recall reads its rows as read-only records (``Catalog.records``, a Core SELECT: agentmem/backends/sqlite/entry_records.py)
instead of ORM instances (``Catalog.get``). The two paths must give the same hits, to the last field and score: the
same store is recalled through both, for probe queries that reach the version following, the tag / filter
fallback, expired and superseded entries, and the conflict check."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentmem import AgentMemory
from agentmem.backends.sqlite.entry_records import _FIELDS
from agentmem.ports.catalog import EntryRecord
from agentmem.entries.lifecycle import SUPERSEDED, HistoryEvent

NOTES = [
    ("I ate sushi at the market on Monday.", "Ann", ["food"], {"mood": "happy"}),
    ("Pizza from the market stall was cheap.", "Ann", ["food", "cheap"], {"price": 4}),
    ("The market sells fresh ramen noodles.", "Bob", [], {}),
    ("Lately it is only risotto for me.", "Ann", ["food"], {"mood": "bored"}),
    ("My sister moved to Lyon last spring.", "Bob", ["family"], {"city": "Lyon"}),
    ("We booked a trip to Porto for the wedding.", "Ann", ["travel"], {}),
    ("The dentist appointment is on Friday at 9.", "Bob", ["health"], {"when": "friday"}),
    ("Grandma painted the old piano red.", "Ann", [], {"color": "red"}),
    ("Tom fixed the broken heater in January.", "Bob", ["home"], {}),
    ("I lost the concert tickets again.", "Ann", ["music"], {"n": [1, 2]}),
]
PROBES = ["Which food did I eat at the market?", "where did my sister move?", "when is the dentist?",
          "what did grandma paint?", "who fixed the heater?", "concert tickets", "trip to Porto wedding",
          "what does Ann like to eat?", "noodles", "something nobody said"]


@pytest.fixture
def mem(tmp_path: Path) -> Iterator[AgentMemory]:
    with AgentMemory(tmp_path / "m", kv_encoding="off") as m:
        yield m


def _fill(mem: AgentMemory) -> list[str]:
    ids = []
    for n, (text, speaker, tags, meta) in enumerate(NOTES):
        ids.append(mem.remember(text, user_id="u1", session_id=f"s{n % 3}", speaker=speaker, tags=tags,
                                metadata=meta).id)
    mem.remember("The market closes at noon today.", user_id="u1", ttl=0.05)  # expired by the time we recall
    mem.remember("Sushi for the other user.", user_id="u2")
    # a chain the way another process's consolidation writes it: sushi -> pizza -> risotto
    for old, new in ((ids[0], ids[1]), (ids[1], ids[3])):
        event = HistoryEvent(old, 1, "supersede", "", time.time(), "test", related_id=new)
        assert mem._store.lifecycle.set_status(old, SUPERSEDED, event, superseded_by=new)
    time.sleep(0.06)
    return ids


def _recalls(mem: AgentMemory) -> list[list[object]]:
    out = []
    for query in PROBES:
        for kwargs in ({}, {"k": 3}, {"include_superseded": True}, {"tags": ["food"]},
                       {"filters": {"mood": "bored"}}, {"session_id": "s1"}):
            out.append(mem.recall(query, user_id="u1", **kwargs))
    return out


def test_recall_through_records_equals_recall_through_orm_rows(mem: AgentMemory) -> None:
    _fill(mem)
    catalog = mem._store.catalog
    fast = _recalls(mem)
    mem._store.chains.clear()
    catalog.records = catalog.get  # the ORM path, as recall read rows before records existed
    try:
        orm = _recalls(mem)
    finally:
        del catalog.records
    assert fast == orm  # every Hit field (texts, tags, metadata, versions, status) and every score
    assert any(fast) and any(h.tags for hits in fast for h in hits)
    assert any(h.status == "superseded" for hits in fast for h in hits)  # include_superseded reached them


def test_records_are_the_committed_rows_with_every_column(mem: AgentMemory) -> None:
    ids = _fill(mem)
    catalog = mem._store.catalog
    wanted = [ids[4], "missing", *ids[:3]]
    records, rows = catalog.records(wanted), catalog.get(wanted)
    assert [r.id for r in records] == [r.id for r in rows] == [ids[4], *ids[:3]]
    for record, row in zip(records, rows):
        assert isinstance(record, EntryRecord)
        assert {k: getattr(record, k) for k in (*_FIELDS, "tags")} == {k: getattr(row, k) for k in (*_FIELDS, "tags")}
    assert records[0].tags == ("family",) and records[1].superseded_by == ids[1]
