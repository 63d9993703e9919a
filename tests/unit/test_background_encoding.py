"""``kv_encoding="background"``: a write made while the model is busy returns without waiting for its KV prefill; a
worker encodes it once the model is idle, attaching it only to an entry that still exists at the version it read
(a write while the model is idle is encoded inline, as with "lazy"). The KV is the one an inline write stores, and
what a mount loads."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agentmem import AgentMemory
from agentmem.kv.testing import tiny_causal_lm


@pytest.fixture(scope="module")
def tiny_pair():
    return tiny_causal_lm("llama", seed=0)


def _kv_when_ready(mem: AgentMemory, entry_id: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kv = mem.get(entry_id).kv
        if kv is not None:
            return kv
        time.sleep(0.05)
    raise AssertionError(f"no KV for {entry_id} after {timeout} s")


def _stored_ids(mem: AgentMemory, entry_id: str) -> list[int]:
    row = mem._store.catalog.get([entry_id])[0]
    return mem._bank.engine.from_bytes(mem._store.read_blob(row)).token_ids.tolist()


def test_a_write_returns_before_its_kv_which_follows_and_mounts_as_an_inline_one(tmp_path: Path, tiny_pair) -> None:
    texts = ["the boat is called Saltire", "the boat is moored in Oban"]
    with AgentMemory(tmp_path / "inline", model=tiny_pair, kv_encoding="eager") as inline:
        eager = [inline.remember(t, user_id="u") for t in texts]
        want = inline.generate("what is the boat called?", user_id="u", k=2, max_new_tokens=6)
        want_ids = [_stored_ids(inline, r.id) for r in eager]
    with AgentMemory(tmp_path / "behind", model=tiny_pair, kv_encoding="background") as mem:
        mem.load_model()
        with mem._bank.engine._lock:  # the model is busy answering someone: the writes do not wait for it
            recs = [mem.remember(t, user_id="u") for t in texts]
        assert all(r.kv is None for r in recs)  # returned before the prefill
        assert [_kv_when_ready(mem, r.id).tokens for r in recs] == [r.kv.tokens for r in eager]
        assert [_stored_ids(mem, r.id) for r in recs] == want_ids
        assert mem.stats()["kv"]["encoded_behind"] == 2
        out = mem.generate("what is the boat called?", user_id="u", k=2, max_new_tokens=6)
        assert out.fallbacks == [] and out.token_ids == want.token_ids  # plain loads, the same greedy answer


def test_a_write_while_the_model_is_idle_is_encoded_inline(tmp_path: Path, tiny_pair) -> None:
    with AgentMemory(tmp_path / "s", model=tiny_pair, kv_encoding="background") as mem:
        mem.load_model()
        rec = mem.remember("the boat is called Saltire", user_id="u")
        assert rec.kv is not None and mem.stats()["kv"].get("encoded_behind", 0) == 0


def test_without_the_model_loaded_the_first_mount_encodes(tmp_path: Path, tiny_pair) -> None:
    with AgentMemory(tmp_path / "s", model=tiny_pair, kv_encoding="background") as mem:
        rec = mem.remember("the boat is called Saltire", user_id="u")
        time.sleep(0.3)
        assert mem.get(rec.id).kv is None and mem.stats()["model_loaded"] is False  # nothing loads the model
        out = mem.generate("what is the boat called?", user_id="u", k=1, max_new_tokens=1)
        assert out.mounted == [rec.id] and "no stored KV yet" in out.fallbacks[0][1]
        assert mem.get(rec.id).kv is not None


def test_an_entry_forgotten_or_updated_before_its_turn_gets_no_stale_blob(tmp_path: Path, tiny_pair) -> None:
    with AgentMemory(tmp_path / "s", model=tiny_pair, kv_encoding="background") as mem:
        mem.load_model()
        engine = mem._bank.engine
        with engine._lock:  # the model is busy answering someone: the worker waits
            gone = mem.remember("my locker code is zebra4411", user_id="u")
            kept = mem.remember("the boat is called Saltire", user_id="u")
            mem.forget(gone.id)
            mem.update(kept.id, text="the boat is called Northern Lights and is moored in Oban")
            time.sleep(0.2)
            assert mem.get(kept.id).kv is None
        _kv_when_ready(mem, kept.id)
        assert _stored_ids(mem, kept.id) == engine.encode(mem.get(kept.id).memory_text).token_ids.tolist()
        report = mem.verify()
        assert report["orphan_blobs"] == 0 and report["rows_missing_blob"] == 0
        assert len(list((tmp_path / "s" / "kv").rglob("*.kv"))) == 1  # the forgotten entry's never written
