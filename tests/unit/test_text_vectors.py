"""Recall's consolidation steps without repeated work: text vectors stored on rows (schema 6), which the conflict
check reads instead of re-embedding recalled texts, and a deeper second search that reuses the first's candidates.

Before, a process that had not written the entries itself (a restarted server, a second worker) embedded every
recalled text with the full MiniLM model on each recall: ~390 ms of a 460 ms recall at 100,000 entries.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from agentmem import AgentMemory
from agentmem.entries.text_vectors import unpack_vector


class _CountingEmbed:
    """Wraps the consolidator's embed callable and counts the texts it is asked to embed."""

    def __init__(self, embed):
        self.embed, self.texts = embed, 0

    def __call__(self, texts):
        self.texts += len(texts)
        return self.embed(texts)


def test_a_new_process_settles_conflicts_from_stored_vectors_without_embedding(tmp_path: Path) -> None:
    with AgentMemory(tmp_path / "s") as mem:
        lyon = mem.remember("I live in Lyon.", user_id="u1")
        mem.remember("The weather was lovely this weekend.", user_id="u1")
        paris = mem.remember("Actually I moved to Paris last month.", user_id="u1")
        assert paris.superseded_ids == (lyon.id,)
        mem.restore(lyon.id)  # the supersession undone: both active, the conflict is left to recall
        stored = {r.id: r.text_vector for r in mem._store.catalog.get([lyon.id, paris.id])}
        assert all(v is not None and len(v) == 2 * 384 for v in stored.values())  # float16, MiniLM's 384 dims
    with AgentMemory(tmp_path / "s") as fresh:  # empty in-memory cache, as in another worker
        spy = _CountingEmbed(fresh._consolidator._embed)
        fresh._consolidator._embed = spy
        hits = [h.id for h in fresh.recall("where do I live?", user_id="u1", k=3)]
        assert hits[0] == paris.id and hits.index(lyon.id) > hits.index(paris.id)  # the newer still ranks first
        assert spy.texts == 0


def test_rows_without_a_stored_vector_are_embedded_as_before(tmp_path: Path) -> None:
    with AgentMemory(tmp_path / "s") as mem:
        lyon = mem.remember("I live in Lyon.", user_id="u1")
        mem.remember("The weather was lovely this weekend.", user_id="u1")
        paris = mem.remember("Actually I moved to Paris last month.", user_id="u1")
        mem.restore(lyon.id)  # both active: the conflict is left to recall
    with sqlite3.connect(tmp_path / "s" / "catalog.db") as con:  # as a store written before schema 6
        con.execute("UPDATE entries SET text_vector = NULL")
    with AgentMemory(tmp_path / "s") as fresh:
        spy = _CountingEmbed(fresh._consolidator._embed)
        fresh._consolidator._embed = spy
        hits = [h.id for h in fresh.recall("where do I live?", user_id="u1", k=3)]
        assert hits[0] == paris.id and hits.index(lyon.id) > hits.index(paris.id)
        assert spy.texts >= 2  # the conflict check embedded the texts it had no vector for


def test_update_stores_the_new_texts_vector(mem: AgentMemory) -> None:
    rec = mem.remember("I live in Lyon.", user_id="u1")
    before = unpack_vector(mem._store.catalog.get([rec.id])[0].text_vector)
    mem.update(rec.id, text="My favourite fruit is the mango.")
    after = unpack_vector(mem._store.catalog.get([rec.id])[0].text_vector)
    expected = mem._consolidator.text_vectors(["My favourite fruit is the mango."])[0]
    assert float(after @ expected) > 0.999 and float(before @ after) < 0.9
    assert np.isclose(np.linalg.norm(after), 1.0)
