"""Serving many users: a client that hangs up stops its decode, caps answer 429 + Retry-After, SIGTERM drains in
bounded time. Against the real server (the installed ``agentmem serve``) with real clients (openai, httpx)."""

from __future__ import annotations

import json
import re
import signal
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from server_helpers import run_cli, start_server

LONG = 400  # answer tokens asked for by a request that will be abandoned (the tiny model has 512 positions)


class Capped(NamedTuple):
    url: str
    key: str
    path: Path  # the store: its catalog.db is what a write waits on


@pytest.fixture(scope="module")
def capped(tmp_path_factory, tiny_model_dir) -> Iterator[Capped]:
    """A server with one chat request in flight per user, and max_tokens up to 450."""
    path = tmp_path_factory.mktemp("capped") / "store"
    key = run_cli("keys", "add", "--path", str(path), "--user", "a", "--user", "b").stdout.strip()
    proc, url = start_server(path, tiny_model_dir, "--set", "max_concurrent_per_user=1", "--set",
                             "max_tokens_limit=450", "--fidelity-share", "0")
    yield Capped(url, key, path)
    proc.terminate()
    proc.wait(timeout=60)


def _metric(url: str, key: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"}).text
    found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def _long_question(url: str, key: str, user: str = "b", suffix: str = "") -> str:
    """A question the random model answers at length (greedy decoding of some prompts stops early)."""
    for question in ("Tell me a long story.", "hello", "Go on and on.", "What do you know about me?"):
        question += suffix
        r = _client(url, key).chat.completions.create(model="x", user=user, max_tokens=40, messages=[
            {"role": "user", "content": question}], extra_body={"agentmem": {"remember": False}})
        if r.usage.completion_tokens == 40:
            return question
    pytest.skip("no prompt makes the random model answer at length")


def _stream_long_answer(url: str, key: str, question: str, started: threading.Event,
                        statuses: list[int]) -> threading.Thread:
    """User a streams a ``LONG`` answer to ``question`` on a thread (not remembered): ``started`` is set at its
    first piece of text, and its HTTP status is appended to ``statuses`` when the stream ends (-1: the connection
    broke)."""
    def stream() -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
            body = {"model": "x", "user": "a", "max_tokens": LONG, "stream": True,
                    "messages": [{"role": "user", "content": question}], "agentmem": {"remember": False}}
            try:
                with c.stream("POST", "/v1/chat/completions", json=body) as r:
                    for line in r.iter_lines():
                        if '"content"' in line:
                            started.set()
                    statuses.append(r.status_code)
            except httpx.HTTPError:  # the server went away mid-answer (killed)
                statuses.append(-1)

    thread = threading.Thread(target=stream)
    thread.start()
    return thread


def _wait_for(predicate, timeout: float = 60.0, poll: float = 0.1) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(poll)


def test_hangup_mid_stream_stops_the_decode_and_nothing_is_remembered(capped):
    url, key = capped.url, capped.key
    question = _long_question(url, key) + " (stream)"
    before = _metric(url, key, "agentmem_chat_cancelled_total")
    received = 0
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as c:
        body = {"model": "x", "user": "a", "max_tokens": LONG, "stream": True,
                "messages": [{"role": "user", "content": question}]}
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                received += '"content"' in line
                if received >= 4:
                    break  # hang up: leaving the block closes the connection
    _wait_for(lambda: _metric(url, key, "agentmem_chat_cancelled_total") > before)
    decoded = _metric(url, key, 'agentmem_decoded_tokens_total{outcome="cancelled"}')
    assert 3 <= decoded < LONG  # stopped early, not decoded to the end unseen
    # pieces decoded after the hang-up was noticed: the decode stops before its next step (at most 1)
    assert _metric(url, key, 'agentmem_cancel_overrun_pieces_bucket{le="1.0"}') == \
        _metric(url, key, "agentmem_cancel_overrun_pieces_count") >= 1
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as c:
        texts = [m["text"] for m in c.get("/v1/memories", params={"user_id": "a"}).json()["memories"]]
    assert question not in texts  # the abandoned exchange was not remembered


def _post_and_hang_up(url: str, key: str, body: dict, hang_up_when) -> None:
    """POST a non-streamed chat request over a plain connection and close it, without reading a byte of the
    answer, once ``hang_up_when()`` holds: a client whose timeout fires or whose process dies mid-request."""
    where = urlsplit(url)
    payload = json.dumps(body).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {where.netloc}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
    with socket.create_connection((where.hostname, where.port), timeout=60) as sock:
        sock.sendall(head + payload)
        _wait_for(hang_up_when, poll=0.01)


def test_hangup_without_stream_stops_the_decode_and_nothing_is_remembered(capped):
    url, key = capped.url, capped.key
    question = _long_question(url, key, suffix=" (plain)")
    cancelled = _metric(url, key, "agentmem_chat_cancelled_total")
    decoded = _metric(url, key, 'agentmem_decoded_tokens_total{outcome="cancelled"}')
    body = {"model": "x", "user": "a", "max_tokens": LONG, "messages": [{"role": "user", "content": question}]}
    # hang up once the request is admitted (its body read, its answer being computed), whatever the machine's speed
    _post_and_hang_up(url, key, body, lambda: _metric(url, key, "agentmem_chat_in_flight") >= 1)
    _wait_for(lambda: _metric(url, key, "agentmem_chat_cancelled_total") > cancelled)
    assert _metric(url, key, 'agentmem_decoded_tokens_total{outcome="cancelled"}') - decoded < LONG  # cut short
    _wait_for(lambda: _metric(url, key, "agentmem_chat_in_flight") == 0)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as c:
        texts = [m["text"] for m in c.get("/v1/memories", params={"user_id": "a"}).json()["memories"]]
    assert question not in texts  # the abandoned exchange was not remembered
    # the user's slot is free again: a new request is admitted
    r = _client(url, key).chat.completions.create(model="x", user="a", max_tokens=2,
                                                  messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].finish_reason in ("stop", "length")


def test_hangup_while_the_turns_are_written_withdraws_them(capped):
    """The answer is decoded, its turns are being written (held up by another process's write lock on the
    catalog), and the client hangs up: the answer is never delivered, so the written turns are withdrawn."""
    url, key = capped.url, capped.key
    question = "Please remember that my locker code is 4417."
    cancelled = _metric(url, key, "agentmem_chat_cancelled_total")
    decoded = _metric(url, key, 'agentmem_decoded_tokens_total{outcome="completed"}')
    body = {"model": "x", "user": "a", "max_tokens": 4, "messages": [{"role": "user", "content": question}]}
    catalog = sqlite3.connect(capped.path / "catalog.db", timeout=30, isolation_level=None)
    try:
        catalog.execute("BEGIN IMMEDIATE")  # the server's write now waits (its busy timeout is 30 s)
        _post_and_hang_up(url, key, body, lambda: _metric(
            url, key, 'agentmem_decoded_tokens_total{outcome="completed"}') > decoded)
        time.sleep(0.5)  # the hang-up is seen by the route's watch (or, at the latest, once the write returns)
    finally:
        catalog.rollback()
        catalog.close()
    _wait_for(lambda: _metric(url, key, "agentmem_chat_cancelled_total") > cancelled)
    _wait_for(lambda: _metric(url, key, "agentmem_chat_in_flight") == 0)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as c:
        texts = [m["text"] for m in c.get("/v1/memories", params={"user_id": "a"}).json()["memories"]]
        hits = c.post("/v1/memories/recall", json={"user_id": "a", "query": "locker code", "k": 5}).json()["hits"]
    assert question not in texts and question not in [h["text"] for h in hits]


def test_a_long_session_turn_does_not_hold_back_another_users_answer(capped):
    """Session turns (X-AgentMem-Session) decode in the same batch as every other answer: while user a's long
    session turn streams, user b's answer is prefilled between two of its steps and finishes first."""
    url, key = capped.url, capped.key
    headers = {"Authorization": f"Bearer {key}", "X-AgentMem-Session": "long-turn"}
    question = _long_question(url, key, user="a")
    other: threading.Thread | None = None
    b_answered = threading.Event()
    after_b = 0  # pieces of a's turn that arrived after b had its whole answer

    def answer_b() -> None:
        _client(url, key).chat.completions.create(model="x", user="b", max_tokens=2,
                                                  messages=[{"role": "user", "content": "hi"}])
        b_answered.set()

    with httpx.Client(base_url=url, headers=headers, timeout=120) as c:
        body = {"model": "x", "user": "a", "max_tokens": LONG, "stream": True,
                "messages": [{"role": "user", "content": question}], "agentmem": {"remember": False}}
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if '"content"' not in line:
                    continue
                if other is None:  # a's turn is decoding: b asks now
                    other = threading.Thread(target=answer_b)
                    other.start()
                elif b_answered.is_set():
                    after_b += 1
    assert other is not None
    other.join(60)
    assert b_answered.is_set() and after_b > 0


def test_caps_answer_429_with_retry_after_and_400_over_the_token_limit(capped):
    url, key = capped.url, capped.key
    started, done = threading.Event(), []
    t = _stream_long_answer(url, key, _long_question(url, key), started, done)
    assert started.wait(60)
    with pytest.raises(openai.RateLimitError) as exc:
        _client(url, key).chat.completions.create(model="x", user="a", max_tokens=2,
                                                  messages=[{"role": "user", "content": "me too"}])
    assert exc.value.response.headers["retry-after"] == "1"
    assert "max_concurrent_per_user=1" in exc.value.message
    # another user is not held back by a's long answer
    r = _client(url, key).chat.completions.create(model="x", user="b", max_tokens=2,
                                                  messages=[{"role": "user", "content": "hi"}])
    assert r.usage.completion_tokens >= 1
    t.join(120)
    assert done == [200]
    with pytest.raises(openai.BadRequestError, match="max_tokens must be <= 450"):
        _client(url, key).chat.completions.create(model="x", user="b", max_tokens=451,
                                                  messages=[{"role": "user", "content": "hi"}])
    assert _metric(url, key, "agentmem_chat_rejected_total") >= 1


def test_a_users_cap_holds_across_two_servers_sharing_their_limits(tmp_path, tiny_model_dir, fresh_redis_url):
    """Two servers behind one load balancer (separate stores here; only the caps are shared, in Redis): while user a
    streams a long answer from server A, a's next request to server B gets 429, another user's is answered, and once
    A's answer is over B admits a again. When A is killed mid-answer (no release), B refuses a until A's lease on the
    share ends, then admits a."""
    lease_s = 2.0
    settings = ("--set", "max_concurrent_per_user=1", "--set", f"limits_url={fresh_redis_url}",
                "--set", f"limits_lease_s={lease_s}", "--fidelity-share", "0")
    servers = []
    for host in ("host-a", "host-b"):
        key = run_cli("keys", "add", "--path", str(tmp_path / host), "--user", "a", "--user", "b").stdout.strip()
        proc, url = start_server(tmp_path / host, tiny_model_dir, *settings)
        servers.append((proc, url, key))
    (_, url_a, key_a), (_, url_b, key_b) = servers
    try:
        question = _long_question(url_a, key_a, user="b")
        started, done = threading.Event(), []
        t = _stream_long_answer(url_a, key_a, question, started, done)
        assert started.wait(60)
        with pytest.raises(openai.RateLimitError) as exc:
            _client(url_b, key_b).chat.completions.create(model="x", user="a", max_tokens=2,
                                                          messages=[{"role": "user", "content": "me too"}])
        assert not done  # refused while A's answer was still being decoded
        assert "max_concurrent_per_user=1" in exc.value.message and exc.value.response.headers["retry-after"] == "1"
        r = _client(url_b, key_b).chat.completions.create(model="x", user="b", max_tokens=2,
                                                          messages=[{"role": "user", "content": "hi"}])
        assert r.usage.completion_tokens >= 1  # another user is not held back
        t.join(120)
        r = _client(url_b, key_b).chat.completions.create(model="x", user="a", max_tokens=2,
                                                          messages=[{"role": "user", "content": "me too"}])
        assert r.usage.completion_tokens >= 1  # A gave a's share back when its answer ended
        started, done = threading.Event(), []
        t = _stream_long_answer(url_a, key_a, question, started, done)
        assert started.wait(60)
        servers[0][0].kill()  # A dies mid-answer: it neither releases nor renews a's share
        servers[0][0].wait(10)
        with pytest.raises(openai.RateLimitError):  # the share outlives A for at most its lease
            _client(url_b, key_b).chat.completions.create(model="x", user="a", max_tokens=2,
                                                          messages=[{"role": "user", "content": "me too"}])
        time.sleep(lease_s + 0.5)
        r = _client(url_b, key_b).chat.completions.create(model="x", user="a", max_tokens=2,
                                                          messages=[{"role": "user", "content": "me too"}])
        assert r.usage.completion_tokens >= 1  # the dead server's share ended with its lease
        t.join(60)
    finally:
        for proc, _, _ in servers:
            proc.terminate()
            proc.wait(timeout=60)


def test_sigterm_drains_in_bounded_time(tmp_path, tiny_model_dir):
    path = tmp_path / "store"
    key = run_cli("keys", "add", "--path", str(path), "--user", "a").stdout.strip()
    proc, url = start_server(path, tiny_model_dir, "--set", "drain_seconds=0", "--fidelity-share", "0")
    try:
        question = _long_question(url, key, user="a")
        got_first = threading.Event()
        lines: list[str] = []

        def stream() -> None:
            try:
                with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
                    body = {"model": "x", "user": "a", "max_tokens": LONG, "stream": True,
                            "messages": [{"role": "user", "content": question}]}
                    with c.stream("POST", "/v1/chat/completions", json=body) as r:
                        for line in r.iter_lines():
                            lines.append(line)
                            got_first.set()
            except httpx.HTTPError:
                pass  # the server went away mid-answer: expected

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        assert got_first.wait(60)
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        # drain_seconds=0: the decode is cancelled at once, the process is gone in bounded time, the answer cut
        # short (with a 1 s drain the tiny model's 400 tokens could end within it on a fast CPU, and did)
        assert time.time() - sent < 10
        t.join(10)
        assert "data: [DONE]" not in lines
    finally:
        if proc.poll() is None:
            proc.kill()
