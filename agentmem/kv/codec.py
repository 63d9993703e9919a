"""An entry's KV ⇄ bytes, in the safetensors format (never pickle).

Layout: tensors ``keys`` and ``values`` ``[layers, kv_heads, tokens, head_dim]`` in the storage dtype and
``token_ids`` (int64 ``[tokens]``); one metadata key ``agentmem.kv`` holds canonical JSON with the format
name/version, the model fingerprint (and its digest), the preamble digest, the encoding offset and the storage
dtype. Blobs are written with
``safetensors.torch.save`` and are readable by any safetensors reader.

Decoding validates the header strictly and then maps tensors **onto the blob bytes without copying** when the
storage dtype is the model dtype (fp32 storage for an fp32 model): at 2,048 mounted tokens SmolLM2's KV is 94 MB,
and a copy per load would cost more than the prefill it saves. Other storage dtypes are cast once on load.
Encryption and authentication, when enabled, wrap these bytes outside this module.

Example:
    >>> blob = encode_entry(entry, fingerprint, storage_dtype=torch.float16)
    >>> again = decode_entry(blob, expected=fingerprint, dtype=torch.float32)
"""

from __future__ import annotations

import json
import os
import struct
import warnings
from typing import Any

import torch
from safetensors.torch import save as _st_save

from agentmem._fs import map_readonly
from agentmem.errors import BlobCorruptedError, FingerprintMismatchError
from agentmem.kv.fingerprint import ModelFingerprint
from agentmem.kv.types import EncodedEntry

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "KEEP_STORAGE_DTYPE",
    "STORAGE_DTYPES",
    "decode_entry",
    "encode_entry",
    "map_file",
    "read_metadata",
]

FORMAT_NAME = "agentmem.kv"
FORMAT_VERSION = "1"
STORAGE_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64}
KEEP_STORAGE_DTYPE = "storage"  # decode_entry(dtype=...) sentinel: return KV in the dtype they were stored in
_META_KEY = "agentmem.kv"
_MAX_HEADER = 1 << 20  # our headers are ~1 KB; refuse absurd lengths before allocating


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def encode_entry(
    entry: EncodedEntry, fingerprint: ModelFingerprint, *, storage_dtype: torch.dtype = torch.float32
) -> bytes:
    """Serialise ``entry`` to safetensors bytes, casting KV to ``storage_dtype`` (fp32, fp16 or bf16)."""
    if _dtype_name(storage_dtype) not in STORAGE_DTYPES:
        raise ValueError(f"storage dtype must be one of {sorted(STORAGE_DTYPES)}, got {storage_dtype}")
    if entry.fingerprint != fingerprint.digest:
        raise FingerprintMismatchError("entry was encoded by a different model than the fingerprint given to store it")
    tensors = {
        "keys": entry.keys.detach().to(device="cpu", dtype=storage_dtype).contiguous(),
        "values": entry.values.detach().to(device="cpu", dtype=storage_dtype).contiguous(),
        "token_ids": entry.token_ids.detach().to(device="cpu", dtype=torch.int64).contiguous(),
    }
    info = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "fingerprint": fingerprint.to_dict(),
        "fingerprint_digest": fingerprint.digest,
        "preamble_digest": entry.preamble_digest,
        "offset": int(entry.offset),
        "storage_dtype": _dtype_name(storage_dtype),
    }
    # One metadata key holding canonical JSON: safetensors writes its metadata map in hash order, so several keys
    # would make the bytes of identical entries differ from save to save.
    metadata = {_META_KEY: json.dumps(info, sort_keys=True, separators=(",", ":"))}
    return _st_save(tensors, metadata=metadata)


def _parse_header(blob: memoryview) -> tuple[dict[str, Any], dict[str, Any], int]:
    """Return (tensor specs, metadata, data start), raising BlobCorruptedError on anything malformed."""
    if len(blob) < 8:
        raise BlobCorruptedError("KV blob is truncated (no safetensors header)")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len > _MAX_HEADER or 8 + header_len > len(blob):
        raise BlobCorruptedError("KV blob is truncated or has an invalid header length")
    try:
        header = json.loads(bytes(blob[8 : 8 + header_len]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BlobCorruptedError("KV blob header is not valid JSON") from exc
    if not isinstance(header, dict):
        raise BlobCorruptedError("KV blob header is not a JSON object")
    raw = header.pop("__metadata__", None) or {}
    try:
        metadata = json.loads(raw[_META_KEY]) if isinstance(raw, dict) and _META_KEY in raw else {}
    except (TypeError, json.JSONDecodeError) as exc:
        raise BlobCorruptedError("KV blob metadata is malformed") from exc
    if not isinstance(metadata, dict):
        raise BlobCorruptedError("KV blob metadata is malformed")
    return header, metadata, 8 + header_len


def read_metadata(blob: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The blob's metadata (format, fingerprint dict, offset, ...) without touching the tensors."""
    return _parse_header(memoryview(blob))[1]


def _tensor(view: memoryview, specs: dict[str, Any], name: str, data_start: int) -> torch.Tensor:
    spec = specs.get(name)
    if not isinstance(spec, dict):
        raise BlobCorruptedError(f"KV blob has no {name!r} tensor")
    try:
        dtype = _ST_DTYPES[spec["dtype"]]
        shape = [int(s) for s in spec["shape"]]
        begin, end = (int(o) for o in spec["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BlobCorruptedError(f"KV blob tensor {name!r} has a malformed header entry") from exc
    count = 1
    for s in shape:
        if s < 0:
            raise BlobCorruptedError(f"KV blob tensor {name!r} has a negative dimension")
        count *= s
    itemsize = dtype.itemsize
    if begin < 0 or end - begin != count * itemsize or data_start + end > len(view):
        raise BlobCorruptedError(f"KV blob is truncated or inconsistent at tensor {name!r}")
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(view, dtype=dtype, count=count, offset=data_start + begin).view(shape)


def map_file(path: str | os.PathLike[str]) -> memoryview:
    """A read-only view of a blob file, memory-mapped: decoding it with :func:`decode_entry` copies nothing.

    The kernel maps the file's page-cache pages instead of copying them into a buffer; mounting then reads the KV
    straight from there. Measured on the shared dev VM for the 94 MB of a 2,048-token SmolLM2 mount: file read
    into a reused buffer + placement 57-109 ms, mapped + placement 21-49 ms. The mapping is released when the last
    tensor decoded from it is dropped (the engine drops the entries once it has placed them). Only for files nobody
    truncates while they are mapped (see :func:`agentmem._fs.map_readonly`).
    """
    return map_readonly(path)


def decode_entry(
    blob: bytes | bytearray | memoryview,
    *,
    expected: ModelFingerprint,
    dtype: torch.dtype | str | None = None,
    preamble_digest: str | None = None,
) -> EncodedEntry:
    """Parse a blob made by :func:`encode_entry` for the model ``expected`` describes.

    Raises :class:`FingerprintMismatchError` if it was made by another model/dtype/tokenizer (or after another
    preamble, when ``preamble_digest`` is given) and :class:`BlobCorruptedError` if it is unreadable or truncated.
    KV come back in ``dtype`` (default: the fingerprint's model dtype; ``KEEP_STORAGE_DTYPE``: as stored);
    zero-copy when no cast is needed.
    Error messages name fields only, never tensor contents.
    """
    view = memoryview(blob).cast("B") if not isinstance(blob, memoryview) else blob.cast("B")
    specs, meta, data_start = _parse_header(view)
    if meta.get("format") != FORMAT_NAME:
        raise BlobCorruptedError("not an agentmem KV blob (format tag missing)")
    if meta.get("format_version") != FORMAT_VERSION:
        raise BlobCorruptedError(f"unsupported KV blob format version {meta.get('format_version')!r}")
    if meta.get("fingerprint_digest") != expected.digest:
        try:
            fields = ModelFingerprint.from_dict(meta.get("fingerprint")).differences(expected)
            detail = f"differs in {', '.join(fields)}" if fields else "differs"
        except (ValueError, TypeError):
            fields, detail = None, "is unreadable"
        if fields != ["dtype"]:  # same weights in another precision only: the KV are cast below (convertible_to)
            raise FingerprintMismatchError(
                f"KV blob was encoded by a different model: its fingerprint {detail}; re-encode it with the loaded "
                "model"
            )
    if preamble_digest is not None and meta.get("preamble_digest") != preamble_digest:
        raise FingerprintMismatchError("KV blob was encoded after a different prompt preamble; re-encode it")
    try:
        offset = int(meta["offset"])
        stored = STORAGE_DTYPES[meta["storage_dtype"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise BlobCorruptedError("KV blob metadata lacks offset or storage dtype") from exc

    with warnings.catch_warnings():  # once per blob, not per tensor: entering it costs ~5 us
        # frombuffer warns that bytes are read-only; we never write through these tensors (mounting copies).
        warnings.simplefilter("ignore", UserWarning)
        keys = _tensor(view, specs, "keys", data_start)
        values = _tensor(view, specs, "values", data_start)
        token_ids = _tensor(view, specs, "token_ids", data_start)
    want = (expected.num_layers, expected.num_kv_heads, token_ids.numel(), expected.head_dim)
    if keys.dtype != stored or values.dtype != stored or token_ids.dim() != 1:
        raise BlobCorruptedError("KV blob tensors have unexpected dtypes or ranks")
    if tuple(keys.shape) != want or tuple(values.shape) != want:
        raise BlobCorruptedError(f"KV blob tensors have shape {tuple(keys.shape)}, expected {want}")
    if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= expected.vocab_size):
        raise BlobCorruptedError("KV blob holds token ids outside the vocabulary")
    if dtype == KEEP_STORAGE_DTYPE:
        target = stored
    else:
        target = dtype if dtype is not None else STORAGE_DTYPES.get(expected.dtype, torch.float32)
    if keys.dtype != target:  # a cast allocates new memory anyway, so the result no longer aliases the blob
        keys, values = keys.to(target), values.to(target)
    return EncodedEntry(
        token_ids=token_ids,
        keys=keys,
        values=values,
        offset=offset,
        fingerprint=expected.digest,
        preamble_digest=str(meta.get("preamble_digest", "")),
    )
