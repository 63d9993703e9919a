"""The OpenAI-compatible API, driven by the official ``openai`` client against the running server (no mocks)."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from server_helpers import run_cli


def _client(server, key):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def seeded(server):
    with server.client(server.key_u1) as c:
        rex = c.post("/v1/memories", json={"text": "My dog is called Rex.", "user_id": "u1"}).json()
    with server.client(server.key_u2) as c:
        tom = c.post("/v1/memories", json={"text": "My cat is called Tom.", "user_id": "u2"}).json()
    return {"rex": rex["id"], "tom": tom["id"]}


def test_models_list(server):
    models = _client(server, server.key_u1).models.list()
    assert [m.id for m in models.data] == ["tiny-llama"]


def test_chat_mounts_the_users_memories_and_remembers_the_turn(server, seeded):
    client = _client(server, server.key_u1)
    r = client.chat.completions.create(model="tiny-llama", user="u1", max_tokens=8,
                                       messages=[{"role": "user", "content": "What is my dog called?"}])
    ext = r.model_extra["agentmem"]
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens >= 1
    mounted = {m["id"]: m for m in ext["mounted"]}
    assert seeded["rex"] in mounted and seeded["tom"] not in mounted  # another user's memories never come along
    m = mounted[seeded["rex"]]
    assert m["score"] > 0 and m["tokens"] > 0 and m["position"] > 0
    assert ext["user"] == "u1" and ext["mode"] == "kv" and ext["timings"]["ttft"] > 0
    with server.client(server.key_u1) as c:  # the question (and the answer, if any) became memories of u1
        texts = [e["text"] for e in c.get("/v1/memories", params={"user_id": "u1"}).json()["memories"]]
    assert "What is my dog called?" in texts


def test_user_header_selects_whose_memories(server, seeded):
    client = _client(server, server.key_u1)
    r = client.chat.completions.create(model="x", max_tokens=2, extra_headers={"X-AgentMem-User": "u3"},
                                       messages=[{"role": "user", "content": "What is my dog called?"}])
    assert r.model_extra["agentmem"]["user"] == "u3" and seeded["rex"] not in \
        [m["id"] for m in r.model_extra["agentmem"]["mounted"]]


def test_auth_errors_are_openai_errors(server):
    with pytest.raises(openai.AuthenticationError):
        _client(server, "am_0000_wrong").chat.completions.create(
            model="x", user="u1", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.PermissionDeniedError):
        _client(server, server.key_u2).chat.completions.create(
            model="x", user="u1", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        _client(server, server.key_u1).chat.completions.create(
            model="x", user="u1", messages=[{"role": "assistant", "content": "no question"}])


def _stream_once(client, question: str):
    stream = client.chat.completions.create(model="tiny-llama", user="u1", max_tokens=200, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": question}])
    arrivals, pieces, last = [], [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter())
            pieces.append(chunk.choices[0].delta.content)
        last = chunk
    return arrivals, pieces, last, time.perf_counter()


def test_stream_chunks_arrive_before_decoding_ends(server, seeded):
    client = _client(server, server.key_u1)
    # greedy decoding of a random model may stop early for some prompts: take the first one that runs long
    for question in ("Tell me about my dog.", "Tell me a long story.", "What do you know about me?", "Go on."):
        arrivals, pieces, last, done = _stream_once(client, question)
        if last.usage.completion_tokens >= 40:
            break
    ext = last.model_extra["agentmem"]
    assert last.usage.completion_tokens >= 40 and len(pieces) > 5
    assert "".join(pieces)  # the pieces are the answer's text
    # the first piece reached the client while the server was still decoding the rest
    decode_s = ext["timings"]["decode"]
    assert decode_s > 0 and arrivals[0] < done - decode_s / 2, (arrivals[0], done, decode_s)
    assert seeded["rex"] in [m["id"] for m in ext["mounted"]] or len(ext["recalled"]) > 0


def test_session_header_reuses_session_kv(server, seeded):
    client = _client(server, server.key_u1)
    headers = {"X-AgentMem-Session": "oa-s1"}
    first = client.chat.completions.create(model="x", user="u1", max_tokens=4, extra_headers=headers,
                                           messages=[{"role": "user", "content": "Hi, I am Ann."}])
    second = client.chat.completions.create(model="x", user="u1", max_tokens=4, extra_headers=headers,
                                            messages=[{"role": "user", "content": "Who am I?"}])
    assert first.model_extra["agentmem"]["session_id"] == "oa-s1"
    assert second.model_extra["agentmem"]["reused_tokens"] > 0


def test_an_answer_cut_by_the_models_context_finishes_with_length(server):
    """The served model reads 512 positions: a 1,000-token answer (its end-of-sequence token banned) stops at the
    context's end, and OpenAI calls that ``length``, as for ``max_tokens``; in a session too (where logit_bias is
    refused, but this greedy answer has no end-of-sequence token before the context's end either)."""
    from agentmem.kv.testing import tiny_tokenizer

    # a user with no memories: with memories to mount, asking for more tokens than the context holds is a 400
    key = run_cli("keys", "add", "--path", str(server.path), "--user", "u-long").stdout.strip()
    client, no_end = _client(server, key), {str(tiny_tokenizer().eos_token_id): -100}
    question = [{"role": "user", "content": "Tell me a very long story."}]
    r = client.chat.completions.create(model="x", user="u-long", max_tokens=1000, messages=question, logit_bias=no_end,
                                       extra_body={"agentmem": {"remember": False}})
    assert 0 < r.usage.completion_tokens < 1000 and r.choices[0].finish_reason == "length"
    turn = client.chat.completions.create(model="x", user="u-long", max_tokens=1000, messages=question,
                                          extra_headers={"X-AgentMem-Session": "oa-long"},
                                          extra_body={"agentmem": {"remember": False}})
    assert turn.usage.completion_tokens < 1000 and turn.choices[0].finish_reason == "length"  # (greedy: no EOS)


def test_text_mode_per_request_and_metrics(server, seeded):
    client = _client(server, server.key_u1)
    r = client.chat.completions.create(model="x", user="u1", max_tokens=2, extra_body={"agentmem": {"mode": "text"}},
                                       messages=[{"role": "user", "content": "What is my dog called?"}])
    assert r.model_extra["agentmem"]["mode"] == "text"
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.key_u1}"}, timeout=120).text
    for name in ("agentmem_recall_seconds_count", "agentmem_mount_seconds_count", 'agentmem_ttft_seconds_count{mode="kv"}',
                 'agentmem_ttft_seconds_count{mode="text"}', 'agentmem_kv_mounts_total{result="hit"}',
                 "agentmem_errors_total", "agentmem_fidelity_kl_count"):
        assert name in text, name
    # the store-wide session tier gauges are the operator's (test_server_hardening), not a tenant key's
    assert "agentmem_session_tier_sessions" not in text
    deadline = time.time() + 60  # the fidelity monitor scores in the background (share 1.0 in these tests)
    while "agentmem_fidelity_kl_count 0.0" in text and time.time() < deadline:
        time.sleep(0.5)
        text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.key_u1}"}, timeout=120).text
    assert "agentmem_fidelity_kl_count 0.0" not in text


def test_a_profile_memory_is_mounted_for_a_request_that_does_not_mention_it(server):
    with server.client(server.key_u1) as c:
        diet = c.post("/v1/memories", json={"text": "I am vegetarian.", "user_id": "u3", "kind": "profile"}).json()
    r = _client(server, server.key_u1).chat.completions.create(
        model="x", user="u3", max_tokens=2, messages=[{"role": "user", "content": "Plan my meals for Sunday."}],
        extra_body={"agentmem": {"remember": False}})
    mounted = r.model_extra["agentmem"]["mounted"]
    assert (mounted[0]["id"], mounted[0]["kind"]) == (diet["id"], "profile") and mounted[0]["tokens"] > 0
