"""Concurrent writers' KV is encoded in shared batches (``agentmem.bank._GroupEncoder``): each writer gets the KV of
its own lines, a refused line fails only its own writer, and through the facade concurrent ``remember`` calls store
every entry's own KV."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentmem import AgentMemory, InvalidInputError
from agentmem.bank import _GroupEncoder
from agentmem.kv.testing import tiny_causal_lm


class _Model:
    """encode_many stand-in: 'KV' of a line is the line upper-cased; each call takes 50 ms and is recorded."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.lock = threading.Lock()

    def encode_many(self, texts: list[str]) -> list[str]:
        if any(t == "bad" for t in texts):
            raise InvalidInputError("a memory is longer than the model's context allows")
        with self.lock:
            self.calls.append(list(texts))
        time.sleep(0.05)
        return [t.upper() for t in texts]


def test_concurrent_writers_share_batches_and_each_gets_its_own_lines() -> None:
    model = _Model()
    group = _GroupEncoder(model.encode_many)
    texts = [[f"w{i} a", f"w{i} b"] for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        got = list(pool.map(group.encode, texts))
    assert got == [[t.upper() for t in pair] for pair in texts]
    assert len(model.calls) < 12 and sum(len(c) for c in model.calls) == 24  # batched, nothing encoded twice
    assert group.encode(["alone"]) == ["ALONE"] and model.calls[-1] == ["alone"]


def test_a_refused_line_fails_only_its_writer() -> None:
    model = _Model()
    group = _GroupEncoder(model.encode_many)
    start = threading.Barrier(6)

    def write(texts: list[str]):
        start.wait()
        try:
            return group.encode(texts)
        except InvalidInputError as exc:
            return exc

    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(write, [["ok 1"], ["ok 2"], ["bad"], ["ok 3"], ["ok 4"], ["ok 5"]]))
    assert isinstance(got[2], InvalidInputError)
    assert [g for i, g in enumerate(got) if i != 2] == [["OK 1"], ["OK 2"], ["OK 3"], ["OK 4"], ["OK 5"]]


@pytest.fixture(scope="module")
def tiny_pair():
    return tiny_causal_lm("llama", seed=0)


def test_concurrent_remembers_store_each_entrys_own_kv(tmp_path: Path, tiny_pair) -> None:
    texts = [f"note {i}: the locker code is {1000 + 37 * i}" + " and more" * (i % 4) for i in range(10)]
    with AgentMemory(tmp_path / "s", model=tiny_pair, kv_encoding="eager") as mem:
        mem.load_model()
        with ThreadPoolExecutor(10) as pool:
            recs = list(pool.map(lambda t: mem.remember(t, user_id="u"), texts))
        engine = mem._bank.engine
        for rec in recs:
            row = mem._store.catalog.get([rec.id])[0]
            stored = engine.from_bytes(mem._store.read_blob(row))
            assert stored.token_ids.tolist() == engine.encode(rec.memory_text).token_ids.tolist()
            assert rec.kv.tokens == len(stored.token_ids)


def _spy_encode_many(engine, calls: list[list[str]]):
    real = engine.encode_many

    def encode_many(texts, **kw):
        calls.append(list(texts))
        return real(texts, **kw)

    return encode_many


def test_a_mount_encodes_its_unencoded_memories_in_one_batch_before_the_model_lock(tmp_path: Path, tiny_pair,
                                                                                    monkeypatch) -> None:
    texts = ["the boat is called Saltire", "the boat is moored in Oban", "the boat has a red sail",
             "the boat sleeps four"]
    question, when = "what is the boat called?", "2026-05-01T10:00:00"  # the memory lines carry the time
    with AgentMemory(tmp_path / "eager", model=tiny_pair, kv_encoding="eager") as eager:
        for t in texts:
            eager.remember(t, user_id="u", timestamp=when)
        want = eager.generate(question, user_id="u", k=4, max_new_tokens=6)
    with AgentMemory(tmp_path / "lazy", model=tiny_pair) as mem:
        recs = [mem.remember(t, user_id="u", timestamp=when) for t in texts]  # the model is not loaded yet: no KV
        assert all(r.kv is None for r in recs)
        mem.load_model()
        calls: list[list[str]] = []
        monkeypatch.setattr(mem._bank.engine, "encode_many", _spy_encode_many(mem._bank.engine, calls))
        out = mem.generate(question, user_id="u", k=4, max_new_tokens=6)
        assert sorted(out.mounted) == sorted(r.id for r in recs)
        assert len(calls) == 1 and sorted(calls[0]) == sorted(r.memory_text for r in recs)  # one batched forward
        assert [reason for _, reason in out.fallbacks] == ["no stored KV yet: encoded from text and stored again"] * 4
        assert all(mem.get(r.id).kv is not None for r in recs)
        assert out.token_ids == want.token_ids  # the answer of a store whose writes were encoded
        again = mem.generate(question, user_id="u", k=4, max_new_tokens=6)
        assert len(calls) == 1 and again.fallbacks == [] and again.token_ids == want.token_ids  # plain loads now


def test_concurrent_mounts_share_their_encodes(tmp_path: Path, tiny_pair, monkeypatch) -> None:
    users = [f"u{i}" for i in range(6)]
    with AgentMemory(tmp_path / "s", model=tiny_pair) as mem:
        ids = {u: [mem.remember(f"{u}'s boat is called Saltire", user_id=u).id,
                   mem.remember(f"{u} keeps a bicycle in the shed", user_id=u).id] for u in users}
        mem.load_model()
        calls: list[list[str]] = []
        engine = mem._bank.engine
        monkeypatch.setattr(engine, "encode_many", _spy_encode_many(engine, calls))
        start = threading.Barrier(len(users))

        def ask(user: str):
            start.wait()
            return mem.generate("what is the boat called?", user_id=user, entry_ids=ids[user], max_new_tokens=2)

        with ThreadPoolExecutor(len(users)) as pool:
            with engine._lock:  # the model is busy: the six mounts queue their encodes behind one another
                futures = [pool.submit(ask, u) for u in users]
                time.sleep(0.5)
            outs = [f.result(timeout=120) for f in futures]
        assert [o.mounted for o in outs] == [ids[u] for u in users] and all(len(o.fallbacks) == 2 for o in outs)
        assert len(calls) < len(users) and sum(len(c) for c in calls) == 2 * len(users)  # batched, none twice
