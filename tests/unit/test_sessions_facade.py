"""Sessions through the public facade: AgentMemory(path, model=tiny) -> mem.session(...).send(...)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentmem import AgentMemory, InvalidInputError
from agentmem.kv.testing import tiny_causal_lm


@pytest.fixture(scope="module")
def mem(tmp_path_factory) -> Iterator[AgentMemory]:
    path: Path = tmp_path_factory.mktemp("store")
    m = AgentMemory(path, model=tiny_causal_lm("llama", seed=0), session_idle_seconds=3600)
    yield m
    m.sessions.close()
    m.close()


def test_send_recalls_other_sessions_mounts_them_and_remembers_the_turn(mem):
    old = mem.remember("My dog is called Rex.", user_id="u1", session_id="old")
    chat = mem.session("s1", user_id="u1")
    first = "What is my dog called? My cat is called Tom."
    r = chat.send(first, k=3, max_new_tokens=4)
    assert old.id in r.mounted and r.timings["ttft"] > 0 and len(r.records) == len(mem.list(session_id="s1"))
    stored = mem.list(session_id="s1")
    assert [e.role for e in stored][:1] == ["user"] and stored[0].text == first
    again = "What is my cat called? I told you before."
    # recall alone would mount this session's first turn (it states something and passes the mount threshold) ...
    assert {h.id for h in mem.mount_choice(again, user_id="u1", k=3).mounted} & {e.id for e in stored}
    r2 = chat.send(again, k=3, max_new_tokens=4)
    assert r2.reused_tokens > 0 and r2.rebuilt is None
    assert not set(r2.mounted) & {e.id for e in stored}  # ... but the live session's turns are already in its KV
    assert mem.session("s1", user_id="u1") is chat


def test_send_mounts_exactly_the_chosen_entries(mem):
    a = mem.remember("The boiler code is 4417.", user_id="u3", session_id="notes")
    b = mem.remember("The bakery opens at seven.", user_id="u3", session_id="notes")
    theirs = mem.remember("Someone else's secret plan.", user_id="u4", session_id="x")
    chat = mem.session("s-chosen", user_id="u3")
    r = chat.send("Tell me something.", entry_ids=[b.id, theirs.id, a.id], k=0, max_new_tokens=2)
    assert r.mounted == [b.id, a.id]  # in the order given; another user's entry is never mounted
    first_turn = mem.list(session_id="s-chosen")[0].id
    r2 = chat.send("And again.", entry_ids=[first_turn], max_new_tokens=2)
    assert r2.mounted == []  # a turn already in the working cache is not mounted twice
    with pytest.raises(InvalidInputError):
        chat.send("Bad ids.", entry_ids=a.id, max_new_tokens=2)


def test_offload_restore_and_stats_through_the_facade(mem):
    chat = mem.session("s2", user_id="u1")
    chat.send("Hello there.", k=0, max_new_tokens=4)
    assert mem.sessions.offload("s2", to="disk") == "cold"
    assert mem.sessions.restore("s2")["from"] == "cold" and chat.tier == "hot"
    stats = mem.sessions.stats()
    for tier in ("hot", "warm", "cold"):
        assert {"sessions", "bytes", "hits", "misses", "offloads", "restores"} <= set(stats[tier])
    assert stats["restore_latency_s"]["cold"]["count"] >= 1


def test_kb_version_change_rebuilds_and_secrets_never_reach_the_session(mem):
    chat = mem.session("s3", user_id="u2")
    chat.send("my login is password=hunter2", k=0, max_new_tokens=4)
    assert "hunter2" not in chat.history()[0]["content"]
    mem.set_kb_version("v2")
    r = chat.send("Go on.", k=0, max_new_tokens=4)
    assert r.rebuilt == "knowledge-base version changed" and r.reused_tokens == 0
    assert chat.send("Still there?", k=0, max_new_tokens=4).rebuilt is None
    assert mem.sessions.end("s3") and "s3" not in mem.sessions.list()


def test_a_session_id_shared_by_two_users_never_couples_their_data(tmp_path):
    # #13 item 8: B has session "s2"; A stores a memory under session_id="s2", then A is forgotten.
    with AgentMemory(tmp_path / "store", model=tiny_causal_lm("llama", seed=0), session_idle_seconds=3600) as m:
        b_chat = m.session("s2", user_id="B")
        b_chat.send("My name is Bea.", k=0, max_new_tokens=2)
        m.remember("A's note in s2", user_id="A", session_id="s2")
        assert m.forget(user_id="A") == 1
        assert [h["content"] for h in b_chat.history()][:1] == ["My name is Bea."]  # B's turns are kept
        assert b_chat.send("What is my name?", k=0, max_new_tokens=2).reused_tokens > 0  # and so is B's KV
        a_chat = m.session("s2", user_id="A")  # the same id, another user: a separate conversation
        assert a_chat is not b_chat and a_chat.history() == []
        a_chat.send("I am Al.", k=0, max_new_tokens=2)
        m.forget(user_id="A")
        assert m.sessions.list(user_id="A") == [] and m.sessions.list(user_id="B") == ["s2"]
        m.sessions.offload("s2", to="disk", user_id="B")
        m.forget(session_id="s2", user_id="A")  # scoped to A: B's file stays
        assert m.sessions.restore("s2", user_id="B")["from"] == "cold"
        m.forget(m.list(user_id="B", session_id="s2")[0].id)  # B's own turn: B's session KV goes
        assert m.sessions.list(user_id="B") == []
        m.sessions.close()
