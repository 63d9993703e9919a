"""Several ``agentmem serve`` processes over one store: PostgreSQL + pgvector for the catalog and vectors, Redis for
the KV blobs, and the API keys in PostgreSQL too (``[server] keys_url``), as a deployment behind a load balancer
runs them. Each server has its own store directory (hosts share nothing on disk); what one writes, forgets or
revokes, the other serves at once, and an erasure on one reaches the other's in-memory copies (its request log)
through the erasure journal in the store."""

from __future__ import annotations

import time

import httpx

from server_helpers import run_cli, start_server, stop_server


def test_two_servers_share_the_store_and_one_set_of_keys(tmp_path, tiny_model_dir, fresh_postgres_url,
                                                         fresh_redis_url) -> None:
    config = tmp_path / "agentmem.toml"
    config.write_text(f'[memory]\ncatalog_url = "{fresh_postgres_url}"\nvector_url = "pgvector"\n'
                      f'blob_url = "{fresh_redis_url}"\n\n[server]\nkeys_url = "{fresh_postgres_url}"\n',
                      encoding="utf-8")
    host_a, host_b = tmp_path / "host-a", tmp_path / "host-b"
    key = run_cli("keys", "add", "--path", str(host_a), "--config", str(config), "--user", "u1").stdout.strip()
    assert not (host_a / "api_keys.db").exists()  # the key went to PostgreSQL, not to this host's directory
    a, url_a = start_server(host_a, tiny_model_dir, "--config", str(config))
    b, url_b = start_server(host_b, tiny_model_dir, "--config", str(config))
    auth = {"Authorization": f"Bearer {key}"}
    try:
        with httpx.Client(base_url=url_a, headers=auth, timeout=120) as on_a, \
                httpx.Client(base_url=url_b, headers=auth, timeout=120) as on_b:
            saved = on_a.post("/v1/memories", json={"text": "My boat is called Saltire.", "user_id": "u1"})
            assert saved.status_code == 201 and saved.json()["kv"] is not None  # A loaded its model: KV to Redis
            memory_id = saved.json()["id"]
            ask = {"query": "What is my boat called?", "user_id": "u1"}
            assert [h["id"] for h in on_b.post("/v1/memories/recall", json=ask).json()["hits"]] == [memory_id]
            chat = on_b.post("/v1/chat/completions", json={
                "model": "x", "user": "u1", "max_tokens": 2,
                "messages": [{"role": "user", "content": "What is my boat called?"}]}).json()["agentmem"]
            assert [m["id"] for m in chat["mounted"]] == [memory_id] and chat["fallbacks"] == []  # A's KV, loaded
            logged = f"/inspector/requests/{chat['request_id']}"
            assert on_b.get(logged).status_code == 200  # B's request log holds the request that mounted it
            assert on_a.delete(f"/v1/memories/{memory_id}", params={"user_id": "u1"}).status_code in (200, 204)
            left = [h["id"] for h in on_b.post("/v1/memories/recall", json=ask).json()["hits"]]
            assert left and memory_id not in left  # the chat's own turns (remembered by B) are there, not the fact
            assert on_b.get(f"/v1/memories/{memory_id}", params={"user_id": "u1"}).status_code == 404
            # A journalled the erasure in the store; B replays it (every second) and drops its own copies
            deadline = time.monotonic() + 10
            while on_b.get(logged).status_code != 404 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert on_b.get(logged).status_code == 404
            key_id = key.split("_")[1]
            run_cli("keys", "revoke", key_id, "--path", str(host_b), "--config", str(config))
            assert on_a.post("/v1/memories/recall", json=ask).status_code == 401  # revoked on B's host, for both
            assert on_b.post("/v1/memories/recall", json=ask).status_code == 401
    finally:
        stop_server(a)
        stop_server(b)
