"""The facade's KV bank: unusable stored KV is re-encoded ("hot update") *and* the reason reaches out.fallbacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmem import AgentMemory
from agentmem.kv.testing import tiny_causal_lm


@pytest.fixture(scope="module")
def tiny_pair():
    return tiny_causal_lm("llama", seed=0)


def _only_blob(store: Path) -> Path:
    blobs = list((store / "kv").rglob("*.kv"))
    assert len(blobs) == 1
    return blobs[0]


def test_corrupted_blob_is_re_encoded_and_the_reason_reported(tmp_path: Path, tiny_pair) -> None:
    store = tmp_path / "s"
    with AgentMemory(store, model=tiny_pair, kv_encoding="eager") as mem:
        rec = mem.remember("the spare key is under the blue flowerpot", user_id="u")
        blob = _only_blob(store)
        data = bytearray(blob.read_bytes())
        data[:8] = (1 << 40).to_bytes(8, "little")  # an impossible safetensors header length
        blob.write_bytes(bytes(data))

        out = mem.generate("where is the key?", user_id="u", k=1, max_new_tokens=1)
        assert out.mounted == [rec.id]
        assert len(out.fallbacks) == 1
        entry_id, reason = out.fallbacks[0]
        assert entry_id == rec.id and "BlobCorruptedError" in reason and "stored again" in reason
        assert "flowerpot" not in reason  # reasons never carry memory text
        stats = mem.stats()["kv"]
        assert stats["corrupted_blobs"] == 1 and stats["encoded_on_mount"] == 1

        again = mem.generate("where is the key?", user_id="u", k=1, max_new_tokens=1)
        assert again.mounted == [rec.id] and again.fallbacks == []  # the hot update stored a good blob


def test_foreign_model_blob_is_re_encoded_and_the_reason_reported(tmp_path: Path, tiny_pair) -> None:
    store = tmp_path / "s"
    with AgentMemory(store, model=tiny_pair, kv_encoding="eager") as mem:
        rec = mem.remember("the boat is called Saltire", user_id="u")
    with AgentMemory(store, model=tiny_causal_lm("llama", seed=1)) as mem:
        out = mem.generate("what is the boat called?", user_id="u", k=1, max_new_tokens=1)
        assert out.mounted == [rec.id]
        assert [i for i, _ in out.fallbacks] == [rec.id]
        assert "FingerprintMismatchError" in out.fallbacks[0][1] and "weights_digest" in out.fallbacks[0][1]
        assert mem.stats()["kv"]["fingerprint_mismatch"] == 1
        assert mem.generate("what is the boat called?", user_id="u", k=1, max_new_tokens=1).fallbacks == []


def test_session_turn_reports_why_a_stored_blob_was_re_encoded(tmp_path: Path, tiny_pair) -> None:
    store = tmp_path / "s"
    with AgentMemory(store, model=tiny_pair, kv_encoding="eager") as mem:
        rec = mem.remember("the spare key is under the blue flowerpot", user_id="u", session_id="old")
        blob = _only_blob(store)
        data = bytearray(blob.read_bytes())
        data[:8] = (1 << 40).to_bytes(8, "little")
        blob.write_bytes(bytes(data))

        turn = mem.session("chat", user_id="u").send("where is the key?", entry_ids=[rec.id], max_new_tokens=1)
        assert turn.mounted == [rec.id]
        assert [(i, "BlobCorruptedError" in r) for i, r in turn.fallbacks] == [(rec.id, True)]


@pytest.mark.parametrize("encrypted", [False, True])
def test_mounting_maps_plaintext_blobs_and_decrypts_encrypted_ones(tmp_path: Path, tiny_pair, encrypted) -> None:
    import mmap

    key = "correct horse battery staple 42" if encrypted else None
    with AgentMemory(tmp_path / "s", model=tiny_pair, kv_encoding="eager", encryption_key=key) as mem:
        rec = mem.remember("the ferry leaves at seven", user_id="u")
        store = mem._store
        (row,) = store.catalog.get([rec.id])
        view = store.map_blob(row)
        assert bytes(view) == store.read_blob(row)
        # Plaintext: the page cache is mapped, no copy per mount. Encrypted: decrypted bytes (a copy is unavoidable).
        mapped = isinstance(view, memoryview) and isinstance(view.obj, mmap.mmap)
        assert mapped == (not encrypted)
        del view
        out = mem.generate("when does the ferry leave?", user_id="u", k=1, max_new_tokens=1)
        assert out.mounted == [rec.id] and out.fallbacks == []
        assert mem.stats()["kv"]["blob_loads"] >= 1


def test_encode_pending_encodes_only_one_users_entries_without_kv(tmp_path: Path, tiny_pair) -> None:
    with AgentMemory(tmp_path / "s", model=tiny_pair, kv_encoding="off") as mem:
        facts = ["I bought a red kayak in May", "my sister is a cello teacher", "the bakery on Elm street closed"]
        mine = [mem.remember(f, user_id="u").id for f in facts]
        theirs = mem.remember("bob's note about the harbour", user_id="bob").id
        assert mem.encode_pending(user_id="u", progress=False) == 3
        rows = {r.id: r for r in mem._store.catalog.get([*mine, theirs])}
        assert all(rows[i].kv_path for i in mine) and not rows[theirs].kv_path
        assert mem.encode_pending(user_id="u", progress=False) == 0  # nothing left without KV


def test_the_first_mount_of_a_lossy_codec_is_what_every_later_mount_loads(tmp_path: Path, tiny_pair) -> None:
    """Encoding at mount time (no stored KV yet) mounts the stored, quantized blob, not the fresh float KV: the
    first answer and every later one see the same keys and values (a stream and a generate agree)."""
    import torch

    with AgentMemory(tmp_path / "s", model=tiny_pair, kv_codec="int8") as mem:
        rec = mem.remember("the spare key is under the blue flowerpot", user_id="u")  # model not loaded: no KV
        assert mem._store.catalog.get([rec.id])[0].kv_path is None

        def mount_once():
            row = mem._store.catalog.get([rec.id])[0]
            (memory,), _ = mem._bank.memories([row], [row.memory_text], strict=False)
            return memory.load_kv(), memory.load_fallback

        first, reason = mount_once()
        assert reason is not None and "stored again" in reason
        later, again = mount_once()
        assert again is None  # loaded from the blob the first mount stored
        assert torch.equal(first.keys, later.keys) and torch.equal(first.values, later.values)
