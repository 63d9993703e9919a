"""A changed fact told inside a longer message: people rarely state a fact in a message of its own ("Hi! My name is
Dana Whitfield. I drive a blue Honda Civic."), and a later message that changes it ("I sold the Civic and
bought an electric Kia.") must rank before it and replace it in a mount, for a question about that fact only.

Taken whole, the message's vector dilutes the sentence the update replaces, and the pair stayed under the pairwise
model's threshold for a message: the stale car ranked first, and both were mounted. Recall's conflict check now
weighs the newer memory against the one sentence of the older message it replaces (each stated sentence's vector
stored with the row, schema 10) and acts when that sentence is the one the query is about; a question about another
fact of the message keeps it (``benchmarks/knowledge_update.py --natural --wrapped`` measures the effect on
hand-written updates and look-alikes).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agentmem import AgentMemory
from agentmem.entries.text_vectors import unpack_vectors

OLDER = "Hi! My name is Dana Whitfield. I drive a blue Honda Civic."
NEWER = "I sold the Civic and bought an electric Kia."
ASKED = "What car do I drive?"
# (older message, newer statement, question about the changed fact): taken whole, the first pair scores under the
# threshold for a message (the stale car ranked first); the second over it (a question about the message's other
# fact demoted it too, before the check read which sentence the query is about)
PAIRS = [(OLDER, NEWER, ASKED),
         ("Hi! My name is Dana Whitfield. I take 20 mg of lisinopril every morning.",
          "My doctor raised my lisinopril dose to 40 mg.", "How much lisinopril do I take?"),
         # the newer one inside a longer message too: weighed by its sentence the question is about
         ("Hi! My name is Dana Whitfield. The book club meets on Tuesdays.",
          "Hello again. Book club switched to Thursdays from next month. I finished the novel already.",
          "When does the book club meet?")]
FILLERS = ["The weather was lovely this weekend.", "I watched a documentary about whales.",
           "I need to buy coffee filters.", "I planted tomatoes on the balcony."]


def _store(mem: AgentMemory, older: str = OLDER, newer: str = NEWER) -> tuple[str, str]:
    first = mem.remember(older, user_id="u1", role="user", session_id="s1")
    for text in FILLERS:
        mem.remember(text, user_id="u1", role="user", session_id="s1")
    second = mem.remember(newer, user_id="u1", role="user", session_id="s2")
    return first.id, second.id


@pytest.fixture()
def store(tmp_path: Path) -> tuple[Path, str, str]:
    with AgentMemory(tmp_path / "s") as mem:
        older, newer = _store(mem)
    return tmp_path / "s", older, newer


@pytest.mark.parametrize("older_text,newer_text,asked", PAIRS)
def test_the_update_ranks_first_and_replaces_the_older_message_in_a_mount(tmp_path: Path, older_text: str,
                                                                          newer_text: str, asked: str) -> None:
    with AgentMemory(tmp_path / "s") as mem:
        older, newer = _store(mem, older_text, newer_text)
        assert mem.get(older).status == "active"  # a message of several sentences is never superseded on write
        ranked = [h.id for h in mem.recall(asked, user_id="u1", k=6)]
        assert ranked.index(newer) < ranked.index(older)
        mounted = [h.id for h in mem.recall_for_mount(asked, user_id="u1", k=4)]
        assert newer in mounted and older not in mounted  # the model never reads the stale value


@pytest.mark.parametrize("older_text,newer_text,asked", PAIRS)
def test_a_question_about_another_fact_of_the_message_keeps_it(tmp_path: Path, older_text: str, newer_text: str,
                                                               asked: str) -> None:
    with AgentMemory(tmp_path / "s") as mem:
        older, _ = _store(mem, older_text, newer_text)
        ranked = [h.id for h in mem.recall("What is my full name?", user_id="u1", k=6)]
        assert ranked[0] == older  # its name sentence is not what the update replaces
        assert older in [h.id for h in mem.recall_for_mount("What is my full name?", user_id="u1", k=4)]


def test_the_stated_sentences_vectors_are_written_with_the_row_and_replaced_on_update(
        store: tuple[Path, str, str]) -> None:
    path, older, newer = store
    with AgentMemory(path) as mem:
        rows = {r.id: r for r in mem._store.catalog.get([older, newer])}
        assert rows[newer].sentence_vectors is None  # one sentence: its text vector stands for it
        vecs = unpack_vectors(rows[older].sentence_vectors, 384)
        assert vecs.shape == (2, 384)  # "Hi!" states nothing; the name and the car do
        said = mem._consolidator.text_vectors(["My name is Dana Whitfield.", "I drive a blue Honda Civic."])
        assert (vecs * said).sum(axis=1).min() > 0.999  # float16 of the same vectors
        mem.update(older, text="I drive a Tesla now.")
        assert mem._store.catalog.get([older])[0].sentence_vectors is None  # the new text's: one sentence
        mem.update(older, text="Hello. I drive a Tesla now. My sister has the Civic.")
        assert unpack_vectors(mem._store.catalog.get([older])[0].sentence_vectors, 384).shape == (2, 384)


def test_a_row_stored_without_sentence_vectors_is_settled_the_same(store: tuple[Path, str, str]) -> None:
    path, older, newer = store
    conn = sqlite3.connect(path / "catalog.db")  # as a row written before schema 10
    conn.execute("UPDATE entries SET sentence_vectors = NULL")
    conn.commit()
    conn.close()
    with AgentMemory(path) as mem:
        mounted = [h.id for h in mem.recall_for_mount(ASKED, user_id="u1", k=4)]
        assert newer in mounted and older not in mounted
        assert older in [h.id for h in mem.recall_for_mount("What is my full name?", user_id="u1", k=4)]
        cached = mem._consolidator.cached()
        mem.recall_for_mount(ASKED, user_id="u1", k=4)
        assert mem._consolidator.cached() == cached  # embedded once, then read from the cache
