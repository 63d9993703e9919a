"""Serving many users: a client that hangs up stops its decode, caps answer 429 + Retry-After, SIGTERM drains in
bounded time. Against the real server (the installed ``agentmem serve``) with real clients (openai, httpx)."""

from __future__ import annotations

import re
import signal
import threading
import time

import httpx
import openai
import pytest

from server_helpers import run_cli, start_server

LONG = 400  # answer tokens asked for by a request that will be abandoned (the tiny model has 512 positions)


@pytest.fixture(scope="module")
def capped(tmp_path_factory, tiny_model_dir):
    """A server with one chat request in flight per user, and max_tokens up to 450."""
    path = tmp_path_factory.mktemp("capped") / "store"
    key = run_cli("keys", "add", "--path", str(path), "--user", "a", "--user", "b").stdout.strip()
    proc, url = start_server(path, tiny_model_dir, "--set", "max_concurrent_per_user=1", "--set",
                             "max_tokens_limit=450", "--fidelity-share", "0")
    yield url, key
    proc.terminate()
    proc.wait(timeout=60)


def _metric(url: str, key: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"}).text
    found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def _long_question(url: str, key: str, user: str = "b") -> str:
    """A question the random model answers at length (greedy decoding of some prompts stops early)."""
    for question in ("Tell me a long story.", "hello", "Go on and on.", "What do you know about me?"):
        r = _client(url, key).chat.completions.create(model="x", user=user, max_tokens=40, messages=[
            {"role": "user", "content": question}], extra_body={"agentmem": {"remember": False}})
        if r.usage.completion_tokens == 40:
            return question
    pytest.skip("no prompt makes the random model answer at length")


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.1)


def test_hangup_mid_stream_stops_the_decode_and_nothing_is_remembered(capped):
    url, key = capped
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


@pytest.mark.xfail(reason="open bug (issue #40): it fails from 5fd9ed2 on (right after the serving commit): a non-streamed "
                   "request whose client hangs up is no longer counted as cancelled within 60 s; the streamed case passes",
                   strict=False)
def test_hangup_without_stream_stops_the_decode(capped):
    url, key = capped
    question = _long_question(url, key)
    before = _metric(url, key, "agentmem_chat_cancelled_total")
    with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                                        timeout=httpx.Timeout(60, read=1.0)) as c:
        c.post("/v1/chat/completions", json={"model": "x", "user": "a", "max_tokens": LONG,
                                             "messages": [{"role": "user", "content": question + " (plain)"}]})
    _wait_for(lambda: _metric(url, key, "agentmem_chat_cancelled_total") > before)
    # the user's slot is free again: a new request is admitted
    r = _client(url, key).chat.completions.create(model="x", user="a", max_tokens=2,
                                                  messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].finish_reason in ("stop", "length")


def test_caps_answer_429_with_retry_after_and_400_over_the_token_limit(capped):
    url, key = capped
    question = _long_question(url, key)
    started = threading.Event()
    done: list[int] = []

    def long_stream() -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
            body = {"model": "x", "user": "a", "max_tokens": LONG, "stream": True,
                    "messages": [{"role": "user", "content": question}], "agentmem": {"remember": False}}
            with c.stream("POST", "/v1/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if '"content"' in line:
                        started.set()
                done.append(r.status_code)

    t = threading.Thread(target=long_stream)
    t.start()
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


def test_sigterm_drains_in_bounded_time(tmp_path, tiny_model_dir):
    path = tmp_path / "store"
    key = run_cli("keys", "add", "--path", str(path), "--user", "a").stdout.strip()
    proc, url = start_server(path, tiny_model_dir, "--set", "drain_seconds=1", "--fidelity-share", "0")
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
        # drain_seconds=1, then the decode is cancelled: the process is gone in bounded time, the answer cut short
        assert time.time() - sent < 10
        t.join(10)
        assert "data: [DONE]" not in lines
    finally:
        if proc.poll() is None:
            proc.kill()
