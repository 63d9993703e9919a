"""Sessions across workers on a shared Redis cold tier (a real redis-server): one worker serves a session at a
time (a lease in Redis), and a session offloaded by one worker continues token-identically on another — two
AgentMemory instances in one process, and two processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentmem import AgentMemory, SessionBusyError
from agentmem.kv.testing import tiny_causal_lm

MESSAGES = ["Hello, I am Ana.", "My sister is called Ines.", "She lives in Porto.", "What is her name?"]
NEW = 6


def _mem(path: Path, store_url: str | None, **cfg) -> AgentMemory:
    return AgentMemory(path, model=tiny_causal_lm("llama", seed=0), session_idle_seconds=3600,
                       session_store_url=store_url, **cfg)


def _turn(chat, message: str):
    return chat.send(message, k=0, max_new_tokens=NEW, remember=False)


@pytest.fixture
def twin(tmp_path: Path):
    """The same conversation on one worker that never offloads: what every moved turn must reproduce."""
    with _mem(tmp_path / "twin", None) as m:
        chat = m.session("s1", user_id="u1")
        yield [_turn(chat, msg).token_ids for msg in MESSAGES]
        m.sessions.close()


def test_two_workers_share_a_session_through_redis(tmp_path: Path, fresh_redis_url: str, twin) -> None:
    a = _mem(tmp_path / "a", fresh_redis_url, session_lease_wait_seconds=0.2)
    b = _mem(tmp_path / "b", fresh_redis_url, session_lease_wait_seconds=0.2)
    try:
        on_a = a.session("s1", user_id="u1")
        assert [_turn(on_a, m).token_ids for m in MESSAGES[:2]] == twin[:2]
        on_b = b.session("s1", user_id="u1")
        with pytest.raises(SessionBusyError):  # A holds the lease while the session is in its memory
            _turn(on_b, MESSAGES[2])
        assert a.sessions.offload("s1", to="disk") == "cold"  # written to Redis, lease released
        r = _turn(on_b, MESSAGES[2])
        assert r.restored_from == "cold" and r.rebuilt is None and r.reused_tokens > 0  # B reused A's KV
        assert r.token_ids == twin[2]
        with pytest.raises(SessionBusyError):  # now B serves it; A's stale copy is not used
            _turn(on_a, MESSAGES[3])
        b.sessions.close()  # a worker shutting down hands its sessions over through the cold tier
        r = _turn(on_a, MESSAGES[3])
        assert r.restored_from == "cold" and r.token_ids == twin[3]
        assert [h["content"] for h in on_a.history()[::2]] == MESSAGES
    finally:
        for m in (a, b):
            m.sessions.close()
            m.close()


def test_a_lapsed_lease_lets_another_worker_take_over(tmp_path: Path, fresh_redis_url: str, twin) -> None:
    # A live worker keeps renewing its leases; a stalled (or crashed) one stops, and its leases expire.
    a = _mem(tmp_path / "a", fresh_redis_url, session_lease_seconds=0.6, session_lease_wait_seconds=0.2)
    b = _mem(tmp_path / "b", fresh_redis_url, session_lease_wait_seconds=0.2)
    try:
        on_a = a.session("s1", user_id="u1")
        assert _turn(on_a, MESSAGES[0]).token_ids == twin[0]
        on_b = b.session("s1", user_id="u1")
        time.sleep(1.0)  # longer than the lease: A's background worker renews it meanwhile
        with pytest.raises(SessionBusyError):
            _turn(on_b, MESSAGES[0])
        mgr = a.sessions
        mgr._background.stop()  # A stalls: nothing renews its lease any more
        time.sleep(0.8)
        r = _turn(on_b, MESSAGES[0])  # A's lease lapsed: B serves the session now
        assert r.restored_from is None and r.token_ids == twin[0]  # A never wrote it out: B starts it over
        with pytest.raises(SessionBusyError):  # A, back, does not serve it on its stale copy
            _turn(on_a, MESSAGES[1])
    finally:
        for m in (a, b):
            m.sessions.close()
            m.close()


CHILD = """
import json, sys
from agentmem import AgentMemory
from agentmem.kv.testing import tiny_causal_lm
url, path = sys.argv[1], sys.argv[2]
messages = json.loads(sys.argv[3])
with AgentMemory(path, model=tiny_causal_lm("llama", seed=0), session_idle_seconds=3600,
                 session_store_url=url) as mem:
    chat = mem.session("s1", user_id="u1")
    out = [chat.send(m, k=0, max_new_tokens=%d, remember=False).token_ids for m in messages]
    mem.sessions.close()  # the process exits: its session goes to Redis
print(json.dumps(out))
""" % NEW


def test_a_session_moves_between_processes(tmp_path: Path, fresh_redis_url: str, twin) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, fresh_redis_url, str(tmp_path / "child"), json.dumps(MESSAGES[:2])],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert json.loads(child.stdout.strip().splitlines()[-1]) == twin[:2]
    with _mem(tmp_path / "parent", fresh_redis_url) as mem:
        chat = mem.session("s1", user_id="u1")
        r = _turn(chat, MESSAGES[2])
        assert r.restored_from == "cold" and r.rebuilt is None and r.reused_tokens > 0
        assert r.token_ids == twin[2] and _turn(chat, MESSAGES[3]).token_ids == twin[3]
        mem.sessions.close()
