"""The REST API over real HTTP: memories, sessions, stats, OpenAPI; auth (401/403) and error codes (400/404/413)."""

from __future__ import annotations


def test_remember_recall_get_list_forget(server):
    with server.client(server.key_u1) as c:
        r = c.post("/v1/memories", json={"text": "My tortoise is called Shelly.", "user_id": "u1", "tags": ["pets"],
                                         "ttl": 3600, "metadata": {"source": "chat"}})
        assert r.status_code == 201, r.text
        rec = r.json()
        assert rec["text"] == "My tortoise is called Shelly." and rec["tags"] == ["pets"] and rec["expires_at"]
        assert rec["event"] == "ADD" and rec["superseded_ids"] == [] and rec["matched_id"] is None
        again = c.post("/v1/memories", json={"text": "my tortoise is called Shelly", "user_id": "u1"}).json()
        assert (again["event"], again["matched_id"], again["seen_count"]) == ("NOOP", rec["id"], 2)
        assert c.get(f"/v1/memories/{rec['id']}").json()["event"] is None  # a read describes the entry, not a write
        hits = c.post("/v1/memories/recall", json={"query": "what is my tortoise called?", "user_id": "u1"}).json()["hits"]
        assert hits[0]["id"] == rec["id"] and hits[0]["score"] > 0
        assert c.get(f"/v1/memories/{rec['id']}").json()["text"] == "My tortoise is called Shelly."
        listed = c.get("/v1/memories", params={"user_id": "u1", "tag": "pets"}).json()["memories"]
        assert [m["id"] for m in listed] == [rec["id"]]
        msgs = c.post("/v1/memories/messages", json={"user_id": "u1", "session_id": "m1", "messages": [
            {"role": "system", "content": "be nice"}, {"role": "user", "content": "I like tea."},
            {"role": "assistant", "content": "Noted."}]})
        assert msgs.status_code == 201 and [m["role"] for m in msgs.json()["memories"]] == ["user", "assistant"]
        agent = c.post("/v1/memories/messages", json={"user_id": "u1", "session_id": "m1", "messages": [
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",  # OpenAI leaves content out here
                                                  "function": {"name": "get_time", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "09:30"}]})
        assert agent.status_code == 201, agent.text
        assert [(m["role"], m["speaker"], m["text"]) for m in agent.json()["memories"]] == [
            ("tool", "get_time", "returned: 09:30")]
        assert c.post("/v1/memories/forget", json={"user_id": "u1", "session_id": "m1"}).json() == {"deleted": 3}
        doc = c.post("/v1/memories/documents", json={"user_id": "u1", "title": "Tortoise care", "max_words": 8,
                                                     "tags": ["care"], "text": "Shelly eats dandelions and clover. "
                                                     "She hibernates from November to March.\n\nShe needs a UV lamp."})
        assert doc.status_code == 201, doc.text
        assert [(m["text"], m["metadata"]["document"]["part"]) for m in doc.json()["memories"]] == [
            ("Tortoise care: Shelly eats dandelions and clover.", 1),
            ("Tortoise care: She hibernates from November to March.", 2),
            ("Tortoise care: She needs a UV lamp.", 3)]
        assert c.post("/v1/memories/forget", json={"user_id": "u1", "tags": ["care"]}).json() == {"deleted": 3}
        assert c.delete(f"/v1/memories/{rec['id']}").json() == {"deleted": 1}
        assert c.get(f"/v1/memories/{rec['id']}").status_code == 404
        assert c.post("/v1/sweep").json()["expired"] >= 0


def test_auth_401_without_or_with_a_bad_key_and_403_for_another_tenant(server):
    with server.client() as c:
        r = c.post("/v1/memories/recall", json={"query": "x", "user_id": "u1"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert c.get("/metrics").status_code == 401
    with server.client("am_0000_nope") as c:
        assert c.get("/v1/stats").status_code == 401
    with server.client(server.key_u2) as c:
        r = c.post("/v1/memories", json={"text": "not mine", "user_id": "u1"})
        assert r.status_code == 403 and r.json()["error"]["type"] == "forbidden"
        assert c.get("/v1/memories", params={"user_id": "u1"}).status_code == 403
    with server.client(server.key_u1) as c:  # the key covers u1 and u3, not u2
        assert c.post("/v1/memories", json={"text": "third", "user_id": "u3"}).status_code == 201
        theirs = c.post("/v1/memories", json={"text": "u1's secret plan", "user_id": "u1"}).json()
    with server.client(server.key_u2) as c:  # another tenant's entry is not even found
        assert c.get(f"/v1/memories/{theirs['id']}").status_code == 404
        assert c.delete(f"/v1/memories/{theirs['id']}").status_code == 404
    with server.client(server.key_u1) as c:
        assert c.get(f"/v1/memories/{theirs['id']}").status_code == 200


def test_typed_errors_become_json_with_status_codes(server):
    with server.client(server.key_u1) as c:
        empty = c.post("/v1/memories", json={"text": "  ", "user_id": "u1"})
        assert empty.status_code == 400 and empty.json()["error"]["type"] == "InvalidInputError"
        assert empty.json()["error"]["param"] == "text"
        missing = c.post("/v1/memories", json={"user_id": "u1"})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "text"
        bad_k = c.post("/v1/memories/recall", json={"query": "x", "user_id": "u1", "k": 0})
        assert bad_k.status_code == 400
        unknown = c.post("/v1/memories", json={"text": "x", "user_id": "u1", "colour": "red"})
        assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "colour"
        assert c.get("/v1/memories/no-such-id").json()["error"]["code"] == 404
        huge = c.post("/v1/memories", json={"text": "x" * (2 << 20), "user_id": "u1"})
        assert huge.status_code == 413 and huge.json()["error"]["type"] == "too_large"
        chunked = c.post("/v1/memories", content=(b" " * (64 << 10) for _ in range(40)),  # no Content-Length
                         headers={"content-type": "application/json"})
        assert chunked.status_code == 413 and chunked.json()["error"]["type"] == "too_large"
        small = c.post("/v1/memories", content=iter([b'{"text": "Chunked, but small.",', b' "user_id": "u1"}']),
                       headers={"content-type": "application/json"})
        assert small.status_code == 201 and small.json()["text"] == "Chunked, but small."
        assert c.post("/v1/memories/forget", json={"user_id": "u1", "session_id": "nothing-here"}).json() == \
            {"deleted": 0}


def test_sessions_open_send_offload_end(server):
    with server.client(server.key_u1) as c:
        opened = c.post("/v1/sessions", json={"user_id": "u1", "session_id": "rest-s1"}).json()
        assert opened["session_id"] == "rest-s1"
        t1 = c.post("/v1/sessions/rest-s1/messages", json={"user_id": "u1", "text": "Hello, I am Ann.",
                                                            "max_new_tokens": 4})
        assert t1.status_code == 200, t1.text
        t2 = c.post("/v1/sessions/rest-s1/messages", json={"user_id": "u1", "text": "Who am I?",
                                                            "max_new_tokens": 4}).json()
        assert t2["reused_tokens"] > 0 and t2["tier"] == "hot"
        sessions = c.get("/v1/sessions", params={"user_id": "u1"}).json()["sessions"]
        assert any(s["session_id"] == "rest-s1" and s["tier"] == "hot" and s["tokens"] > 0 for s in sessions)
        assert c.post("/v1/sessions/rest-s1/offload", json={"user_id": "u1", "to": "disk"}).json()["tier"] == "cold"
        t3 = c.post("/v1/sessions/rest-s1/messages", json={"user_id": "u1", "text": "Again?",
                                                            "max_new_tokens": 2}).json()
        assert t3["reused_tokens"] > 0
    with server.client(server.key_u2) as c:
        assert c.post("/v1/sessions/rest-s1/messages", json={"user_id": "u1", "text": "hi"}).status_code == 403
        # session ids are per user (#13 item 8): u2's "rest-s1" is a conversation of its own, sharing nothing
        own = c.post("/v1/sessions/rest-s1/messages", json={"user_id": "u2", "text": "hi", "max_new_tokens": 2})
        assert own.status_code == 200 and own.json()["reused_tokens"] == 0, own.text
    with server.client(server.key_u1) as c:
        assert c.delete("/v1/sessions/rest-s1", params={"user_id": "u1"}).json()["ended"] is True
    with server.client(server.key_u2) as c:  # u1 ending its "rest-s1" left u2's alone
        sessions = c.get("/v1/sessions", params={"user_id": "u2"}).json()["sessions"]
        assert any(s["session_id"] == "rest-s1" and s["tokens"] > 0 for s in sessions)


def test_stats_and_openapi(server):
    with server.client(server.key_u1) as c:
        stats = c.get("/v1/stats").json()  # a key sees its own users only (store-wide counters need --no-auth)
        assert set(stats["users"]) == {"u1", "u3"} and stats["server"]["model"] == "tiny-llama"
        paths = c.get("/openapi.json").json()["paths"]
        for p in ("/v1/memories", "/v1/memories/recall", "/v1/memories/{entry_id}", "/v1/memories/{entry_id}/history",
                  "/v1/sessions/{session_id}/messages", "/v1/chat/completions", "/v1/models", "/v1/stats"):
            assert p in paths


def test_update_and_history(server):
    with server.client(server.key_u1) as c:
        rec = c.post("/v1/memories", json={"text": "I live in Lyon.", "user_id": "u1"}).json()
        r = c.patch(f"/v1/memories/{rec['id']}", json={"text": "I live in Paris.", "reason": "moved"})
        h = c.get(f"/v1/memories/{rec['id']}/history")
        assert r.status_code == 200, r.text
        assert c.get(f"/v1/memories/{rec['id']}").json()["text"] == "I live in Paris."
        assert "I live in Lyon." in [v["text"] for v in h.json()["versions"]]
    with server.client(server.key_u2) as c:  # another tenant can neither change nor read its history
        assert c.patch(f"/v1/memories/{rec['id']}", json={"text": "hacked"}).status_code == 404
        assert c.get(f"/v1/memories/{rec['id']}/history").status_code == 404
