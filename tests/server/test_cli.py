"""The installed ``agentmem`` console script, run in subprocesses: --help everywhere, keys, serve's refusals, and
the store commands on a real store."""

from __future__ import annotations

import json
import re
from datetime import datetime

import httpx
import pytest

from agentmem import AgentMemory
from server_helpers import run_cli

COMMANDS = ["serve", "mcp", "stats", "remember", "list", "recall", "forget", "export", "import", "sweep", "verify",
            "warmup", "keys",
            "keys add", "keys list", "keys revoke"]


def test_help_of_every_command():
    top = run_cli("--help").stdout
    for name in ("serve", "stats", "remember", "list", "recall", "forget", "export", "import", "sweep", "verify",
                 "warmup", "mcp", "keys"):
        assert name in top
    for cmd in COMMANDS:
        out = run_cli(*cmd.split(), "--help").stdout
        assert "Usage:" in out and "--help" in out, cmd


def test_keys_add_list_revoke_against_the_running_server(server):
    key = run_cli("keys", "add", "--path", str(server.path), "--user", "u9", "--label", "cli-test").stdout.strip()
    listed = json.loads(run_cli("keys", "list", "--path", str(server.path)).stdout)
    mine = [k for k in listed if k["label"] == "cli-test"]
    assert len(mine) == 1 and mine[0]["users"] == ["u9"] and key not in json.dumps(listed)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", mine[0]["created_at"])  # a date, not an epoch
    assert mine[0]["revoked_at"] is None
    assert key.split("_")[1] == mine[0]["id"]
    stored = (server.path / "api_keys.db").read_bytes()
    assert key.encode() not in stored and key.split("_", 2)[2].encode() not in stored  # only a hash is kept
    ok = httpx.post(f"{server.url}/v1/memories", headers={"Authorization": f"Bearer {key}"},
                    json={"text": "hello", "user_id": "u9"}, timeout=120)
    assert ok.status_code == 201
    assert json.loads(run_cli("keys", "revoke", mine[0]["id"], "--path", str(server.path)).stdout)["revoked"]
    gone = httpx.get(f"{server.url}/v1/stats", headers={"Authorization": f"Bearer {key}"}, timeout=120)
    assert gone.status_code == 401


def test_serve_refuses_without_keys_and_no_auth_off_loopback(tmp_path):
    proc = run_cli("serve", "--path", str(tmp_path / "empty"), check=False)
    assert proc.returncode == 2 and "agentmem keys add" in proc.stderr
    proc = run_cli("serve", "--path", str(tmp_path / "empty"), "--no-auth", "--host", "0.0.0.0", check=False)
    assert proc.returncode == 2 and "loopback" in proc.stderr


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "store"
    with AgentMemory(path) as mem:
        keep = mem.remember("I moved to Lyon last May.", user_id="u1", session_id="s1", tags=["profile"])
        mem.remember("Old note", user_id="u1", session_id="s2", ttl=0.01)
        mem.remember("Someone else", user_id="u2")
    return path, keep.id


def test_store_commands(store):
    path, keep_id = store
    p = str(path)
    lines = [json.loads(x) for x in run_cli("list", "--path", p, "--user", "u1").stdout.splitlines()]
    assert [x["id"] for x in lines][:1] == [keep_id] and all(x["text"] != "Someone else" for x in lines)
    hits = [json.loads(x) for x in run_cli("recall", "where do I live?", "--path", p, "--user", "u1", "-k", "1")
            .stdout.splitlines()]
    assert hits[0]["id"] == keep_id
    assert json.loads(run_cli("sweep", "--path", p).stdout)["expired"] == 1
    report = json.loads(run_cli("verify", "--path", p).stdout)
    assert report["rows"] == 2 and report["orphan_vectors"] == 0
    assert "kv" in json.loads(run_cli("stats", "--path", p).stdout)
    assert json.loads(run_cli("forget", "--path", p, "--user", "u2").stdout) == {"deleted": 1}
    bad = run_cli("forget", "--path", p, check=False)
    assert bad.returncode == 2 and "error:" in bad.stderr


def test_warmup_with_a_local_model(tiny_model_dir, tmp_path):
    out = json.loads(run_cli("warmup", "--path", str(tmp_path / "w"), "--model", str(tiny_model_dir)).stdout)
    assert out["seconds"] > 0 and out["steps_s"]


def _portable(lines: list[str]) -> list[dict]:
    """Exported records without what a new store makes its own (ids, creation and event times, expiry instant)."""
    out = []
    for line in lines:
        rec = json.loads(line)
        for key in ("id", "created_at", "expires_at"):
            rec.pop(key)
        for v in rec["history"]:
            v.pop("at")
        out.append(rec)
    return out


def test_remember_export_import_round_trip(tmp_path):
    a, b, dump = str(tmp_path / "a"), str(tmp_path / "b"), tmp_path / "a.jsonl"
    told = json.loads(run_cli("remember", "I moved to Lyon last May.", "--path", a, "--user", "u1",
                              "--session", "s1", "--speaker", "Ann", "--tag", "profile").stdout)
    assert told["text"] == "I moved to Lyon last May." and "Ann" in told["memory_text"]
    with AgentMemory(a) as mem:
        mem.update(told["id"], text="I moved to Paris in June.", reason="moved again")
        mem.remember("Standup is at 9.", user_id="u1", kind="knowledge", metadata={"team": "core"}, ttl=3600,
                     timestamp="8 May 2023, 13:56")
        mem.remember("Not u1's", user_id="u2")
    assert json.loads(run_cli("export", "--path", a, "--user", "u1", "--out", str(dump)).stdout)["exported"] == 2
    lines = dump.read_text().splitlines()
    assert [v["op"] for v in json.loads(lines[0])["history"]] == ["add", "update"]
    done = json.loads(run_cli("import", str(dump), "--path", b).stdout)
    assert done == {"imported": 2, "updates": 1, "expired_skipped": 0, "events_not_replayed": 0}
    again = run_cli("export", "--path", b, "--user", "u1").stdout.splitlines()
    assert _portable(again) == _portable(lines)  # the same records, versions and reasons
    assert abs(datetime.fromisoformat(json.loads(again[1])["expires_at"])
               - datetime.fromisoformat(json.loads(lines[1])["expires_at"])).total_seconds() < 120


def test_import_is_validated_and_all_or_nothing(tmp_path):
    b, bad = str(tmp_path / "b"), tmp_path / "bad.jsonl"
    good = {"text": "I live in Lyon.", "user_id": "u1"}
    bad.write_text("\n".join([json.dumps(good), json.dumps({**good, "txet": "typo"})]) + "\n")
    proc = run_cli("import", str(bad), "--path", b, check=False)
    assert proc.returncode == 2 and "line 2" in proc.stderr and "txet" in proc.stderr
    # a failure after the first write (an update to an empty text) erases what the import had written
    broken = {"text": " ", "user_id": "u1", "history": [{"version": 1, "op": "add", "text": "v1"},
                                                       {"version": 2, "op": "update", "text": " "}]}
    bad.write_text("\n".join([json.dumps(good), json.dumps(broken)]) + "\n")
    proc = run_cli("import", str(bad), "--path", b, check=False)
    assert proc.returncode == 2 and "text" in proc.stderr
    with AgentMemory(b) as mem:
        assert mem.list(user_id="u1") == []
