"""KV blobs: safetensors bytes, bit-exact round trips, strict checks on foreign or damaged blobs; format 2 codecs
in the header and an integrity checksum verified on load; format 1 blobs still readable."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from agentmem import AgentMemory
from agentmem.errors import BlobCorruptedError, FingerprintMismatchError
from agentmem.kv.codec import decode_entry, encode_entry, map_file, read_metadata
from agentmem.kv.engine import KVEngine
from agentmem.kv.quant import CODECS, QuantizedEntry, dequantize_kv
from agentmem.kv.testing import tiny_causal_lm
from agentmem.kv.types import MemoryItem

DATA = Path(__file__).parent / "data"
TEXT = "Melanie painted a sunrise over the lake last summer."


@pytest.fixture(scope="module")
def engine():
    return KVEngine(*tiny_causal_lm("llama"))


@pytest.fixture(scope="module")
def entry(engine):
    return engine.encode(TEXT)


@pytest.mark.parametrize("storage", [torch.float32, torch.float16, torch.bfloat16])
def test_store_then_load_is_bit_exact(engine, entry, storage):
    blob = encode_entry(entry, engine.fingerprint, storage_dtype=storage)
    back = decode_entry(blob, expected=engine.fingerprint)
    # Exactly what the storage dtype holds, returned in the model dtype.
    assert torch.equal(back.keys, entry.keys.to(storage).to(torch.float32))
    assert torch.equal(back.values, entry.values.to(storage).to(torch.float32))
    assert torch.equal(back.token_ids, entry.token_ids)
    assert back.offset == entry.offset and back.preamble_digest == entry.preamble_digest
    # Storing what was loaded gives the identical bytes: nothing drifts over repeated round trips.
    assert encode_entry(back, engine.fingerprint, storage_dtype=storage) == blob
    if storage == torch.float32:
        assert torch.equal(back.keys, entry.keys)


def test_blob_is_plain_safetensors_with_metadata(engine, entry):
    blob = engine.to_bytes(entry)
    tensors = safetensors.torch.load(blob)  # any safetensors reader can open it; no pickle involved
    assert set(tensors) == {"keys", "values", "token_ids"}
    assert torch.equal(tensors["keys"], entry.keys)
    meta = read_metadata(blob)
    assert meta["format"] == "agentmem.kv" and meta["offset"] == entry.offset
    assert meta["fingerprint"] == engine.fingerprint.to_dict()
    assert meta["fingerprint_digest"] == engine.fingerprint.digest


def test_decoding_for_another_model_raises_without_leaking_kv(engine, entry):
    other = KVEngine(*tiny_causal_lm("llama", seed=1))  # same shapes, different weights
    blob = engine.to_bytes(entry)
    with pytest.raises(FingerprintMismatchError) as err:
        other.from_bytes(blob)
    message = str(err.value)
    assert "weights_digest" in message
    # Neither numbers from the tensors nor the memory text appear in the error.
    assert "Melanie" not in message
    assert f"{entry.keys.flatten()[0].item():.4f}" not in message


def test_decoding_after_a_different_preamble_raises(engine, entry):
    blob = engine.to_bytes(entry)
    model, tok = engine.model, engine.tokenizer
    other = KVEngine(model, tok, system_prompt="Different system prompt:\n")
    with pytest.raises(FingerprintMismatchError, match="preamble"):
        other.from_bytes(blob)


@pytest.mark.parametrize("cut", [0, 4, 8, 20, -1, -100, -4000])
def test_truncated_blobs_raise_blob_corrupted(engine, entry, cut):
    blob = engine.to_bytes(entry)
    with pytest.raises(BlobCorruptedError):
        engine.from_bytes(blob[:cut])


def test_garbage_and_tampered_headers_raise_blob_corrupted(engine, entry):
    with pytest.raises(BlobCorruptedError):
        engine.from_bytes(b"\x00" * 64)
    with pytest.raises(BlobCorruptedError):
        engine.from_bytes(struct.pack("<Q", 5) + b"{nope")
    blob = engine.to_bytes(entry)
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    header["keys"]["shape"][2] += 1  # claims more tokens than the data holds
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with pytest.raises(BlobCorruptedError):
        engine.from_bytes(struct.pack("<Q", len(raw)) + raw + blob[8 + n :])


def test_zero_copy_decode_does_not_touch_the_blob(engine, entry):
    blob = engine.to_bytes(entry)
    snapshot = bytes(blob)
    back = engine.from_bytes(blob)
    engine.generate("What did Melanie paint?", [MemoryItem("m", TEXT, lambda: back)], max_new_tokens=3)
    assert blob == snapshot
    assert torch.equal(back.keys, entry.keys)


def test_mapped_blob_file_decodes_bit_exact_without_copying(engine, entry, tmp_path):
    path = tmp_path / "m.kv"
    path.write_bytes(engine.to_bytes(entry))
    view = map_file(path)
    back = engine.from_bytes(view)
    assert torch.equal(back.keys, entry.keys) and torch.equal(back.values, entry.values)
    assert torch.equal(back.token_ids, entry.token_ids)
    base = np.frombuffer(view, dtype=np.uint8).ctypes.data  # zero-copy: the tensors live inside the mapping
    assert base <= back.keys.data_ptr() < base + len(view) and base <= back.values.data_ptr() < base + len(view)
    out = engine.generate("What did Melanie paint?", [MemoryItem("m", TEXT, lambda: engine.from_bytes(map_file(path)))],
                          max_new_tokens=2)
    assert out.mounted == ["m"] and out.fallbacks == []


@pytest.mark.parametrize("size", [0, 5])
def test_mapped_empty_or_truncated_file_raises_blob_corrupted(engine, entry, tmp_path, size):
    path = tmp_path / "t.kv"
    path.write_bytes(engine.to_bytes(entry)[:size])
    with pytest.raises(BlobCorruptedError):
        engine.from_bytes(map_file(path))


# --- format 2: codecs and the integrity checksum ------------------------------------------------------------

def _locate(blob: bytes, name: str) -> tuple[int, int]:
    (n,) = struct.unpack("<Q", blob[:8])
    spec = json.loads(blob[8 : 8 + n])[name]
    begin, end = spec["data_offsets"]
    return 8 + n + begin, 8 + n + end


@pytest.mark.parametrize("name", sorted(CODECS))
def test_every_codec_round_trips_and_records_itself(engine, entry, name):
    blob = encode_entry(entry, engine.fingerprint, codec=name)
    meta = read_metadata(blob)
    assert meta["format_version"] == "2" and meta["codec"] == CODECS[name].to_dict()
    assert meta["checksum"]["algorithm"] == "xxh3_64"
    back = decode_entry(blob, expected=engine.fingerprint)
    assert isinstance(back, QuantizedEntry) == CODECS[name].quantized
    assert torch.equal(back.token_ids, entry.token_ids) and back.offset == entry.offset
    # Storing what was loaded, in the same codec, gives identical bytes (codes are reused, nothing drifts).
    assert encode_entry(back, engine.fingerprint, codec=name) == blob
    if CODECS[name].quantized:
        assert torch.equal(back.keys, dequantize_kv(back.packed)[0])
        assert len(blob) < len(encode_entry(entry, engine.fingerprint, codec="float16"))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_format_1_blobs_written_before_codecs_stay_readable(engine, dtype):
    # Written by the format-1 writer (main before format 2 landed; fingerprint version 2) for tiny_causal_lm("llama", seed=0): "Alice moved to Lyon."
    blob = (DATA / f"kv_v1_{dtype}.kv").read_bytes()
    assert read_metadata(blob)["format_version"] == "1" and "checksum" not in read_metadata(blob)
    back = decode_entry(blob, expected=engine.fingerprint, preamble_digest=engine.layout.preamble_digest)
    fresh = engine.encode("Alice moved to Lyon.")
    assert torch.equal(back.token_ids, fresh.token_ids)
    # Within the stored dtype's rounding of today's keys: a newer transformers may move a float32 key by an ulp
    # (1.2e-6 seen with 5.24), and a float16 key on a rounding boundary then lands on the neighbouring half.
    rtol = {"float32": 0.0, "float16": 2 ** -10}[dtype]
    torch.testing.assert_close(back.keys, fresh.keys.to(getattr(torch, dtype)).float(), rtol=rtol, atol=1e-5)
    out = engine.generate("Where did Alice move?", [MemoryItem("m", "Alice moved to Lyon.", lambda: back)],
                          mode="kv", max_new_tokens=2)
    assert out.mounted == ["m"] and out.fallbacks == []


@pytest.mark.parametrize("name", ["float32", "bfloat16", "int8", "int4", "int2", "k4v3h", "k4v3hs"])
@pytest.mark.parametrize("damage", ["nan", "huge", "zeros", "one_bit"])
def test_damaged_tensor_bytes_fail_the_checksum(engine, entry, name, damage):
    blob = bytearray(encode_entry(entry, engine.fingerprint, codec=name))
    begin, end = _locate(bytes(blob), "keys")
    if damage == "nan":
        blob[begin : begin + 4] = struct.pack("<f", float("nan")) if name == "float32" else b"\xff\x7f\xff\x7f"
    elif damage == "huge":
        lo, hi = _locate(bytes(blob), "key_scales" if CODECS[name].quantized else "values")
        blob[lo : lo + 4] = struct.pack("<f", 1e30) if name == "float32" else b"\x00\x7c\x00\x7c"  # fp16 inf
    elif damage == "zeros":
        blob[begin:end] = bytes(end - begin)
    else:
        blob[end - 1] ^= 0x01
    with pytest.raises(BlobCorruptedError, match="integrity check"):
        decode_entry(bytes(blob), expected=engine.fingerprint)


def test_edited_metadata_fails_the_checksum(engine, entry):
    blob = encode_entry(entry, engine.fingerprint, codec="int4")
    # Same length, another offset: the entry would be mounted at wrong positions if the header were not covered.
    text = f'\\"offset\\":{entry.offset}'.encode()  # as it appears, JSON inside the header's JSON
    forged = blob.replace(text, f'\\"offset\\":{entry.offset + 1}'.encode(), 1)
    assert len(forged) == len(blob)
    assert forged != blob
    with pytest.raises(BlobCorruptedError):
        decode_entry(forged, expected=engine.fingerprint)


@pytest.mark.parametrize("codec", [{"name": "int4", "key_bits": 5, "value_bits": 4, "key_group": 32,
                                    "value_group": 64}, {"name": "int9"}, "int4"])
def test_unreadable_codecs_are_refused(engine, entry, codec):
    blob = encode_entry(entry, engine.fingerprint, codec="int4")
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    meta = json.loads(header["__metadata__"]["agentmem.kv"])
    meta["codec"] = codec
    header["__metadata__"]["agentmem.kv"] = json.dumps(meta)
    raw = json.dumps(header).encode()
    with pytest.raises(BlobCorruptedError):
        decode_entry(struct.pack("<Q", len(raw)) + raw + blob[8 + n :], expected=engine.fingerprint)


def test_a_tampered_plaintext_blob_is_never_mounted(tmp_path: Path):
    """Issue #13 item 7: NaN written into a stored key was mounted silently; now it is re-encoded and reported."""
    store = tmp_path / "s"
    with AgentMemory(store, model=tiny_causal_lm("llama"), kv_encoding="eager", kv_codec="float32") as mem:
        rec = mem.remember("the spare key is under the blue flowerpot", user_id="u")
        (blob_path,) = list((store / "kv").rglob("*.kv"))
        data = bytearray(blob_path.read_bytes())
        begin, end = _locate(bytes(data), "keys")
        data[begin:end] = struct.pack("<f", float("nan")) * ((end - begin) // 4)
        blob_path.write_bytes(bytes(data))
        out = mem.generate("where is the key?", user_id="u", k=1, max_new_tokens=1)
        assert out.mounted == [rec.id]
        assert [i for i, _ in out.fallbacks] == [rec.id] and "integrity check" in out.fallbacks[0][1]
        assert mem.stats()["kv"]["corrupted_blobs"] == 1
        again = mem.generate("where is the key?", user_id="u", k=1, max_new_tokens=1)
        assert again.fallbacks == []  # the re-encoded blob was stored in its place
    with AgentMemory(store, model=tiny_causal_lm("llama"), strict_fingerprint=True) as mem:
        (blob_path,) = list((store / "kv").rglob("*.kv"))
        data = bytearray(blob_path.read_bytes())
        data[-1] ^= 0xFF  # token ids are covered too
        blob_path.write_bytes(bytes(data))
        with pytest.raises(BlobCorruptedError):
            mem.generate("where is the key?", user_id="u", k=1, max_new_tokens=1)


def test_the_store_writes_its_codec_and_mounts_it(tmp_path: Path):
    store = tmp_path / "s"
    with AgentMemory(store, model=tiny_causal_lm("llama"), kv_encoding="eager", kv_codec="int4") as mem:
        rec = mem.remember("the boat is called Saltire", user_id="u")
        (blob_path,) = list((store / "kv").rglob("*.kv"))
        assert read_metadata(blob_path.read_bytes())["codec"]["name"] == "int4"
        assert mem.get(rec.id).kv.dtype == "int4"
        out = mem.generate("what is the boat called?", user_id="u", k=1, max_new_tokens=2)
        assert out.mounted == [rec.id] and out.fallbacks == []
    # Another codec later: the old int4 blob is still mounted as is, new writes use the new codec.
    with AgentMemory(store, model=tiny_causal_lm("llama"), kv_encoding="eager", kv_codec="float16") as mem:
        assert mem.generate("what is the boat called?", user_id="u", k=1, max_new_tokens=2).fallbacks == []
        mem.remember("the car is red", user_id="u")
        codecs = sorted(read_metadata(p.read_bytes())["codec"]["name"] for p in (store / "kv").rglob("*.kv"))
        assert codecs == ["float16", "int4"]


def test_kv_dtype_is_an_alias_of_kv_codec():
    from agentmem.config import MemoryConfig

    assert MemoryConfig(kv_dtype="float16").kv_codec == "float16"
    assert MemoryConfig(kv_dtype="float16", kv_codec="int8").kv_codec == "int8"
    assert MemoryConfig().kv_codec in CODECS
    with pytest.raises(ValueError):
        MemoryConfig(kv_codec="int3")


def test_trained_entries_keep_full_precision_under_an_integer_codec(tmp_path: Path):
    store = tmp_path / "s"
    doc = "Ann: I moved to Oslo in May 2021 and I teach chemistry at the old school by the harbour. " * 3
    # mount_min_score 0: both entries are mounted whatever their relevance; this test is about their codecs
    with AgentMemory(store, model=tiny_causal_lm("llama"), kv_encoding="eager", kv_codec="int4",
                     mount_min_score=0.0) as mem:
        trained = mem.train(doc, user_id="u", tokens=8, steps=1, seed=0, progress=False, samples=2, batch_size=2,
                            question_tokens=4, answer_tokens=4)
        plain = mem.remember("Ann likes sailing on weekends.", user_id="u")
        assert mem.get(trained.id).kv.dtype == "float32" and mem.get(plain.id).kv.dtype == "int4"
        codecs = sorted(read_metadata(p.read_bytes())["codec"]["name"] for p in (store / "kv").rglob("*.kv"))
        assert codecs == ["float32", "int4"]
        out = mem.generate("Where does Ann teach?", user_id="u", k=2, max_new_tokens=2)
        assert set(out.mounted) == {trained.id, plain.id} and out.fallbacks == []


def test_every_registered_codec_can_be_configured():
    import typing

    from agentmem.config import KvCodec

    assert set(typing.get_args(KvCodec)) == set(CODECS)


@pytest.mark.parametrize("name", ["int8", "k4v3hs"])
def test_integer_blobs_written_before_session_4_stay_readable_and_re_encode_bit_exact(engine, name):
    # Written by main at 00335b5 (before clip grids and per-layer widths) for tiny_causal_lm("llama", seed=0):
    # "Alice moved to Lyon." The header of a codec without the new fields is unchanged, and so are its codes.
    blob = (DATA / f"kv_v2_{name}.kv").read_bytes()
    back = decode_entry(blob, expected=engine.fingerprint, preamble_digest=engine.layout.preamble_digest)
    assert isinstance(back, QuantizedEntry) and back.packed.codec == CODECS[name]
    fresh = engine.encode("Alice moved to Lyon.")
    assert encode_entry(fresh, engine.fingerprint, codec=name) == blob
    out = engine.generate("Where did Alice move?", [MemoryItem("m", "Alice moved to Lyon.", lambda: back)],
                          mode="kv", max_new_tokens=2)
    assert out.mounted == ["m"] and out.fallbacks == []
