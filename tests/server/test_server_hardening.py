"""Issue #41, a hostile pass over the running server: erased text gone from every endpoint, one id rule for every
entry point, 400 (not 500) for malformed content parts and every 500 counted, /v1/stats scoped to the caller,
/docs off and /openapi.json behind the keys, private store files, no idle MCP event stream, secrets in session ids.
"""

from __future__ import annotations

import json
import stat
import uuid

import anyio
import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from agentmem import AgentMemory
from agentmem.server import KeyStore, ServerSettings, create_app
from server_helpers import run_cli, start_server, stop_server

SECRET = "ghp_" + "Fz9q" * 9  # a GitHub token's shape


def _mcp_recall(server, key: str, user: str, query: str) -> str:
    async def main() -> str:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
        async with Client(streamable_http_client(f"{server.url}/mcp/", http_client=http),
                          read_timeout_seconds=120) as client:
            result = await client.call_tool("recall", {"query": query, "user_id": user, "k": 10})
            return json.dumps(result.structured_content or [c.text for c in result.content])

    return anyio.run(main)


def _chat_as_u3(server, said: str) -> str:
    """One chat turn of u3 (key u1 covers it) through the OpenAI client; the request's id in the inspector."""
    chat = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.key_u1, max_retries=0, timeout=120)
    r = chat.chat.completions.create(model="tiny-llama", user="u3", max_tokens=4,
                                     messages=[{"role": "user", "content": said}])
    return r.model_extra["agentmem"]["request_id"]


def test_forget_erases_the_text_from_every_endpoint(server):
    marker = "zq" + uuid.uuid4().hex[:12]
    said = f"My diagnosis is {marker}, please remember it."
    rid = _chat_as_u3(server, said)
    with server.client(server.key_u1) as c:
        assert c.post("/v1/memories", json={"text": said, "user_id": "u3"}).status_code == 201
        assert marker in c.get(f"/inspector/requests/{rid}").text  # what the issue saw: it is there before
        assert c.post("/v1/memories/forget", json={"user_id": "u3"}).json()["deleted"] >= 2
        pages = {
            "inspector request": c.get(f"/inspector/requests/{rid}"),
            "inspector overview": c.get("/inspector"),
            "inspector user": c.get("/inspector/users/u3"),
            "list": c.get("/v1/memories", params={"user_id": "u3"}),
            "recall": c.post("/v1/memories/recall", json={"query": said, "user_id": "u3", "k": 10}),
            "stats": c.get("/v1/stats"),
            "metrics": c.get("/metrics"),
        }
    assert pages["inspector request"].status_code == 404
    leaked = [name for name, page in pages.items() if marker in page.text]
    assert not leaked, f"the erased text is still served by {leaked}"
    assert marker not in _mcp_recall(server, server.key_u1, "u3", said)


def test_forgetting_a_remembered_question_drops_its_request(server):
    marker = "zq" + uuid.uuid4().hex[:12]
    said = f"My PIN hint is {marker}."
    rid = _chat_as_u3(server, said)
    with server.client(server.key_u1) as c:
        turn = next(m for m in c.get("/v1/memories", params={"user_id": "u3"}).json()["memories"] if m["text"] == said)
        assert c.delete(f"/v1/memories/{turn['id']}").json() == {"deleted": 1}
        assert c.get(f"/inspector/requests/{rid}").status_code == 404
        assert marker not in c.get("/inspector").text


@pytest.mark.parametrize("bad", ["u1\u200b", "\u202eu1", "u\u00a01", "\ufeffu1"],
                         ids=["zero-width", "bidi-override", "nbsp", "bom"])
def test_invisible_and_bidi_ids_are_refused_before_anything_is_written(server, tmp_path, bad):
    with server.client(server.key_u1) as c:
        before = c.get("/v1/memories", params={"user_id": "u1", "limit": 10_000}).json()["memories"]
        for method, url, body in (("POST", "/v1/memories", {"text": "hello", "user_id": bad}),
                                  ("POST", "/v1/memories/forget", {"user_id": bad}),
                                  ("POST", "/v1/sessions", {"user_id": bad}),
                                  ("POST", "/v1/memories", {"text": "hello", "user_id": "u1", "session_id": bad})):
            r = c.request(method, url, json=body)
            assert r.status_code == 400 and "must be printable" in r.json()["error"]["message"], (url, r.text)
        assert c.get("/v1/memories", params={"user_id": "u1", "limit": 10_000}).json()["memories"] == before
    refused = run_cli("keys", "add", "--path", str(tmp_path / "store"), "--user", bad, check=False)
    assert refused.returncode == 2 and "must be printable" in refused.stderr
    assert not (tmp_path / "store" / "api_keys.db").exists()  # refused before the key store was created


@pytest.mark.parametrize("bad", ["a\tb", "x" * 300], ids=["tab", "300-chars"])
def test_keys_add_refuses_ids_the_api_refuses(tmp_path, bad):
    refused = run_cli("keys", "add", "--path", str(tmp_path / "store"), "--user", "ok", "--user", bad, check=False)
    assert refused.returncode == 2 and "--user" in refused.stderr


def test_forget_with_a_bad_id_erases_nothing_and_audits_what_it_erased(tmp_path):
    with AgentMemory(tmp_path / "store") as mem:
        mem.remember("I keep bees.", user_id="u1")
        with pytest.raises(Exception, match="must be printable") as refused:
            mem.remember("I keep wasps.", user_id="u1\u200b")
        assert type(refused.value).__name__ == "InvalidInputError"
        with pytest.raises(Exception, match="must be printable"):
            mem.forget(user_id="u1\u202e")
        assert len(mem.list(user_id="u1")) == 1
        assert mem.forget(user_id="u1") == 1
    audit = [json.loads(line) for line in (tmp_path / "store" / "audit.jsonl").read_text().splitlines()]
    assert [(a["action"], a["user_id"], a["count"]) for a in audit] == [("forget_user", "u1", 1)]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/memories/messages"])
def test_malformed_content_parts_are_a_400(server, path):
    body = {"model": "tiny-llama", "user": "u1"} if "chat" in path else {"user_id": "u1"}
    body["messages"] = [{"role": "user", "content": [{"type": "text", "text": 5}]}]
    with server.client(server.key_u1) as c:
        r = c.post(path, json=body)
        assert r.status_code == 400, r.text
        assert "messages[0].content[0]" in r.json()["error"]["message"]  # names the bad part
        assert 'agentmem_errors_total{status="500"' not in c.get("/metrics").text


def test_an_unexpected_error_is_a_counted_json_500(tmp_path):
    app = create_app(AgentMemory(tmp_path / "store"), keys=None, settings=ServerSettings(auth=False), mcp=False)

    @app.get("/boom")  # a route with a bug: the app must answer for it like for everything else
    def boom() -> None:
        raise RuntimeError("secret user text that must not reach the client")

    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/boom")
        assert r.status_code == 500 and r.json()["error"]["type"] == "internal_error"
        assert "secret user text" not in r.text
        assert 'agentmem_errors_total{status="500",type="internal_error"} 1.0' in client.get("/metrics").text


def test_stats_show_only_the_callers_users(server):
    with server.client(server.key_u1) as c:  # u1 has a session: u2 must not see it, not even as a count
        assert c.post("/v1/sessions", json={"user_id": "u1", "session_id": "stats-s1"}).status_code == 201
    with server.client(server.key_u2) as c:
        stats = c.get("/v1/stats").json()
    assert set(stats) == {"users", "server"} and set(stats["users"]) == {"u2"}, stats
    assert {"sessions", "session_tokens", "tiers"} <= set(stats["users"]["u2"])
    assert stats["server"] == {"model": "tiny-llama"}


def test_metrics_keep_the_store_wide_tier_gauges_for_the_operator(server, tmp_path):
    """The session tier gauges count every tenant's sessions: a key bound to users scrapes /metrics without them
    (it got them before), the operator (no auth, like /v1/stats' store-wide figures) with them."""
    with server.client(server.key_u1) as c:
        assert c.post("/v1/sessions", json={"user_id": "u1", "session_id": "metrics-s1"}).status_code == 201
    with server.client(server.key_u2) as c:
        scraped = c.get("/metrics")
    assert scraped.status_code == 200 and "agentmem_recall_seconds" in scraped.text
    assert "agentmem_session_tier" not in scraped.text, "a tenant's key sees every tenant's session tiers"
    app = create_app(AgentMemory(tmp_path / "store"), keys=None, settings=ServerSettings(auth=False), mcp=False)
    with TestClient(app) as client:
        text = client.get("/metrics").text
    assert 'agentmem_session_tier_bytes{tier="hot"}' in text and 'agentmem_session_tier_sessions{tier="hot"}' in text


def test_serve_docs_flag_turns_swagger_ui_on_behind_the_keys(tmp_path, tiny_model_dir):
    path = tmp_path / "store"
    key = run_cli("keys", "add", "--path", str(path), "--user", "u1").stdout.strip()
    proc, url = start_server(path, tiny_model_dir, "--docs")
    try:
        assert httpx.get(f"{url}/docs", timeout=60).status_code == 401
        page = httpx.get(f"{url}/docs", headers={"Authorization": f"Bearer {key}"}, timeout=60)
        assert page.status_code == 200 and "/openapi.json" in page.text
    finally:
        stop_server(proc)


def test_docs_are_off_and_the_schema_needs_a_key(server, tmp_path):
    with server.client() as anonymous:
        assert anonymous.get("/openapi.json").status_code == 401
        assert anonymous.get("/redoc").status_code == 404
    with server.client(server.key_u1) as c:
        assert c.get("/docs").status_code == 404
        assert "/v1/memories" in c.get("/openapi.json").json()["paths"]
    keys = KeyStore(tmp_path / "store")
    key = keys.add(["u1"])
    app = create_app(AgentMemory(tmp_path / "store"), keys=keys, settings=ServerSettings(docs=True), mcp=False)
    with TestClient(app) as client:
        assert client.get("/docs").status_code == 401
        page = client.get("/docs", headers={"Authorization": f"Bearer {key}"})
        assert page.status_code == 200 and "/openapi.json" in page.text


def test_store_files_are_the_owners_alone(server):
    with server.client(server.key_u1) as c:  # an erase writes the audit log
        c.post("/v1/memories/forget", json={"user_id": "u1", "session_id": "no-such-session"})
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in
             (server.path, server.path / "catalog.db", server.path / "api_keys.db", server.path / "audit.jsonl")}
    assert modes == {server.path.name: 0o700, "catalog.db": 0o600, "api_keys.db": 0o600, "audit.jsonl": 0o600}, \
        {k: oct(v) for k, v in modes.items()}


def test_mcp_get_holds_no_idle_stream_open(server):
    headers = {"Authorization": f"Bearer {server.key_u1}", "Accept": "text/event-stream"}
    r = httpx.get(f"{server.url}/mcp/", headers=headers, timeout=10)  # hung until the client gave up before
    assert r.status_code == 405 and r.headers["allow"] == "POST"


def test_a_secret_in_a_session_id_is_refused(server, tmp_path):
    with server.client(server.key_u1) as c:
        for url, body in (("/v1/memories", {"text": "hello", "user_id": "u1", "session_id": f"s-{SECRET}"}),
                          ("/v1/sessions", {"user_id": "u1", "session_id": SECRET})):
            r = c.post(url, json=body)
            assert r.status_code == 400 and r.json()["error"]["type"] == "SecretDetectedError", r.text
            assert SECRET not in r.text
    with AgentMemory(tmp_path / "store", secret_policy="reject") as mem:
        with pytest.raises(Exception, match="session_id must not hold a secret") as refused:
            mem.remember("hello", user_id="u1", session_id=SECRET)
        assert type(refused.value).__name__ == "SecretDetectedError"
        assert mem.list(user_id="u1") == []
