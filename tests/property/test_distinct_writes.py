"""Property: a write that differs from an older one in one value is never discarded (issue #37).

Hypothesis generates statement pairs that differ in exactly one value token — numbers, dates, weekdays, names,
codes, amounts with units, times — written by the same user (with or without other memories before, in the same
conversation session or not), with the default ``consolidation="local"``. Whatever consolidation decides (both
stand: ADD, or the newer supersedes the older: UPDATE), both texts stay reachable and the newer is never the one
hidden: ``remember()`` returns the newer text, ``get`` finds it active, and the older is still readable by ``get``
(active, or superseded by the newer and kept in its ``history``).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentmem import AgentMemory

NAMES = ["Tom", "Anna", "Luis", "Mei", "Omar", "Ingrid", "Pavel", "Chloe", "Kenji", "Fatima"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "March", "May", "July", "September", "November"]

# (template, strategy of its value): every template holds one value slot, the rest of the sentence is the same
VALUE_KINDS: dict[str, tuple[list[str], st.SearchStrategy[str]]] = {
    "number": (["I have {v} cousins on my mother's side.", "Our flat is on floor {v}.",
                "note number {v} about gardening"], st.integers(0, 999).map(str)),
    "amount": (["I take {v} of amlodipine daily.", "My rent is {v} a month.", "I weigh {v}."],
               st.builds(lambda n, unit: f"{n} {unit}", st.integers(1, 500), st.sampled_from(["mg", "kg", "EUR"]))),
    "money": (["The plumber charged ${v} for the repair."], st.integers(10, 9999).map(str)),
    "date": (["My passport expires on {v}.", "The wedding is on {v}."],
             st.builds(lambda d, m, y: f"{m} {d}, {y}", st.integers(1, 28), st.sampled_from(MONTHS),
                       st.integers(2024, 2030))),
    "weekday": (["The team meeting is on {v} at ten.", "I go swimming every {v}."], st.sampled_from(WEEKDAYS)),
    "name": (["My brother's name is {v}.", "My manager is {v}.", "The dentist I see is Dr. {v}."],
             st.sampled_from(NAMES)),
    "code": (["My bank PIN is {v}.", "The door code at the office is {v}."],
             st.integers(1000, 9999).map(str)),
    "flight": (["My flight to Oslo is {v}.", "The booking reference is {v}."],
               st.builds(lambda a, n: f"{a}{n}", st.sampled_from(["LH", "SK", "BA", "AF"]), st.integers(10, 999))),
    "time": (["My alarm is set for {v} every morning."],
             st.builds(lambda h, m: f"{h}:{m:02d}", st.integers(5, 9), st.sampled_from([0, 15, 30, 45]))),
}
CHATTER = ["The weather was lovely this weekend.", "I need to buy more coffee filters.",
           "My sister visited yesterday.", "We watched a documentary about whales."]


@st.composite
def differing_pairs(draw: st.DrawFn) -> tuple[str, str, int, bool]:
    """(older text, newer text, how many other memories come first, same session or not)."""
    templates, values = VALUE_KINDS[draw(st.sampled_from(sorted(VALUE_KINDS)))]
    template = draw(st.sampled_from(templates))
    old = draw(values)
    new = draw(values.filter(lambda v: v != old))
    return template.format(v=old), template.format(v=new), draw(st.integers(0, len(CHATTER))), draw(st.booleans())


@pytest.fixture(scope="module")
def shared_mem(tmp_path_factory: pytest.TempPathFactory):
    # one store for every example (opening one costs seconds); each example writes as a user of its own
    with AgentMemory(Path(tmp_path_factory.mktemp("distinct")) / "s") as mem:
        yield mem


_users = itertools.count()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=differing_pairs())
def test_a_write_differing_in_one_value_is_never_lost(shared_mem: AgentMemory,
                                                       pair: tuple[str, str, int, bool]) -> None:
    old_text, new_text, chatter, same_session = pair
    user = f"u{next(_users)}"
    for line in CHATTER[:chatter]:
        shared_mem.remember(line, user_id=user, session_id="s0")
    older = shared_mem.remember(old_text, user_id=user, session_id="s1")
    newer = shared_mem.remember(new_text, user_id=user, session_id="s1" if same_session else "s2")
    # the write says what it did, and it kept the newer statement
    assert newer.text == new_text and newer.id != older.id and newer.event in ("ADD", "UPDATE")
    assert shared_mem.get(newer.id).status == "active"
    # the older statement is still reachable: active beside it, or superseded by it (kept in its history)
    old_now = shared_mem.get(older.id)
    assert old_now.text == old_text
    if newer.event == "UPDATE":
        assert older.id in newer.superseded_ids
        assert old_now.status == "superseded" and old_now.superseded_by == newer.id
        assert shared_mem.history(older.id)[-1].related_id == newer.id
    else:
        assert old_now.status == "active" and newer.superseded_ids == ()
    listed = {r.text for r in shared_mem.list(user_id=user)}
    assert {old_text, new_text} <= listed
