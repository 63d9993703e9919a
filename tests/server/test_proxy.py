"""Memory proxy mode (issue #39): ``agentmem serve --upstream`` in front of a REAL second ``agentmem serve`` on
loopback (the shared tiny-model server), driven by the official ``openai`` client. No mocks: the upstream is an
OpenAI-compatible HTTP server answering with its own model."""

from __future__ import annotations

import os

import httpx
import openai
import pytest
from server_helpers import run_cli, start_server, stop_server

from agentmem.server.proxy import MEMORY_HEADER


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, tiny_model_dir, server):
    path = tmp_path_factory.mktemp("proxy") / "store"
    key = run_cli("keys", "add", "--path", str(path), "--user", "alice").stdout.strip()
    os.environ["AGENTMEM_UPSTREAM_API_KEY"] = server.key_u2  # the upstream's key (its one user: u2)
    try:
        proc, url = start_server(path, tiny_model_dir, "--upstream", f"{server.url}/v1",
                                 "--upstream-model", "tiny-llama")
    finally:
        del os.environ["AGENTMEM_UPSTREAM_API_KEY"]
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
        rex = c.post("/v1/memories", json={"text": "My dog is called Rex.", "user_id": "alice"}).json()["id"]
        max_ = c.post("/v1/memories", json={"text": "Your dog is called Max.", "user_id": "alice",
                                             "role": "assistant"}).json()["id"]
    yield {"url": url, "key": key, "rex": rex, "max": max_}
    stop_server(proc)


def _client(proxy, key=None):
    return openai.OpenAI(base_url=f"{proxy['url']}/v1", api_key=key or proxy["key"], max_retries=0, timeout=120)


ASK = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is my dog called?"}]


def test_the_upstream_answers_with_the_callers_memories(proxy, server):
    # the same request straight to the upstream first (not remembered there: both see the same upstream state)
    direct = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.key_u2, max_retries=0, timeout=120)
    plain = direct.chat.completions.create(model="tiny-llama", max_tokens=6, messages=ASK,
                                           extra_body={"agentmem": {"remember": False}})
    r = _client(proxy).chat.completions.create(model="anything", user="alice", max_tokens=6, messages=ASK)
    ext = r.model_extra["agentmem"]
    assert r.model == "tiny-llama" and r.choices[0].message.role == "assistant"  # the upstream's answer
    assert ext["mode"] == "proxy" and ext["user"] == "alice"
    mounted = [m["id"] for m in ext["mounted"]]
    assert proxy["rex"] in mounted and proxy["max"] not in mounted  # the one mount policy: no assistant replies
    assert ext["memory_tokens"] > 0 and all(m["tokens"] > 0 for m in ext["mounted"])
    # the memory message reached the upstream model's prompt (its tiny tokenizer is byte-level)
    assert r.usage.prompt_tokens >= plain.usage.prompt_tokens + len(MEMORY_HEADER + "\n- My dog is called Rex.")
    with httpx.Client(base_url=proxy["url"], headers={"Authorization": f"Bearer {proxy['key']}"}) as c:
        texts = [e["text"] for e in c.get("/v1/memories", params={"user_id": "alice"}).json()["memories"]]
        metrics = c.get("/metrics").text
    assert "What is my dog called?" in texts  # the turn was remembered by the proxy, for alice
    assert 'agentmem_ttft_seconds_count{mode="proxy"}' in metrics


def test_the_upstream_stream_is_passed_through(proxy):
    stream = _client(proxy).chat.completions.create(model="anything", user="alice", max_tokens=20, stream=True,
                                                    messages=ASK)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ext = chunks[-1].model_extra["agentmem"]
    assert len(chunks) > 3 and ext["mode"] == "proxy" and proxy["rex"] in [m["id"] for m in ext["mounted"]]
    assert text.strip() or ext["timings"]["ttft"] > 0


def test_auth_and_tenancy_hold_in_proxy_mode(proxy):
    with pytest.raises(openai.AuthenticationError):
        _client(proxy, "am_0000_wrong").chat.completions.create(model="x", user="alice", messages=ASK)
    with pytest.raises(openai.PermissionDeniedError):
        _client(proxy).chat.completions.create(model="x", user="bob", messages=ASK)


def test_a_tool_round_through_the_proxy_remembers_the_result_with_its_call(proxy):
    call = {"id": "call_9", "type": "function", "function": {"name": "find_vet", "arguments": '{"town": "Ghent"}'}}
    _client(proxy).chat.completions.create(model="anything", user="alice", max_tokens=4, messages=[
        {"role": "user", "content": "Find a vet for Rex."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_9", "content": "Dr. Peeters, Veldstraat 12"}])
    with httpx.Client(base_url=proxy["url"], headers={"Authorization": f"Bearer {proxy['key']}"}) as c:
        stored = c.get("/v1/memories", params={"user_id": "alice", "limit": 100}).json()["memories"]
    assert [(m["speaker"], m["text"]) for m in stored if m["kind"] == "tool"] == [
        ("find_vet", 'called with {"town": "Ghent"}, returned: Dr. Peeters, Veldstraat 12')]
    assert "Find a vet for Rex." not in [m["text"] for m in stored]  # that request made the call (not through here)
