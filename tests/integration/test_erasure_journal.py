"""Erasures reach every process on a shared store: an entry forgotten through one ``AgentMemory`` is replayed into
the ``on_erase`` listeners and sessions of another one opened on the same PostgreSQL catalog (another server, a
worker, the CLI), so their in-memory copies of the erased text go too (``agentmem.forgetting.ErasureJournal``)."""

from __future__ import annotations

import threading
from pathlib import Path

from agentmem import AgentMemory, MemoryConfig
from agentmem.erasure import Erasure


def _open(path: Path, url: str, **fields) -> AgentMemory:
    return AgentMemory(path, config=MemoryConfig(catalog_url=url, vector_url="pgvector", **fields))


def test_an_erasure_in_one_process_is_replayed_in_another(tmp_path: Path, fresh_postgres_url: str) -> None:
    with _open(tmp_path / "a", fresh_postgres_url) as a, \
            _open(tmp_path / "b", fresh_postgres_url, erasure_replay_s=3600) as b:  # replayed when asked, here
        fact = a.remember("My locker code is 4471.", user_id="u1")
        other = a.remember("I like sailing.", user_id="u2")
        told: list[Erasure] = []
        b.on_erase(told.append)
        assert b.replay_erasures() == 0 and told == []
        a.forget(fact.id, user_id="u1")
        a.forget(user_id="u2")
        assert b.replay_erasures() == 2 and b.replay_erasures() == 0  # each once
        assert [(e.action, set(e.entry_ids), set(e.user_ids)) for e in told] == [
            ("forget", {fact.id}, set()), ("forget_user", {other.id}, {"u2"})]
        assert a.replay_erasures() == 0  # its own erasures were told to its listeners when it made them


def test_a_shared_catalog_replays_on_its_own_every_second(tmp_path: Path, fresh_postgres_url: str) -> None:
    with _open(tmp_path / "a", fresh_postgres_url) as a, _open(tmp_path / "b", fresh_postgres_url) as b:
        fact = a.remember("My locker code is 4471.", user_id="u1")
        told = threading.Event()
        b.on_erase(lambda e: told.set() if fact.id in e.entry_ids else None)
        a.forget(fact.id)
        assert told.wait(10)


def test_the_journal_keeps_ids_never_text(tmp_path: Path, fresh_postgres_url: str) -> None:
    import psycopg

    with _open(tmp_path / "a", fresh_postgres_url) as a:
        fact = a.remember("My locker code is 4471.", user_id="u1", session_id="s1")
        a.forget(fact.id)
    url = fresh_postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT value FROM store_info WHERE key LIKE 'erasure:%'").fetchall()
    assert len(rows) == 1 and fact.id in rows[0][0] and "s1" in rows[0][0] and "4471" not in rows[0][0]
