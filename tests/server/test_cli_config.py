"""``--config`` (a TOML or JSON file, or ``$AGENTMEM_CONFIG``) and ``serve --set``: the CLI opens a store with the
user's ``MemoryConfig`` (its backends first) and the server with its ``ServerSettings``, as a user of a server with
PostgreSQL behind it needs; bad settings are refused naming the field."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import httpx
import pytest
import redis

from server_helpers import run_cli, start_server, stop_server

SECRET = "ghp_" + "Fz9q" * 9  # a GitHub token's shape


def _postgres_config(tmp_path, url: str, *, extra: str = "") -> str:
    path = tmp_path / "agentmem.toml"
    path.write_text(f'[memory]\ncatalog_url = "{url}"\nvector_url = "pgvector"\n{extra}', encoding="utf-8")
    return str(path)


def test_every_command_opens_the_backends_of_its_config(tmp_path, fresh_postgres_url):
    config = _postgres_config(tmp_path, fresh_postgres_url)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    rec = json.loads(run_cli("remember", "I moved to Lyon last May.", "--path", a, "--user", "u1",
                             "--config", config).stdout)
    # another store directory with the same config reads the same PostgreSQL catalog and pgvector index
    hits = [json.loads(x) for x in run_cli("recall", "where do I live?", "--path", b, "--user", "u1", "-k", "1",
                                           "--config", config).stdout.splitlines()]
    assert [h["id"] for h in hits] == [rec["id"]]
    listed = run_cli("list", "--path", b, "--user", "u1", env={"AGENTMEM_CONFIG": config}).stdout  # the env var
    assert [json.loads(x)["id"] for x in listed.splitlines()] == [rec["id"]]
    assert run_cli("list", "--path", b, "--user", "u1").stdout.strip() == ""  # without it: b's own SQLite, empty
    json_config = tmp_path / "agentmem.json"
    json_config.write_text(json.dumps({"memory": {"catalog_url": fresh_postgres_url, "vector_url": "pgvector"}}))
    assert json.loads(run_cli("forget", "--path", b, "--user", "u1", "--config", str(json_config)).stdout) == {
        "deleted": 1}


@pytest.mark.parametrize("text, message", [
    ('[memory]\nkv_encoding = "sometimes"\n', "kv_encoding"),
    ('[memory]\nno_such_field = 1\n', "no_such_field"),
    ('[storage]\ncatalog_url = "memory"\n', "storage"),
    ('[memory\n', "not valid TOML"),
])
def test_a_bad_config_is_refused_naming_the_problem(tmp_path, text, message):
    config = tmp_path / "bad.toml"
    config.write_text(text, encoding="utf-8")
    proc = run_cli("stats", "--path", str(tmp_path / "s"), "--config", str(config), check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_serve_takes_memory_and_server_settings_from_the_config_and_set(tmp_path, tiny_model_dir,
                                                                       fresh_postgres_url):
    path = tmp_path / "store"
    key = run_cli("keys", "add", "--path", str(path), "--user", "u1").stdout.strip()
    config = _postgres_config(tmp_path, fresh_postgres_url, extra="[server]\nmax_tokens_limit = 8\n")
    proc, url = start_server(path, tiny_model_dir, "--config", config, "--set", "secret_policy=reject")
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
            saved = c.post("/v1/memories", json={"text": "My dog is called Rex.", "user_id": "u1"})
            assert saved.status_code == 201
            # [memory] of the config: the server's catalog is the PostgreSQL one, read here from another directory
            listed = run_cli("list", "--path", str(tmp_path / "other"), "--user", "u1", "--config", config).stdout
            assert [json.loads(x)["id"] for x in listed.splitlines()] == [saved.json()["id"]]
            # --set of a memory field: secrets are refused, not redacted (the default)
            refused = c.post("/v1/memories", json={"text": f"my token is {SECRET}", "user_id": "u1"})
            assert refused.status_code == 400 and SECRET not in refused.text
            # [server] of the config: a larger max_tokens is refused naming the limit
            big = c.post("/v1/chat/completions", json={"model": "x", "user": "u1", "max_tokens": 16,
                                                       "messages": [{"role": "user", "content": "hi"}]})
            assert big.status_code in (400, 429) and "max_tokens" in big.text
    finally:
        stop_server(proc)


def test_serve_refuses_an_unknown_setting_and_auth_off_in_a_config_off_loopback(tmp_path):
    proc = run_cli("serve", "--path", str(tmp_path / "s"), "--no-auth", "--set", "kv_encodng=eager", check=False)
    assert proc.returncode == 2 and "kv_encodng" in proc.stderr
    config = tmp_path / "open.toml"
    config.write_text("[server]\nauth = false\n", encoding="utf-8")
    proc = run_cli("serve", "--path", str(tmp_path / "s"), "--config", str(config), "--host", "0.0.0.0",
                   check=False)
    assert proc.returncode == 2 and "loopback" in proc.stderr


def test_the_server_docs_config_example_runs_as_written(tmp_path, tiny_model_dir, fresh_postgres_url,
                                                        fresh_redis_url, monkeypatch):
    """docs/server.md's ``agentmem.toml`` and the two commands under it, on this test's PostgreSQL and Redis (the
    only change: their URLs) and the tiny model."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text(encoding="utf-8")
    toml = re.search(r"```toml\n(# agentmem\.toml\n.*?)```", page, flags=re.S).group(1)
    commands = re.search(r"```bash\n(agentmem serve --path ./memdata --config agentmem.toml.*?)```", page,
                         flags=re.S).group(1).splitlines()
    toml = re.sub(r'catalog_url = "[^"]*"', f'catalog_url = "{fresh_postgres_url}"', toml)
    toml = re.sub(r'limits_url = "[^"]*"', f'limits_url = "{fresh_redis_url}"', toml)
    (tmp_path / "agentmem.toml").write_text(re.sub(r'blob_url = "[^"]*"', f'blob_url = "{fresh_redis_url}"', toml))
    monkeypatch.chdir(tmp_path)  # the commands' relative paths
    serve = shlex.split(commands[0])
    assert serve[:4] == ["agentmem", "serve", "--path", "./memdata"]
    key = run_cli("keys", "add", "--path", "./memdata", "--user", "u1").stdout.strip()
    proc, url = start_server(tmp_path / "memdata", tiny_model_dir, *serve[4:])
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
            c.post("/v1/memories", json={"text": "I moved to Lyon last May.", "user_id": "u1"}).raise_for_status()
            c.post("/v1/chat/completions", json={"model": "x", "user": "u1", "max_tokens": 2, "messages": [
                {"role": "user", "content": "Where do I live?"}]}).raise_for_status()  # counted in Redis, released
            over = c.post("/v1/chat/completions", json={"model": "x", "user": "u1", "max_tokens": 2048,
                                                        "messages": [{"role": "user", "content": "hi"}]})
            assert over.status_code == 400 and "max_tokens" in over.text  # [server] max_tokens_limit = 1024
    finally:
        stop_server(proc)
    recall = shlex.split(commands[1])
    assert recall[:2] == ["agentmem", "recall"]
    hits = [json.loads(x) for x in run_cli(*recall[1:]).stdout.splitlines()]
    assert [h["text"] for h in hits][:1] == ["I moved to Lyon last May."]
    assert redis.Redis.from_url(fresh_redis_url).dbsize() > 0  # the KV blob went to Redis (kv_encoding=eager)


@pytest.mark.parametrize("warmup", [True, False])
def test_serve_loads_the_model_before_listening_so_writes_carry_their_kv(tmp_path, tiny_model_dir, warmup):
    """With the model loaded at start, a memory written before any chat is stored with its KV (kv_encoding
    'lazy'); with ``warmup=false`` it waits for the first chat that mounts it, as every write did before."""
    path = tmp_path / "store"
    key = run_cli("keys", "add", "--path", str(path), "--user", "u1").stdout.strip()
    proc, url = start_server(path, tiny_model_dir, "--set", f"warmup={str(warmup).lower()}")
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
            saved = c.post("/v1/memories", json={"text": "My dog is called Rex.", "user_id": "u1"})
            assert saved.status_code == 201
            kv = saved.json()["kv"]
            assert (kv is not None and kv["tokens"] > 0) if warmup else kv is None
    finally:
        stop_server(proc)


@pytest.mark.parametrize("settings", [{}, {"warmup": False}, {"upstream_url": "http://127.0.0.1:9/v1"}],
                         ids=["default", "warmup-off", "proxy"])
def test_an_app_run_by_any_asgi_server_loads_the_model_when_it_starts(tmp_path, settings) -> None:
    """``create_app`` under uvicorn (or gunicorn, or a test client) loads the model in its lifespan, before it listens,
    as ``agentmem serve`` does; not with ``warmup=False``, nor in proxy mode (the answers come from upstream)."""
    from fastapi.testclient import TestClient

    from agentmem import AgentMemory
    from agentmem.kv.testing import tiny_causal_lm
    from agentmem.server import ServerSettings, create_app

    with AgentMemory(tmp_path / "s", model=tiny_causal_lm("llama", seed=0)) as mem:
        app = create_app(mem, keys=None, settings=ServerSettings(auth=False, **settings), mcp=False)
        assert mem.stats()["model_loaded"] is False
        with TestClient(app, base_url="http://127.0.0.1") as client:  # entering it runs the lifespan's start
            assert mem.stats()["model_loaded"] is (settings == {})
            kv = client.post("/v1/memories", json={"text": "My dog is called Rex.", "user_id": "u1"}).json()["kv"]
            assert (kv is not None) is (settings == {})
