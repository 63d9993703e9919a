"""KV blobs: safetensors bytes, bit-exact round trips, strict checks on foreign or damaged blobs."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import safetensors.torch
import torch

from agentmem.errors import BlobCorruptedError, FingerprintMismatchError
from agentmem.kv.codec import decode_entry, encode_entry, map_file, read_metadata
from agentmem.kv.engine import KVEngine
from agentmem.kv.testing import tiny_causal_lm

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
    engine.generate("What did Melanie paint?", [_Item("m", TEXT, lambda: back)], max_new_tokens=3)
    assert blob == snapshot
    assert torch.equal(back.keys, entry.keys)


class _Item:
    def __init__(self, id, text, load_kv):
        self.id, self.text, self.load_kv = id, text, load_kv


def test_mapped_blob_file_decodes_bit_exact_without_copying(engine, entry, tmp_path):
    path = tmp_path / "m.kv"
    path.write_bytes(engine.to_bytes(entry))
    view = map_file(path)
    back = engine.from_bytes(view)
    assert torch.equal(back.keys, entry.keys) and torch.equal(back.values, entry.values)
    assert torch.equal(back.token_ids, entry.token_ids)
    base = np.frombuffer(view, dtype=np.uint8).ctypes.data  # zero-copy: the tensors live inside the mapping
    assert base <= back.keys.data_ptr() < base + len(view) and base <= back.values.data_ptr() < base + len(view)
    out = engine.generate("What did Melanie paint?", [_Item("m", TEXT, lambda: engine.from_bytes(map_file(path)))],
                          max_new_tokens=2)
    assert out.mounted == ["m"] and out.fallbacks == []


@pytest.mark.parametrize("size", [0, 5])
def test_mapped_empty_or_truncated_file_raises_blob_corrupted(engine, entry, tmp_path, size):
    path = tmp_path / "t.kv"
    path.write_bytes(engine.to_bytes(entry)[:size])
    with pytest.raises(BlobCorruptedError):
        engine.from_bytes(map_file(path))
