"""Recall remembers where superseded_by chains end (agentmem/entries/chain_ends.py): no chain query once a chain is
known, and a chain that grew, or an entry superseded since, behind the store's back (as another process would do
it: straight in the catalog) is still followed to its current end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentmem import AgentMemory
from agentmem.entries.lifecycle import SUPERSEDED, HistoryEvent

QUERY = "Which food did I eat at the market?"
# notes the pairwise model does not take for updates of one another (the chains are the tests' own); the last two
# match the query worse than the distractors: they reach the top only by taking a superseded note's place
NOTES = ["I ate sushi at the market on Monday.", "Pizza from the market stall was cheap.",
         "The market sells fresh ramen noodles.", "Lately it is only risotto for me.", "Gnocchi, every single day."]
DISTRACTORS = ("The market was busy on Saturday.", "I walked past the market twice.")


@pytest.fixture
def mem(tmp_path: Path) -> Iterator[AgentMemory]:
    # without the conflict check: it may move a current version below k (its own tests are elsewhere)
    with AgentMemory(tmp_path / "m", kv_encoding="off", recall_conflict_demotion=False) as m:
        yield m


def _supersede(mem: AgentMemory, old_id: str, new_id: str) -> None:
    """Mark ``old_id`` replaced in the catalog only, the way another process's consolidation does."""
    event = HistoryEvent(old_id, 1, "supersede", "", time.time(), "test", related_id=new_id)
    assert mem._store.lifecycle.apply_event(event)


def _foods(mem: AgentMemory) -> list[str]:
    ids = [mem.remember(text, user_id="u1", session_id=f"s{n}").id for n, text in enumerate(NOTES)]
    for text in DISTRACTORS:
        mem.remember(text, user_id="u1")
    assert all(mem.get(i).status == "active" for i in ids)
    return ids


def test_a_known_chain_costs_no_query_and_a_grown_chain_is_followed_to_its_new_end(mem: AgentMemory) -> None:
    ids = _foods(mem)
    for old, new in zip(ids[:3], ids[1:3]):  # sushi -> pizza -> ramen; tacos, paella active
        _supersede(mem, old, new)
    chains = mem._store.chains
    chains.clear()
    first = [h.id for h in mem.recall(QUERY, user_id="u1", k=3, include_superseded=False)]
    assert ids[2] in first and not {ids[0], ids[1]} & set(first)
    looked_up = chains.lookups
    again = [h.id for h in mem.recall(QUERY, user_id="u1", k=3)]
    assert again == first and chains.lookups == looked_up  # every chain (and "not superseded") remembered
    assert looked_up == 1  # the user's every chain, at the first recall
    other = [h.id for h in mem.recall("Where did I buy noodles?", user_id="u1", k=3)]  # other candidates
    assert other and chains.lookups == looked_up and not {ids[0], ids[1]} & set(other)
    # behind the cache's back: ramen -> risotto (the remembered end is superseded now)
    _supersede(mem, ids[2], ids[3])
    hits = [h.id for h in mem.recall(QUERY, user_id="u1", k=3)]
    assert hits[0] == ids[3] and not set(ids[:3]) & set(hits)  # in sushi's place
    assert chains.lookups == looked_up + 1  # one more query, for the chains the loaded rows contradicted


def test_an_entry_remembered_as_current_that_was_superseded_since_stands_for_its_successor(mem: AgentMemory) -> None:
    ids = _foods(mem)
    before = [h.id for h in mem.recall(QUERY, user_id="u1", k=5)]  # remembered: nothing superseded
    assert ids[0] in before or any(mem.get(i).status == SUPERSEDED for i in ids)
    for old, new in zip(ids, ids[1:]):  # sushi -> ... -> gnocchi, straight in the catalog
        _supersede(mem, old, new)
    hits = [h.id for h in mem.recall(QUERY, user_id="u1", k=3)]
    assert hits[0] == ids[-1] and not set(ids[:-1]) & set(hits)


def test_forgetting_an_entry_forgets_the_chains_through_it(mem: AgentMemory) -> None:
    ids = _foods(mem)
    for old, new in zip(ids, ids[1:]):
        _supersede(mem, old, new)
    assert mem.recall(QUERY, user_id="u1", k=1)[0].id == ids[-1]
    known = mem._store.chains.lookups
    mem.forget(ids[2])  # the chain is cut in the middle: sushi and pizza stand for nothing now
    hits = [h.id for h in mem.recall(QUERY, user_id="u1", k=3)]
    assert mem._store.chains.lookups > known and not set(ids) & set(hits[:1])  # a distractor first
    mem._store.chains.clear()
    assert [h.id for h in mem.recall(QUERY, user_id="u1", k=3)] == hits  # what a fresh lookup gives
