"""The public API on every backend combination: embedded, PostgreSQL + pgvector, a Chroma server, Redis, and the
in-process catalog, vector index and blob store (written only against the ports)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentmem import AgentMemory, MemoryConfig
from agentmem.errors import InvalidInputError
from agentmem.kv.testing import tiny_causal_lm

COMBOS = ["embedded", "postgres+pgvector", "sqlite+chroma-http", "postgres+chroma-http", "embedded+redis",
          "sqlite+memory", "memory"]


def _config(combo: str, request: pytest.FixtureRequest) -> MemoryConfig:
    urls: dict[str, str] = {}
    if combo.startswith("postgres"):
        urls["catalog_url"] = request.getfixturevalue("fresh_postgres_url")
    if "+pgvector" in combo:
        urls["vector_url"] = "pgvector"
    if "+chroma-http" in combo:
        urls["vector_url"] = request.getfixturevalue("fresh_chroma_http_url")
    if combo.endswith("memory"):  # the in-process vector index and blob store (agentmem.backends.in_memory)
        urls["vector_url"] = urls["blob_url"] = "memory"
    if combo == "memory":  # and the in-process catalog (agentmem.backends.memory_catalog): no part from the package's
        urls["catalog_url"] = "memory"
    if combo.endswith("+redis"):  # KV blobs and the session cold tier on Redis: every part on a server
        urls["blob_url"] = urls["session_store_url"] = request.getfixturevalue("fresh_redis_url")
    return MemoryConfig(kv_encoding="eager", **urls)


@pytest.fixture(params=COMBOS)
def mem(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AgentMemory]:
    with AgentMemory(tmp_path / "store", model=tiny_causal_lm("llama", seed=0), config=_config(request.param, request)) as m:
        yield m


def test_remember_recall_forget_on_every_backend(mem: AgentMemory) -> None:
    lyon = mem.remember("I moved to Lyon last May.", user_id="u1", session_id="s1", tags=["profile"])
    dog = mem.remember("My dog is called Rex and loves the park.", user_id="u1", session_id="s1")
    other = mem.remember("I moved to Berlin and live there now.", user_id="u2")
    assert mem.get(lyon.id).kv is not None  # the blob is on the blob store, the row names it
    hits = mem.recall("Which city did I move to last May?", user_id="u1", k=2)
    assert hits[0].id == lyon.id and other.id not in {h.id for h in hits}
    assert [r.id for r in mem.list(user_id="u1", tags=["profile"])] == [lyon.id]
    out = mem.generate("What is my dog called?", user_id="u1", k=2, max_new_tokens=2)
    assert out.fallbacks == [] and dog.id in out.mounted
    check = mem.verify()
    assert check["rows"] == check["vectors"] == check["blobs"] == 3, check
    assert check["orphan_vectors"] == check["orphan_blobs"] == check["pending"] == 0, check
    assert mem.forget(user_id="u1") == 2
    assert mem.recall("Lyon", user_id="u1", k=5) == [] and mem.list(user_id="u1") == []
    check = mem.verify()
    assert check["rows"] == check["vectors"] == check["blobs"] == 1, check


def test_a_failed_batch_leaves_nothing(mem: AgentMemory) -> None:
    with pytest.raises(InvalidInputError):
        mem.remember_many([dict(text="fine", user_id="u"), dict(text="", user_id="u")])
    assert mem.list(user_id="u") == [] and mem.verify()["vectors"] == 0


def test_unknown_backend_url_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="vector_url"):
        AgentMemory(tmp_path / "s", vector_url="faiss://nowhere")
    with pytest.raises(InvalidInputError, match="pgvector"):
        AgentMemory(tmp_path / "s2", vector_url="pgvector")  # needs a PostgreSQL catalog


def test_update_replaces_the_lexical_document_on_every_backend(mem: AgentMemory) -> None:
    rec = mem.remember("I keep my kayak at the harbour.", user_id="u")
    mem.remember("My sister plays the cello.", user_id="u")
    mem.update(rec.id, text="I keep my canoe in the garage.")
    hits = mem.recall("canoe garage", user_id="u", k=1)
    assert hits[0].id == rec.id and hits[0].scores.get("lexical", 0) > 0  # the new text is searchable
    assert all(h.scores.get("lexical", 0) == 0 for h in mem.recall("kayak harbour", user_id="u", k=2))  # old one gone


def test_history_and_restore_on_every_backend(mem: AgentMemory) -> None:
    rec = mem.remember("I live in Lyon near the old market.", user_id="u", session_id="s1")
    mem.remember("My sister plays the cello.", user_id="u", session_id="s1")
    assert mem.update(rec.id, text="I live in Paris near the canal.").version == 2
    back = mem.restore(rec.id, version=1)
    assert back.text == "I live in Lyon near the old market." and back.version == 3
    assert [v.op for v in mem.history(rec.id)] == ["add", "update", "restore"]
    hits = mem.recall("Where do I live, near the market?", user_id="u", k=1)
    assert hits[0].id == rec.id and hits[0].text == back.text
    check = mem.verify()
    assert check["rows"] == check["vectors"] == check["blobs"] == 2, check


def test_listing_scopes_and_expiry_on_every_backend(mem: AgentMemory) -> None:
    """list() and forget() by scope, and expiry, go through the catalog's scopes (CatalogScope on every catalog)."""
    import time

    from agentmem.errors import NotFoundError

    plants = mem.remember("I water the plants on Sundays.", user_id="u", session_id="s1", tags=["home", "weekly"])
    plumber = mem.remember("The plumber comes on Tuesday.", user_id="u", session_id="s2", kind="knowledge",
                           tags=["home"])
    soon = mem.remember("The parcel is at the neighbour's.", user_id="u", session_id="s1", ttl=5.0)
    theirs = mem.remember("I water my cactus monthly.", user_id="v", session_id="s1", tags=["home"])
    assert [r.id for r in mem.list(user_id="u")] == [plants.id, plumber.id, soon.id]  # oldest first
    assert [r.id for r in mem.list(user_id="u", limit=1, offset=1)] == [plumber.id]
    assert [r.id for r in mem.list(user_id="u", tags=["home", "weekly"])] == [plants.id]
    assert [r.id for r in mem.list(user_id="u", kinds=["knowledge"])] == [plumber.id]
    assert {r.id for r in mem.list(session_id="s1")} == {plants.id, soon.id, theirs.id}
    time.sleep(max(0.0, soon.expires_at.timestamp() - time.time()) + 0.1)  # ttl: the writes may be slow under load
    assert soon.id not in {r.id for r in mem.list(user_id="u")}
    with pytest.raises(NotFoundError):
        mem.get(soon.id)
    assert mem.sweep() == 1 and mem.verify()["rows"] == 3
    assert mem.forget(session_id="s1", user_id="u") == 1 and [r.id for r in mem.list(user_id="u")] == [plumber.id]
    assert [r.id for r in mem.list(user_id="v", tags=["home"])] == [theirs.id]  # another user's entry stays
