"""What remember() did (issue #37): ADD / UPDATE / NOOP on the record, only exact restatements merge, a differing
write is never discarded, and a wrong supersession can be undone with ``restore``."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from agentmem import AgentMemory, InvalidInputError, NotFoundError

# the facade on the SQLite file and on the in-process catalog written against the port alone (tests/conftest.py)
pytestmark = pytest.mark.catalogs(None, "memory")

_CHATTER = ["The weather was lovely this weekend.", "I need to buy more coffee filters.",
            "My sister visited yesterday."]


def test_the_issue_example_keeps_the_new_dose(mem: AgentMemory) -> None:
    five = mem.remember("I take 5 mg of amlodipine daily.", user_id="u", session_id="s")
    ten = mem.remember("I take 10 mg of amlodipine daily.", user_id="u", session_id="s")
    assert five.event == "ADD" and ten.event in ("ADD", "UPDATE")
    assert ten.text == "I take 10 mg of amlodipine daily." and ten.id != five.id
    texts = {r.text: r.status for r in mem.list(user_id="u")}
    assert texts["I take 10 mg of amlodipine daily."] == "active" and "I take 5 mg of amlodipine daily." in texts
    # the newer statement answers the question first
    assert mem.recall("what dose of amlodipine do I take?", user_id="u", k=1)[0].id == ten.id


@pytest.mark.parametrize("again", ["I live in Lyon.", "i live in lyon", "I  live in Lyon!", " I live, in Lyon. "])
def test_only_a_restatement_with_the_same_normalised_text_merges(mem: AgentMemory, again: str) -> None:
    first = mem.remember("I live in Lyon.", user_id="u1")
    rec = mem.remember(again, user_id="u1")
    assert rec.event == "NOOP" and rec.matched_id == first.id and rec.id == first.id and rec.seen_count == 2
    assert [r.id for r in mem.list(user_id="u1")] == [first.id]
    assert [(v.op, v.text) for v in mem.history(first.id)] == [("add", "I live in Lyon."), ("merge", again)]


@pytest.mark.parametrize("old,new", [
    ("My PIN is 4821.", "My PIN is 4822."),
    ("The meeting moved to Tuesday.", "The meeting moved to Thursday."),
    ("My flight is LH 4410.", "My flight is LH 4401."),
    ("My brother's name is Tom.", "My brother's name is Tim."),
    ("It costs 5.5 EUR.", "It costs 55 EUR."),  # punctuation inside a number is part of the value
    ("The temperature was -5 degrees.", "The temperature was 5 degrees."),
    ("I paid $40.", "I paid €40."),
    ("I live in Lyon.", "I live in Lyon, France."),
])
def test_a_differing_write_is_never_merged(mem: AgentMemory, old: str, new: str) -> None:
    first = mem.remember(old, user_id="u1")
    rec = mem.remember(new, user_id="u1")
    assert rec.event != "NOOP" and rec.matched_id is None and rec.id != first.id and rec.text == new
    assert {r.text for r in mem.list(user_id="u1")} == {old, new}


def test_forty_numbered_notes_stay_forty_and_are_all_erased(mem: AgentMemory) -> None:
    notes = [f"note number {i} about gardening" for i in range(40)]
    others = [f"The parcel for order {1000 + i} arrived on day {i % 28 + 1}." for i in range(90)]
    records = [mem.remember(t, user_id="g", session_id="s") for t in notes + others]
    assert len({r.id for r in records}) == 130 and {r.event for r in records} <= {"ADD", "UPDATE"}
    assert sorted(r.text for r in mem.list(user_id="g")) == sorted(notes + others)
    assert mem.forget(user_id="g") == 130
    assert mem.list(user_id="g") == []


def test_an_update_names_what_it_superseded(mem: AgentMemory) -> None:
    blue = mem.remember("My favorite color is blue.", user_id="u1")
    for line in _CHATTER:
        assert mem.remember(line, user_id="u1").event == "ADD"
    green = mem.remember("My favorite color is green now.", user_id="u1")
    assert green.event == "UPDATE" and green.superseded_ids == (blue.id,) and green.matched_id is None
    assert mem.get(blue.id).superseded_by == green.id
    # a plain read carries no event: it describes the entry, not a write
    assert mem.get(green.id).event is None and mem.list(user_id="u1")[0].event is None


@pytest.mark.parametrize("sessions,replaced", [(("monday", "friday"), True), (("monday", "monday"), False)])
def test_a_turn_of_the_same_session_is_not_superseded(mem: AgentMemory, sessions: tuple[str, str],
                                                      replaced: bool) -> None:
    """Within one conversation session a speaker elaborates on a topic (REALTALK: turns hidden that questions asked
    about); a fact that changes does so between sessions, and then the newer supersedes the older."""
    old = mem.remember("My favorite color is blue.", user_id="u1", session_id=sessions[0])
    for line in _CHATTER:
        mem.remember(line, user_id="u1", session_id=sessions[0])
    new = mem.remember("My favorite color is green now.", user_id="u1", session_id=sessions[1])
    assert new.event == ("UPDATE" if replaced else "ADD")
    assert mem.get(old.id).status == ("superseded" if replaced else "active")
    assert {r.text for r in mem.list(user_id="u1")} >= {old.text, new.text}


@pytest.mark.parametrize("old_text,replaced", [
    ("My favorite color is blue.", True),
    ("My favorite color is blue. I painted my whole bedroom in it last spring.", False)])
def test_only_a_one_sentence_memory_is_superseded(mem: AgentMemory, old_text: str, replaced: bool) -> None:
    """A newer statement replaces one fact; a memory of several sentences states others, which superseding it would
    hide (REALTALK: "My cat, Fluffy, keeps me company. Haha!" hidden by "By the way, I got a new dog!"). Both
    stand, and recall still answers with the newer first."""
    old = mem.remember(old_text, user_id="u1", session_id="monday")
    for line in _CHATTER:
        mem.remember(line, user_id="u1", session_id="monday")
    new = mem.remember("My favorite color is green now.", user_id="u1", session_id="friday")
    assert new.event == ("UPDATE" if replaced else "ADD")
    assert mem.get(old.id).status == ("superseded" if replaced else "active")
    assert mem.recall("What is my favorite color?", user_id="u1", k=1)[0].id == new.id


def test_remember_many_reports_each_event(mem: AgentMemory) -> None:
    recs = mem.remember_many([{"text": "I live in Lyon.", "user_id": "u1"},
                              {"text": "I live in Lyon", "user_id": "u1"},
                              {"text": "My sister visited yesterday.", "user_id": "u1"}])
    assert [r.event for r in recs] == ["ADD", "NOOP", "ADD"]
    assert recs[1].matched_id == recs[0].id == recs[1].id
    again = mem.remember_many([{"text": "i live in lyon.", "user_id": "u1"}])
    assert again[0].event == "NOOP" and again[0].matched_id == recs[0].id
    raw = mem.remember_many([{"text": "I live in Lyon.", "user_id": "u1"}], consolidate=False)
    assert raw[0].event == "ADD" and raw[0].id != recs[0].id


def test_consolidation_off_adds_everything(tmp_path: Path, catalog_url: str | None) -> None:
    with AgentMemory(tmp_path / "s", consolidation="off", catalog_url=catalog_url) as mem:
        a = mem.remember("I live in Lyon.", user_id="u1")
        b = mem.remember("I live in Lyon.", user_id="u1")
        assert (a.event, b.event) == ("ADD", "ADD") and a.id != b.id


def test_restore_undoes_a_wrong_supersession(mem: AgentMemory) -> None:
    blue = mem.remember("My favorite color is blue.", user_id="u1")
    for line in _CHATTER:
        mem.remember(line, user_id="u1")
    green = mem.remember("My favorite color is green now.", user_id="u1")
    assert green.event == "UPDATE"
    back = mem.restore(blue.id)
    assert back.id == blue.id and back.status == "active" and back.superseded_by is None
    assert back.text == "My favorite color is blue." and back.version == 1
    assert mem.get(green.id).status == "active"  # the newer stays until the user forgets it
    last = mem.history(blue.id)[-1]
    assert (last.op, last.related_id) == ("restore", green.id) and last.text == "My favorite color is blue."
    ids = [h.id for h in mem.recall("what is my favorite color?", user_id="u1", k=5)]
    assert blue.id in ids and green.id in ids
    with pytest.raises(InvalidInputError, match="active"):
        mem.restore(blue.id)  # nothing to undo


def test_restore_brings_back_an_earlier_version_of_an_updated_entry(mem: AgentMemory) -> None:
    rec = mem.remember("My locker code is 4411.", user_id="u1")
    mem.update(rec.id, text="My locker code is 9023.")
    back = mem.restore(rec.id, version=1)
    assert back.version == 3 and back.text == "My locker code is 4411." and back.status == "active"
    assert [(v.op, v.version) for v in mem.history(rec.id)] == [("add", 1), ("update", 2), ("restore", 3)]
    assert mem.recall("locker code", user_id="u1", k=1)[0].text == "My locker code is 4411."
    with pytest.raises(InvalidInputError, match="version"):
        mem.restore(rec.id, version=7)
    with pytest.raises(NotFoundError):
        mem.restore("no-such-id")


@pytest.mark.parametrize("second,kept", [
    ("My dog Rex is three years old.", True),  # the model says "nothing new", but the text differs: both stand
    ("i have a dog called rex", False),  # the same statement: counted on the existing memory
])
def test_an_llm_noop_merges_only_a_restatement(tmp_path: Path, second: str, kept: bool) -> None:
    chat = FakeListChatModel(responses=['{"event": "NOOP", "id": 0, "reason": "same"}'])
    with AgentMemory(tmp_path / "s", consolidation="llm", consolidation_model=chat) as mem:
        first = mem.remember("I have a dog called Rex.", user_id="u1")
        rec = mem.remember(second, user_id="u1")
        assert rec.event == "ADD"  # stored; the model decides afterwards, on its worker
        assert mem.wait_consolidation(30)
        ids = [r.id for r in mem.list(user_id="u1")]
        assert (rec.id in ids) is kept and mem.get(first.id).status == "active"
        assert mem.history(first.id)[-1].op == ("add" if kept else "merge")


def test_export_and_import_carry_restored_versions(mem: AgentMemory, tmp_path: Path) -> None:
    from agentmem.export_import import export_records, import_records

    rec = mem.remember("My locker code is 4411.", user_id="u1")
    mem.update(rec.id, text="My locker code is 9023.")
    mem.restore(rec.id, version=1)
    lines = list(export_records(mem, ["u1"]))
    assert "event" not in lines[0]  # what a write did is not part of the entry
    with AgentMemory(tmp_path / "copy") as other:
        import_records(other, lines)
        (copy,) = other.list(user_id="u1")
        assert copy.text == "My locker code is 4411." and copy.version == 3
