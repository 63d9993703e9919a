"""Memory lifecycle: update with history, all-or-nothing replacement, stale KV never mounted, local consolidation."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agentmem import AgentMemory, InvalidInputError, NotFoundError
from agentmem.kv.testing import tiny_causal_lm
from agentmem.entries.lifecycle import Lifecycle

# the facade on the SQLite file and on the in-process catalog written against the port alone (tests/conftest.py)
pytestmark = pytest.mark.catalogs(None, "memory")


@pytest.fixture(scope="module")
def tiny_pair():
    return tiny_causal_lm("llama", seed=0)


def test_update_replaces_text_vector_and_lexical_doc_and_keeps_history(mem: AgentMemory) -> None:
    rec = mem.remember("My locker code is zebra4411.", user_id="u1", tags=["a"])
    out = mem.update(rec.id, text="My locker code is falcon9023.", tags=["b"], reason="changed at the gym")
    assert out.id == rec.id and out.version == 2 and out.text == "My locker code is falcon9023." and out.tags == ("b",)
    # the lexical document and the vector follow the text: the old word no longer finds it, the new one does
    assert [h.id for h in mem.recall("falcon9023", user_id="u1", k=1)] == [rec.id]
    assert all("zebra4411" not in h.text for h in mem.recall("zebra4411", user_id="u1", k=3))
    history = mem.history(rec.id)
    assert [(v.op, v.version, v.text) for v in history] == [
        ("add", 1, "My locker code is zebra4411."), ("update", 2, "My locker code is falcon9023.")]
    assert history[1].reason == "changed at the gym" and history[0].at <= history[1].at
    assert mem.verify()["rows_missing_vector"] == 0 and mem.verify()["orphan_vectors"] == 0


def test_update_checks_its_input_and_the_entry(mem: AgentMemory) -> None:
    rec = mem.remember("I have two bikes.", user_id="u1")
    with pytest.raises(InvalidInputError, match="text"):
        mem.update(rec.id, text="  ")
    with pytest.raises(InvalidInputError, match="ttl"):
        mem.update(rec.id, text="I have three bikes.", ttl=-1)
    with pytest.raises(NotFoundError):
        mem.update("no-such-id", text="x")
    with pytest.raises(NotFoundError):
        mem.history("no-such-id")
    assert mem.get(rec.id).version == 1  # nothing half-written


def test_a_failed_update_leaves_the_old_version_whole(mem: AgentMemory, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = mem.remember("The spare key is under the blue flowerpot.", user_id="u1")

    def boom(*args, **kwargs):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(Lifecycle, "replace", boom)
    with pytest.raises(sqlite3.OperationalError):
        mem.update(rec.id, text="The spare key is in the mailbox.")
    monkeypatch.undo()
    assert mem.get(rec.id).text == "The spare key is under the blue flowerpot." and mem.get(rec.id).version == 1
    hit = mem.recall("where is the spare key? flowerpot", user_id="u1", k=1)[0]
    assert hit.id == rec.id and hit.scores.get("lexical", 0) > 0
    # the vector was restored too: the dense score is the old text's, not the new one's
    assert hit.scores["dense"] == pytest.approx(mem.recall("flowerpot", user_id="u1", k=1)[0].scores["dense"], abs=1)
    assert [v.op for v in mem.history(rec.id)] == ["add"]
    assert mem.verify() == {**mem.verify(), "rows_missing_vector": 0, "orphan_vectors": 0, "orphan_blobs": 0}


def test_an_updated_entry_never_mounts_its_old_kv(tmp_path: Path, tiny_pair) -> None:
    store = tmp_path / "s"
    with AgentMemory(store, model=tiny_pair, kv_encoding="eager") as mem:
        rec = mem.remember("the boat is called Saltire", user_id="u")
        new = mem.update(rec.id, text="the boat is called Northern Lights and is moored in Oban")
        assert new.kv is not None and new.kv.tokens != rec.kv.tokens  # the blob of the new text replaced the old
        engine = mem._bank.engine
        stored = engine.from_bytes(mem._store.read_blob(mem._store.catalog.get([rec.id])[0]))
        assert stored.token_ids.tolist() == engine.encode(new.memory_text).token_ids.tolist()
        out = mem.generate("what is the boat called?", user_id="u", k=1, max_new_tokens=1)
        assert out.mounted == [rec.id] and out.fallbacks == []  # a plain load of the new blob
        assert mem.verify()["orphan_blobs"] == 0 and mem.verify()["rows_missing_blob"] == 0


def test_update_without_a_loaded_model_drops_the_old_kv_and_a_late_encoding_is_refused(tmp_path: Path,
                                                                                        tiny_pair) -> None:
    store = tmp_path / "s"
    with AgentMemory(store, model=tiny_pair, kv_encoding="eager") as mem:
        rec = mem.remember("the boat is called Saltire", user_id="u")
    with AgentMemory(store, model=tiny_pair) as mem:  # lazy, model not loaded: the update cannot encode
        new = mem.update(rec.id, text="the boat is called Northern Lights")
        assert new.kv is None and not list((store / "kv").rglob("*.kv"))
        # a mount that read version 1 and re-encodes it must not attach that KV to version 2
        blob = mem._bank.engine.to_bytes(mem._bank.engine.encode(rec.memory_text))
        assert mem._store.attach_blob(rec.id, blob, expect_version=1, kv_tokens=1) is False
        out = mem.generate("what is the boat called?", user_id="u", k=1, max_new_tokens=1)
        assert out.mounted == [rec.id]
        row = mem._store.catalog.get([rec.id])[0]
        stored = mem._bank.engine.from_bytes(mem._store.read_blob(row))
        assert stored.token_ids.tolist() == mem._bank.engine.encode(new.memory_text).token_ids.tolist()


def test_near_duplicates_merge_into_the_existing_entry(mem: AgentMemory) -> None:
    first = mem.remember("I live in Lyon.", user_id="u1")
    again = mem.remember("I live in Lyon.", user_id="u1")
    assert again.id == first.id and again.seen_count == 2
    assert len(mem.list(user_id="u1")) == 1
    assert [v.op for v in mem.history(first.id)] == ["add", "merge"]
    # another speaker saying the same thing is a different memory
    other = mem.remember("I live in Lyon.", user_id="u1", role="assistant")
    assert other.id != first.id
    # and another user is never consulted
    assert mem.remember("I live in Lyon.", user_id="u2").id != first.id
    assert mem.stats()["lifecycle"]["merged"] == 1


def test_a_newer_statement_supersedes_the_older_one(mem: AgentMemory) -> None:
    blue = mem.remember("My favorite color is blue.", user_id="u1")
    mem.remember("My favorite color is blue.", user_id="u1")
    mem.remember("The weather was lovely this weekend.", user_id="u1")
    mem.remember("I need to buy more coffee filters.", user_id="u1")
    green = mem.remember("My favorite color is green now.", user_id="u1")
    hits = mem.recall("what is my favorite color?", user_id="u1", k=4)
    assert hits[0].id == green.id and blue.id not in [h.id for h in hits]
    old = mem.get(blue.id)
    assert old.status == "superseded" and old.superseded_by == green.id
    assert [v.op for v in mem.history(blue.id)] == ["add", "merge", "supersede"]
    assert mem.history(blue.id)[-1].related_id == green.id
    # still there when asked for, never mounted
    assert blue.id in [h.id for h in mem.recall("what is my favorite color?", user_id="u1", k=4,
                                                include_superseded=True)]
    assert mem._answer.owned_hits([blue.id], "u1") == []
    # the unrelated memories were left alone
    assert {r.status for r in mem.list(user_id="u1") if r.id != blue.id} == {"active"}


def test_an_unresolved_conflict_ranks_the_newer_memory_first(mem: AgentMemory) -> None:
    # written without consolidation (as an import or a batch with consolidate=False does): nothing superseded, the
    # conflict is settled at recall
    lyon, _, paris = mem.remember_many([{"text": t, "user_id": "u1"} for t in (
        "I live in Lyon.", "The weather was lovely this weekend.", "Actually I moved to Paris last month.")],
        consolidate=False)
    hits = [h.id for h in mem.recall("where do I live?", user_id="u1", k=3)]
    assert mem.get(lyon.id).status == "active"
    assert hits[0] == paris.id and hits.index(lyon.id) > hits.index(paris.id)
    assert [h.id for h in mem.recall("where do I live?", user_id="u1", k=1)] == [paris.id]


def test_consolidation_off_stores_everything(tmp_path: Path, catalog_url: str | None) -> None:
    with AgentMemory(tmp_path / "s", consolidation="off", catalog_url=catalog_url) as mem:
        a = mem.remember("I live in Lyon.", user_id="u1")
        b = mem.remember("I live in Lyon.", user_id="u1")
        mem.remember("Actually I moved to Paris last month.", user_id="u1")
        assert a.id != b.id and {r.status for r in mem.list(user_id="u1")} == {"active"}


def test_remember_many_consolidates_within_the_batch(mem: AgentMemory) -> None:
    recs = mem.remember_many([{"text": "I live in Lyon.", "user_id": "u1"}, {"text": "I live in Lyon.", "user_id": "u1"},
                              {"text": "My sister visited yesterday.", "user_id": "u1"}])
    assert recs[0].id == recs[1].id and recs[2].id != recs[0].id
    assert len(mem.list(user_id="u1")) == 2 and mem.get(recs[0].id).seen_count == 2
    raw = mem.remember_many([{"text": "I live in Lyon.", "user_id": "u1"}], consolidate=False)
    assert raw[0].id != recs[0].id


def test_a_schema_3_store_gains_the_lifecycle_columns(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with AgentMemory(store) as mem:
        rec = mem.remember("I live in Lyon.", user_id="u1")
    conn = sqlite3.connect(store / "catalog.db")
    conn.execute("DROP INDEX ix_entries_status")
    for column in ("version", "status", "superseded_by", "seen_count", "last_seen_at", "indexed",
                   "text_vector", "sentence_vectors"):  # schema 4's columns and later ones
        conn.execute(f"ALTER TABLE entries DROP COLUMN {column}")
    conn.execute("DROP TABLE entry_history")
    conn.execute("UPDATE store_info SET value = '3' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with AgentMemory(store) as mem:
        assert mem.get(rec.id).status == "active" and mem.get(rec.id).version == 1
        assert mem.history(rec.id) == []
        assert mem.update(rec.id, text="I live in Paris.").version == 2
        assert int(mem._store.catalog.get_info("schema_version")) >= 4  # later migrations may follow


_CHATTER = ["The weather was lovely this weekend.", "I need to buy more coffee filters.", "My sister visited yesterday."]


@pytest.mark.parametrize("old,new,replaced", [
    ("I live in Lyon.", "Actually we relocated to Paris.", True),  # a paraphrased update: no shared wording
    ("I have a dog named Rex.", "I also have a cat called Tom.", False),  # two values that coexist
    ("I live in Lyon.", "My parents live in Madrid.", False),  # the same attribute of someone else
    ("I play tennis on weekends.", "I also started playing chess.", False),
])
def test_the_pairwise_model_supersedes_updates_not_lookalikes(mem: AgentMemory, old: str, new: str,
                                                               replaced: bool) -> None:
    first = mem.remember(old, user_id="u1")
    for text in _CHATTER:
        mem.remember(text, user_id="u1")
    newer = mem.remember(new, user_id="u1")
    assert mem._consolidator.pairs is not None  # the bundled embedder: the fitted model decides
    assert (mem.get(first.id).status == "superseded") is replaced
    if replaced:
        assert mem.get(first.id).superseded_by == newer.id and "pair score" in mem.history(first.id)[-1].reason
    assert {r.status for r in mem.list(user_id="u1") if r.id != first.id} == {"active"}


def test_another_embedder_falls_back_to_the_cosine_rule(tmp_path: Path) -> None:
    from agentmem.factory import BuildContext, build_embedder
    from agentmem.config import MemoryConfig

    embedder = build_embedder(BuildContext(root=tmp_path / "e", config=MemoryConfig()))
    with AgentMemory(tmp_path / "s", embedder=embedder) as mem:
        assert mem._consolidator.pairs is None  # the weights belong to the bundled embedder
        lyon = mem.remember("I live in Lyon.", user_id="u1")
        for text in _CHATTER:
            mem.remember(text, user_id="u1")
        mem.remember("Actually we relocated to Paris.", user_id="u1")
        assert mem.get(lyon.id).status == "active"  # the strict cosine rule does not catch a paraphrase
