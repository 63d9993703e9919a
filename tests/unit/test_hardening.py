"""Hostile and careless input through the public API (issue #13): every bad argument is an ``InvalidInputError``
naming the field, raised before anything is written; no input breaks later reads."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from datetime import timedelta
from pathlib import Path

import pytest

from agentmem import AgentMemory, EncryptionError, InvalidInputError, NotFoundError, SecretDetectedError
from agentmem.kv.testing import tiny_causal_lm
from agentmem.security import Cipher, scan_tree_for_markers
from agentmem.validation import MAX_TEXT_CHARS

GH_TOKEN = "ghp_" + "Zq3x" * 9


@pytest.fixture(scope="module")
def tiny_pair():
    return tiny_causal_lm("llama", seed=0)


@pytest.fixture(scope="module")
def shared(tmp_path_factory, tiny_pair):
    """One store for the many bad-input cases: each must leave it exactly as it was."""
    # mount_min_score 0: "hi" must find "hello there" to mount, so generate's room check for memories is reached
    with AgentMemory(tmp_path_factory.mktemp("hostile") / "s", model=tiny_pair, mount_min_score=0.0) as mem:
        mem.remember("hello there", user_id="u", session_id="s", metadata={"x": [1, 2], "y": "a"})
        yield mem


def _deep(n: int) -> dict:
    root: dict = {}
    cur = root
    for _ in range(n):
        cur["a"] = {}
        cur = cur["a"]
    return root


BAD = [
    ("text", lambda m: m.remember("hi \ud800", user_id="u")),
    ("user_id", lambda m: m.remember("hi", user_id="u\ud800")),
    ("tag", lambda m: m.remember("hi", user_id="u", tags=["\udc00"])),
    ("query", lambda m: m.recall("\ud800 x", user_id="u")),
    ("role", lambda m: m.remember("hi", user_id="u", role=5)),
    ("role", lambda m: m.remember("hi", user_id="u", role="password=hunter2")),
    ("speaker", lambda m: m.remember("hi", user_id="u", speaker="Ann\nBob")),
    ("metadata", lambda m: m.remember("hi", user_id="u", metadata=_deep(5000))),
    ("metadata", lambda m: m.remember("hi", user_id="u", metadata={"k": "\ud800"})),
    ("kinds", lambda m: m.recall("hi", user_id="u", kinds=5)),
    ("kind", lambda m: m.recall("hi", user_id="u", kinds=[["turn"]])),
    ("filters", lambda m: m.recall("hi", user_id="u", filters=_deep_filter(100))),
    ("entry_id", lambda m: m.get(["a"])),
    ("entry_id", lambda m: m.forget(["a"])),
    ("user_id", lambda m: m.remember_many([{"text": "hi"}])),
    ("max_new_tokens", lambda m: m.generate("hi", user_id="u", max_new_tokens="3")),
    ("max_new_tokens", lambda m: m.generate("hi", user_id="u", max_new_tokens=2.5)),
    ("max_new_tokens", lambda m: m.generate("hi", user_id="u", max_new_tokens=-1)),
    ("top_p", lambda m: m.generate("hi", user_id="u", do_sample=True, top_p=0)),
    ("temperature", lambda m: m.generate("hi", user_id="u", do_sample=True, temperature=float("nan"))),
    ("temperature", lambda m: m.generate("hi", user_id="u", temperature=-1)),
    ("seed", lambda m: m.generate("hi", user_id="u", seed="x", do_sample=True)),
    ("budget_tokens", lambda m: m.generate("hi", user_id="u", budget_tokens=-5)),
    ("no room for memories", lambda m: m.generate("hi", user_id="u", max_new_tokens=10**6)),
    ("question is too long", lambda m: m.generate("hello " * 200, user_id="u")),
    ("question is too long", lambda m: m.generate("hello " * 200, user_id="nobody")),  # no memory to mount either
    ("limit", lambda m: m.list(user_id="u", limit="3")),
    ("limit", lambda m: m.list(user_id="u", limit=-1)),
    ("limit", lambda m: m.list(user_id="u", limit=2.5)),
    ("limit", lambda m: m.list(user_id="u", limit=10**20)),
    ("offset", lambda m: m.list(user_id="u", offset=1.5)),
    ("offset", lambda m: m.list(user_id="u", offset=-1)),
    ("offset", lambda m: m.list(user_id="u", offset="0")),
    ("ttl", lambda m: m.remember("hi", user_id="t", ttl=1e12)),
    ("ttl", lambda m: m.remember("hi", user_id="t", ttl=1e300)),
    ("ttl", lambda m: m.remember("hi", user_id="t", ttl=timedelta.max)),
    ("user_id", lambda m: m.remember("hi", user_id="x" * 300)),
    ("user_id", lambda m: m.remember("hi", user_id="a\tb")),
    ("session_id", lambda m: m.remember("hi", user_id="u", session_id="s\x00")),
    ("session_id", lambda m: m.remember("hi", user_id="u", session_id="s\n2")),
    ("user_id", lambda m: m.forget(user_id="x" * 300)),
    ("user_id", lambda m: m.forget(user_id="a\tb")),
    ("session_id", lambda m: m.forget(session_id="s\x00")),
    ("timestamp", lambda m: m.remember("hi", user_id="u", timestamp="x" * 500)),
    ("timestamp", lambda m: m.remember("hi", user_id="u", timestamp="8 May\n2023")),
    ("timestamp", lambda m: m.remember("hi", user_id="u", timestamp=5)),
    ("text", lambda m: m.remember("a" * (MAX_TEXT_CHARS + 1), user_id="u")),
]


def _deep_filter(n: int) -> dict:
    f: dict = {"y": "a"}
    for _ in range(n):
        f = {"$and": [f]}
    return f


@pytest.mark.parametrize("field,call", BAD, ids=[f"{n}-{f}" for n, (f, _) in enumerate(BAD)])
def test_bad_input_names_the_field_and_writes_nothing(shared: AgentMemory, field: str, call) -> None:
    before = shared.verify()
    audit = shared.path / "audit.jsonl"
    lines = audit.read_text().count("\n") if audit.exists() else 0
    with pytest.raises(InvalidInputError, match=field):
        call(shared)
    assert shared.verify() == before
    assert (audit.read_text().count("\n") if audit.exists() else 0) == lines
    assert [r.text for r in shared.list(user_id="u")] == ["hello there"]


def test_filters_never_raise_raw_errors_on_odd_values(shared: AgentMemory) -> None:
    assert shared.recall("hello", user_id="u", filters={"x": {"$in": {1}}}) == []  # a list value against a set
    assert len(shared.recall("hello", user_id="u", filters={"x": {"$in": [[1, 2]]}})) == 1
    assert len(shared.recall("hello", user_id="u", filters={"x": {"$nin": {3}}})) == 1


def test_a_legacy_huge_expiry_does_not_break_reads_or_sweep(mem: AgentMemory) -> None:
    """Rows written before ttl had an upper bound (expiry past year 9999) stay listable, recallable, sweepable."""
    rec = mem.remember("legacy entry about tulips", user_id="u", session_id="s", ttl=60)
    with sqlite3.connect(mem.path / "catalog.db") as conn:
        conn.execute("UPDATE entries SET expires_at = ? WHERE id = ?", (time.time() + 1e12, rec.id))
    assert [r.id for r in mem.list(user_id="u")] == [rec.id]
    assert [r.id for r in mem.list(session_id="s")] == [rec.id]
    assert mem.recall("tulips", user_id="u", k=1)[0].id == rec.id
    assert mem.get(rec.id).expires_at.year == 9999
    assert mem.sweep() == 0


def test_timestamp_strings_are_secret_scanned(mem_path: Path) -> None:
    with AgentMemory(mem_path) as mem:
        rec = mem.remember("we met", user_id="u", timestamp=f"token={GH_TOKEN}")
        assert GH_TOKEN not in rec.occurred_at and GH_TOKEN not in rec.memory_text
        assert "[REDACTED:" in rec.occurred_at
    assert scan_tree_for_markers(mem_path, [GH_TOKEN.encode()]) == {}


def test_reject_policy_covers_timestamp_strings(mem_path: Path) -> None:
    with AgentMemory(mem_path, secret_policy="reject") as mem:
        with pytest.raises(SecretDetectedError):
            mem.remember("we met", user_id="u", timestamp=f"password=hunter2 {GH_TOKEN}")
        assert mem.list(user_id="u") == []


def test_forget_validates_before_erasing_and_writes_its_audit_line(mem: AgentMemory) -> None:
    mem.remember("keep me", user_id="u", session_id="s")
    with pytest.raises(InvalidInputError, match="user_id"):
        mem.forget(user_id="u\t")
    assert len(mem.list(user_id="u")) == 1
    assert mem.forget(user_id="u") == 1
    lines = [json.loads(x) for x in (mem.path / "audit.jsonl").read_text().splitlines()]
    assert lines[-1]["action"] == "forget_user" and lines[-1]["user_id"] == "u" and lines[-1]["count"] == 1


def test_user_id_is_enforced_on_get_and_forget(mem: AgentMemory) -> None:
    a = mem.remember("A's note", user_id="A", session_id="shared")
    b = mem.remember("B's note", user_id="B", session_id="shared")
    assert mem.get(a.id, user_id="A").id == a.id
    with pytest.raises(NotFoundError):
        mem.get(a.id, user_id="B")
    assert mem.forget(a.id, user_id="B") == 0
    assert mem.get(a.id).id == a.id
    assert mem.forget(session_id="shared", user_id="B") == 1
    assert [r.id for r in mem.list(session_id="shared")] == [a.id]
    assert mem.forget(a.id, user_id="A") == 1
    with pytest.raises(NotFoundError):
        mem.get(b.id)


def test_a_key_on_a_plaintext_store_is_refused_and_changes_nothing(mem_path: Path, monkeypatch) -> None:
    with AgentMemory(mem_path) as mem:
        rec = mem.remember("plaintext entry", user_id="u")
    key = Cipher.format_key(Cipher.generate_key())
    with pytest.raises(EncryptionError, match="without encryption"):
        AgentMemory(mem_path, encryption_key=key)
    monkeypatch.setenv("AGENTMEM_ENCRYPTION_KEY", key)
    with pytest.raises(EncryptionError, match="AGENTMEM_ENCRYPTION_KEY"):
        AgentMemory(mem_path)
    monkeypatch.delenv("AGENTMEM_ENCRYPTION_KEY")
    assert not (mem_path / "encryption.json").exists()
    with AgentMemory(mem_path) as mem:
        assert mem.get(rec.id).text == "plaintext entry"


def test_a_key_on_a_new_store_still_encrypts(tmp_path: Path) -> None:
    key = Cipher.format_key(Cipher.generate_key())
    with AgentMemory(tmp_path / "new", encryption_key=key) as mem:
        mem.remember("secret garden", user_id="u")
    assert (tmp_path / "new" / "encryption.json").exists()


def test_mount_after_concurrent_forget_says_nothing_was_stored(mem_path: Path, tiny_pair, caplog) -> None:
    """A generate that recalled an entry just before it was forgotten must not claim to have stored it again."""
    with AgentMemory(mem_path, model=tiny_pair, kv_encoding="off") as mem:
        rec = mem.remember("the cat is called Miso", user_id="u")
        memories, _ = mem._bank.memories(mem._store.catalog.get([rec.id]), [rec.memory_text], strict=False)
        mem.forget(rec.id)  # lands between recall and mount
        with caplog.at_level(logging.WARNING, logger="agentmem"):
            memories[0].load_kv()
        assert "not stored" in memories[0].load_fallback
        assert mem.verify()["orphan_blobs"] == 0 and mem.verify()["rows"] == 0
