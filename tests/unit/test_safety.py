"""Security and data safety through the public API: secrets, encryption at rest, verified erasure, crashes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentmem import AgentMemError, AgentMemory, EncryptionError, SecretDetectedError
from agentmem.kv.testing import tiny_causal_lm
from agentmem.security import Cipher, scan_tree_for_markers

ROOT = Path(__file__).resolve().parents[2]
OPENAI_KEY = "sk-proj-" + "Zq3" * 16


@pytest.fixture(scope="module")
def tiny_pair():
    return tiny_causal_lm("llama", seed=0)


def test_secrets_are_redacted_before_anything_is_stored(tmp_path: Path, tiny_pair) -> None:
    store = tmp_path / "s"
    with AgentMemory(store, model=tiny_pair, kv_encoding="eager") as mem:
        rec = mem.remember(f"my key is {OPENAI_KEY} ok", user_id="u", metadata={"token": "ghp_" + "x1Y2" * 9})
        assert "[REDACTED:" in rec.text and OPENAI_KEY not in rec.text
        assert rec.kv is not None  # the KV was encoded from the redacted text
        assert "x1Y2" not in str(rec.metadata)
        mem.remember_messages([{"role": "tool", "content": f"env: OPENAI_API_KEY={OPENAI_KEY}", "name": "env"}],
                              user_id="u")
    assert scan_tree_for_markers(store, [OPENAI_KEY.encode(), b"x1Y2x1Y2"]) == {}


def test_reject_policy_stores_nothing(mem_path: Path) -> None:
    with AgentMemory(mem_path, secret_policy="reject") as mem:
        with pytest.raises(SecretDetectedError) as info:
            mem.remember_messages([{"role": "user", "content": "fine"},
                                   {"role": "user", "content": f"key {OPENAI_KEY}"}], user_id="u")
        assert OPENAI_KEY not in str(info.value)
        assert mem.list(user_id="u") == []


def test_encryption_at_rest(tmp_path: Path, tiny_pair) -> None:
    store, key = tmp_path / "enc", Cipher.format_key(Cipher.generate_key())
    marker = f"lighthouse{uuid.uuid4().hex[:10]}"
    # mount_min_score 0 (both opens): "where?" must mount the blobs, whose decryption and tampering are checked
    with AgentMemory(store, encryption_key=key, model=tiny_pair, kv_encoding="eager", mount_min_score=0.0) as mem:
        rec = mem.remember(f"the secret place is the {marker} near Brest", user_id="u")
        mem.remember("unrelated note about baking bread", user_id="u")
        assert mem.recall(f"where is the {marker}?", user_id="u", k=1)[0].id == rec.id  # blind lexical + dense
        assert marker in mem.get(rec.id).text
        out = mem.generate("where?", user_id="u", k=1, max_new_tokens=2)
        assert out.mounted and out.fallbacks == []  # the blob decrypts
    assert scan_tree_for_markers(store, [marker.encode(), b"near Brest"]) == {}
    with pytest.raises(EncryptionError, match="encrypted"):
        AgentMemory(store)
    with pytest.raises(EncryptionError, match="wrong encryption key"):
        AgentMemory(store, encryption_key=Cipher.format_key(Cipher.generate_key()))
    # tampering with a blob: authentication fails, the entry is re-encoded from text, with a reason
    blob = next((store / "kv").rglob("*.kv"))
    data = bytearray(blob.read_bytes())
    data[-5] ^= 0xFF
    blob.write_bytes(bytes(data))
    with AgentMemory(store, encryption_key=key, model=tiny_pair, mount_min_score=0.0) as mem:
        mem.generate("where is it?", user_id="u", k=2, max_new_tokens=1)
        assert mem.stats()["kv"]["corrupted_blobs"] == 1


def test_verified_erasure_of_a_user(tmp_path: Path, tiny_pair) -> None:
    store = tmp_path / "erase"
    markers = [f"zq{uuid.uuid4().hex[:12]}mk" for _ in range(110)]
    with AgentMemory(store, model=tiny_pair, kv_encoding="eager") as mem:
        mem.remember_many([dict(text=f"code word {m}", user_id="victim", session_id=f"s{i % 3}", tags=["t"])
                           for i, m in enumerate(markers)])
        other = mem.remember("bystander keeps this", user_id="bystander")
        assert mem.forget(user_id="victim") == 110
        assert [r.id for r in mem.list(user_id="bystander")] == [other.id]
        assert mem.verify()["orphan_blobs"] == 0
        audit = (store / "audit.jsonl").read_text()
        assert '"forget_user"' in audit and "code word" not in audit
    assert scan_tree_for_markers(store, [m.encode() for m in markers]) == {}


def _reported(report: Path) -> list[str]:
    return [x for x in report.read_text().split("\n")[:-1] if x] if report.exists() else []


@pytest.mark.parametrize("delay", [0.05, 0.4])
def test_sigkill_mid_remember_loses_nothing_reported(tmp_path: Path, tiny_pair, delay: float) -> None:
    store, report = tmp_path / "store", tmp_path / "reported.txt"
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "_writer.py"), str(store), str(report),
                             "--tiny-model", "--count", "100000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while len(_reported(report)) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reported = _reported(report)
    assert reported, "the writer never stored anything"
    with AgentMemory(store, model=tiny_pair) as mem:
        check = mem.verify()
        assert check["orphan_vectors"] == check["orphan_blobs"] == 0
        assert check["rows_missing_vector"] == check["rows_missing_blob"] == 0
        for entry_id in reported:
            assert mem.get(entry_id).kv is not None


_text = st.text(min_size=0, max_size=40)
_meta = st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=8), st.booleans()),
                        max_size=3)
_filters = st.one_of(st.none(), st.dictionaries(
    st.sampled_from(["a", "b", "$or", "$and", "$bad"]),
    st.one_of(st.integers(), st.dictionaries(st.sampled_from(["$eq", "$gt", "$in", "$zz", "$contains"]),
                                             st.one_of(st.integers(), st.lists(st.integers(), max_size=2))),
              st.lists(st.dictionaries(st.sampled_from(["a"]), st.integers()), max_size=2)),
    max_size=2))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_text, meta=_meta, query=_text, filters=_filters, k=st.integers(-1, 4))
def test_property_only_typed_errors_and_store_stays_consistent(mem: AgentMemory, text, meta, query, filters, k) -> None:
    try:
        mem.remember(text, user_id="p", metadata=meta, tags=["x"])
    except AgentMemError:
        pass
    try:
        for hit in mem.recall(query, user_id="p", k=k, filters=filters):
            assert hit.user_id == "p"
    except AgentMemError:
        pass
    check = mem.verify()
    assert check["orphan_vectors"] == check["rows_missing_vector"] == 0
