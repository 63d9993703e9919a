"""An entry's KV ⇄ bytes, in the safetensors format (never pickle).

Layout (format version 2): ``token_ids`` (int64 ``[tokens]``) and, for a float codec (``float32``, ``float16``,
``bfloat16``), tensors ``keys`` and ``values`` ``[layers, kv_heads, tokens, head_dim]`` in that dtype; for an
integer codec (``int8``, ``int4``, ``k4v2``, ``int2``; :mod:`agentmem.kv.quant`) packed uint8 ``keys``/``values``
plus float16 ``key_scales``/``key_zeros``/``value_scales``/``value_zeros``. One metadata key ``agentmem.kv`` holds
canonical JSON with the format name/version, the model fingerprint (and its digest), the preamble digest, the
encoding offset, the codec (name and parameters) and an integrity checksum: xxh3-64 over that JSON (without the
checksum) and every tensor's bytes in name order. xxh3 runs at ~9 GB/s on the dev VM (faster than a copy: 94 MB
in 11 ms vs 74 ms; crc32 3 GB/s, blake2b 0.5 GB/s), so verifying it on every load costs less than placing the KV.
Format version 1 (float codecs, no checksum) stays readable. Blobs are written with ``safetensors.torch.save``
and are readable by any safetensors reader.

Decoding validates the header strictly, verifies the checksum, and then maps tensors **onto the blob bytes without
copying** when the storage dtype is the model dtype (fp32 storage for an fp32 model): at 2,048 mounted tokens
SmolLM2's KV is 94 MB, and a copy per load would cost more than the prefill it saves. Other float codecs are cast
once on load (or while mounting); integer codecs come back as a :class:`~agentmem.kv.quant.QuantizedEntry` whose
codes the mount dequantizes while placing them. Encryption and authentication, when enabled, wrap these bytes
outside this module (the checksum is for damage and tampering of plaintext blobs, not a MAC).

Example:
    >>> from agentmem.kv.engine import KVEngine
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> engine = KVEngine(*tiny_causal_lm("llama"))
    >>> entry = engine.encode("Alice moved to Lisbon in 2021.")
    >>> blob = encode_entry(entry, engine.fingerprint, codec="int4")
    >>> again = decode_entry(blob, expected=engine.fingerprint, dtype=torch.float32)
    >>> again.kv_shape == entry.kv_shape, bool((again.values - entry.values).abs().mean() < 0.1)
    (True, True)
"""

from __future__ import annotations

import json
import math
import os
import struct
import warnings
from typing import Any

import torch
import xxhash
from safetensors.torch import save as _st_save

from agentmem._fs import map_readonly
from agentmem.errors import BlobCorruptedError, FingerprintMismatchError
from agentmem.kv.fingerprint import ModelFingerprint
from agentmem.kv.quant import (
    CODECS, FLOAT_CODECS, Codec, PackedKV, QuantizedEntry, codec_for, hadamard_matrix, packed_width, quantize_kv,
)
from agentmem.kv.types import EncodedEntry

__all__ = [
    "CODECS",
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
FORMAT_VERSION = "2"
_READABLE_VERSIONS = ("1", "2")  # 1: float codecs named by "storage_dtype", no checksum
STORAGE_DTYPES: dict[str, torch.dtype] = dict(FLOAT_CODECS)
_ST_DTYPES = {
    "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64, "U8": torch.uint8,
}
KEEP_STORAGE_DTYPE = "storage"  # decode_entry(dtype=...) sentinel: return KV in the dtype they were stored in
_META_KEY = "agentmem.kv"
_MAX_HEADER = 1 << 20  # our headers are ~1 KB; refuse absurd lengths before allocating
_CHECKSUM = "xxh3_64"
_QUANT_TENSORS = ("keys", "key_scales", "key_zeros", "values", "value_scales", "value_zeros")


def _quant_tensors(codec: Codec, num_layers: int) -> tuple[str, ...]:
    """The tensors a blob of integer ``codec`` holds for a ``num_layers`` model (symmetric values: no zero points,
    they are implied; each ``layer_bits`` layer the model has: its own codes)."""
    shared = tuple(n for n in _QUANT_TENSORS if not (n == "value_zeros" and codec.value_symmetric))
    return shared + tuple(f"{kind}@{layer}" for layer, _, _ in codec.layer_bits if layer < num_layers
                          for kind in ("keys", "values"))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _canonical(info: dict[str, Any]) -> str:
    return json.dumps(info, sort_keys=True, separators=(",", ":"))


def _checksum(info: dict[str, Any], chunks) -> str:
    """xxh3-64 over the canonical metadata (without its checksum) and each tensor's bytes, in name order."""
    h = xxhash.xxh3_64(_canonical({k: v for k, v in info.items() if k != "checksum"}).encode())
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def _payload(entry: EncodedEntry, codec: Codec) -> dict[str, torch.Tensor]:
    if not codec.quantized:
        dtype = codec.float_dtype
        return {
            "keys": entry.keys.detach().to(device="cpu", dtype=dtype).contiguous(),
            "values": entry.values.detach().to(device="cpu", dtype=dtype).contiguous(),
        }
    packed = entry.packed if isinstance(entry, QuantizedEntry) and entry.packed.codec == codec else None
    if packed is None:  # (re-storing a decoded entry in its own codec reuses its codes: no drift)
        packed = quantize_kv(entry.keys, entry.values, codec)
    return packed.stored()  # scales are float32 while mounted; stored as the fp16 they were rounded to


def encode_entry(
    entry: EncodedEntry,
    fingerprint: ModelFingerprint,
    *,
    storage_dtype: torch.dtype = torch.float32,
    codec: str | Codec | None = None,
) -> bytes:
    """Serialise ``entry`` to safetensors bytes in ``codec`` (default: the float codec of ``storage_dtype``).

    Example:
        >>> from agentmem.kv.engine import KVEngine
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> engine = KVEngine(*tiny_causal_lm("llama"))
        >>> entry = engine.encode("Alice moved to Lisbon in 2021.")
        >>> blob = encode_entry(entry, engine.fingerprint, codec="int4")
        >>> read_metadata(blob)["codec"]["name"]
        'int4'
    """
    if codec is None:
        if _dtype_name(storage_dtype) not in STORAGE_DTYPES:
            raise ValueError(f"storage dtype must be one of {sorted(STORAGE_DTYPES)}, got {storage_dtype}")
        codec = _dtype_name(storage_dtype)
    spec = codec if isinstance(codec, Codec) else codec_for(codec)
    if entry.fingerprint != fingerprint.digest:
        raise FingerprintMismatchError("entry was encoded by a different model than the fingerprint given to store it")
    tensors = _payload(entry, spec)
    tensors["token_ids"] = entry.token_ids.detach().to(device="cpu", dtype=torch.int64).contiguous()
    info: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "fingerprint": fingerprint.to_dict(),
        "fingerprint_digest": fingerprint.digest,
        "preamble_digest": entry.preamble_digest,
        "offset": int(entry.offset),
        "codec": spec.to_dict(),
    }
    if not spec.quantized:
        info["storage_dtype"] = spec.name
    info["checksum"] = {
        "algorithm": _CHECKSUM,
        "digest": _checksum(info, (_tensor_bytes(tensors[name]) for name in sorted(tensors))),
    }
    # One metadata key holding canonical JSON: safetensors writes its metadata map in hash order, so several keys
    # would make the bytes of identical entries differ from save to save.
    return _st_save(tensors, metadata={_META_KEY: _canonical(info)})


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


def _locate(view: memoryview, specs: dict[str, Any], name: str, data_start: int):
    """(dtype, shape, begin, end) of tensor ``name``, absolute byte offsets, checked against the blob's size."""
    spec = specs.get(name)
    if not isinstance(spec, dict):
        raise BlobCorruptedError(f"KV blob has no {name!r} tensor")
    try:
        dtype = _ST_DTYPES[spec["dtype"]]
        shape = [int(s) for s in spec["shape"]]
        begin, end = (int(o) for o in spec["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BlobCorruptedError(f"KV blob tensor {name!r} has a malformed header entry") from exc
    if any(s < 0 for s in shape):
        raise BlobCorruptedError(f"KV blob tensor {name!r} has a negative dimension")
    if begin < 0 or end - begin != math.prod(shape) * dtype.itemsize or data_start + end > len(view):
        raise BlobCorruptedError(f"KV blob is truncated or inconsistent at tensor {name!r}")
    return dtype, shape, data_start + begin, data_start + end


def _tensor(view: memoryview, located) -> torch.Tensor:
    dtype, shape, begin, end = located
    if end == begin:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(view, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=begin).view(shape)


def map_file(path: str | os.PathLike[str]) -> memoryview:
    """A read-only view of a blob file, memory-mapped: decoding it with :func:`decode_entry` copies nothing.

    The kernel maps the file's page-cache pages instead of copying them into a buffer; mounting then reads the KV
    straight from there. Measured on the shared dev VM for the 94 MB of a 2,048-token SmolLM2 mount: file read
    into a reused buffer + placement 57-109 ms, mapped + placement 21-49 ms. The mapping is released when the last
    tensor decoded from it is dropped (the engine drops the entries once it has placed them). Only for files nobody
    truncates while they are mapped (see :func:`agentmem._fs.map_readonly`).
    """
    return map_readonly(path)


def _blob_codec(meta: dict[str, Any]) -> Codec:
    """The codec a header names (version 1: its ``storage_dtype``)."""
    try:
        if meta.get("format_version") == "1":
            return CODECS[meta["storage_dtype"]]
        return Codec.from_dict(meta.get("codec"))
    except (KeyError, TypeError, ValueError) as exc:
        raise BlobCorruptedError(f"KV blob names no readable codec ({exc})") from exc


def _verify(view: memoryview, meta: dict[str, Any], located: dict[str, tuple]) -> None:
    """Check the version-2 checksum; the tensors must be exactly the ones the codec names (none unhashed)."""
    checksum = meta.get("checksum")
    if not isinstance(checksum, dict) or checksum.get("algorithm") != _CHECKSUM:
        raise BlobCorruptedError("KV blob has no readable integrity checksum")
    chunks = (view[located[name][2] : located[name][3]] for name in sorted(located))
    if _checksum(meta, chunks) != checksum.get("digest"):
        raise BlobCorruptedError("KV blob failed its integrity check (damaged or modified on disk); re-encode it")


def _check_fingerprint(meta: dict[str, Any], expected: ModelFingerprint, preamble_digest: str | None) -> None:
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


def _expected_shapes(codec: Codec, want: tuple[int, int, int, int]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    num_layers, heads, tokens, dim = want
    if not codec.quantized:
        return {"keys": (want, codec.float_dtype), "values": (want, codec.float_dtype)}
    try:
        key_width, value_width = packed_width(dim, codec.key_bits), packed_width(dim, codec.value_bits)
        if codec.value_transform == "hadamard":
            hadamard_matrix(dim)
    except ValueError as exc:
        raise BlobCorruptedError("KV blob codec does not fit the model's head dim") from exc
    key_scales = (num_layers, heads, math.ceil(tokens / codec.key_group), dim)
    value_scales = (num_layers, heads, tokens, math.ceil(dim / min(codec.value_group, dim)))
    u8, f16 = torch.uint8, torch.float16
    own = {}
    for layer, kb, vb in codec.layer_bits:  # layers at their own widths: tensors of their own
        if layer >= num_layers:
            continue
        try:
            own[f"keys@{layer}"] = ((heads, tokens, packed_width(dim, kb)), u8)
            own[f"values@{layer}"] = ((heads, tokens, packed_width(dim, vb)), u8)
        except ValueError as exc:
            raise BlobCorruptedError("KV blob codec does not fit the model's head dim") from exc
    shared = num_layers - len(own) // 2
    return own | {
        "keys": ((shared, heads, tokens, key_width), u8),
        "values": ((shared, heads, tokens, value_width), u8),
        "key_scales": (key_scales, f16), "key_zeros": (key_scales, f16),
        "value_scales": (value_scales, f16),
    } | ({} if codec.value_symmetric else {"value_zeros": (value_scales, f16)})


def decode_entry(
    blob: bytes | bytearray | memoryview,
    *,
    expected: ModelFingerprint,
    dtype: torch.dtype | str | None = None,
    preamble_digest: str | None = None,
) -> EncodedEntry:
    """Parse a blob made by :func:`encode_entry` (any format version, any codec) for the model ``expected`` describes.

    Raises :class:`FingerprintMismatchError` if it was made by another model/dtype/tokenizer (or after another
    preamble, when ``preamble_digest`` is given) and :class:`BlobCorruptedError` if it is unreadable, truncated, or
    fails its checksum (so damaged or tampered tensors are never returned). KV come back in ``dtype`` (default:
    the fingerprint's model dtype; ``KEEP_STORAGE_DTYPE``: float codecs as stored); zero-copy when no cast is
    needed. Integer codecs return a :class:`~agentmem.kv.quant.QuantizedEntry` (dequantized when mounted, or on
    first access of ``keys``/``values``). Error messages name fields only, never tensor contents.

    Example:
        >>> from agentmem.kv.engine import KVEngine
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> engine = KVEngine(*tiny_causal_lm("llama"))
        >>> entry = engine.encode("Alice moved to Lisbon in 2021.")
        >>> from pathlib import Path
        >>> path = Path("entry.safetensors")
        >>> _ = path.write_bytes(encode_entry(entry, engine.fingerprint))
        >>> torch.equal(decode_entry(map_file(path), expected=engine.fingerprint).keys, entry.keys)
        True
    """
    view = memoryview(blob).cast("B") if not isinstance(blob, memoryview) else blob.cast("B")
    specs, meta, data_start = _parse_header(view)
    if meta.get("format") != FORMAT_NAME:
        raise BlobCorruptedError("not an agentmem KV blob (format tag missing)")
    if meta.get("format_version") not in _READABLE_VERSIONS:
        raise BlobCorruptedError(f"unsupported KV blob format version {meta.get('format_version')!r}")
    _check_fingerprint(meta, expected, preamble_digest)
    codec = _blob_codec(meta)
    try:
        offset = int(meta["offset"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BlobCorruptedError("KV blob metadata lacks the encoding offset") from exc
    names = ("keys", "values") if not codec.quantized else _quant_tensors(codec, expected.num_layers)
    located = {name: _locate(view, specs, name, data_start) for name in (*names, "token_ids")}
    if set(specs) != set(located):
        raise BlobCorruptedError("KV blob holds tensors its codec does not name")
    if meta["format_version"] != "1":
        _verify(view, meta, located)

    with warnings.catch_warnings():  # once per blob, not per tensor: entering it costs ~5 us
        # frombuffer warns that bytes are read-only; we never write through these tensors (mounting copies).
        warnings.simplefilter("ignore", UserWarning)
        tensors = {name: _tensor(view, where) for name, where in located.items()}
    token_ids = tensors.pop("token_ids")
    if token_ids.dtype != torch.int64 or token_ids.dim() != 1:
        raise BlobCorruptedError("KV blob token ids have an unexpected dtype or rank")
    want = (expected.num_layers, expected.num_kv_heads, token_ids.numel(), expected.head_dim)
    for name, (shape, kind) in _expected_shapes(codec, want).items():
        if tensors[name].dtype != kind or tuple(tensors[name].shape) != shape:
            raise BlobCorruptedError(f"KV blob tensor {name!r} has shape {tuple(tensors[name].shape)} or dtype "
                                     f"{tensors[name].dtype}, expected {shape} {kind}")
    if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= expected.vocab_size):
        raise BlobCorruptedError("KV blob holds token ids outside the vocabulary")
    model_dtype = STORAGE_DTYPES.get(expected.dtype, torch.float32)
    common = dict(token_ids=token_ids, offset=offset, fingerprint=expected.digest,
                  preamble_digest=str(meta.get("preamble_digest", "")))
    if codec.quantized:
        # scales are small (1/32 of the codes or less): widened once here so the mount kernel reads float32
        packed = PackedKV.from_stored(codec, tensors, expected.head_dim)
        target = model_dtype if dtype in (None, KEEP_STORAGE_DTYPE) else dtype
        return QuantizedEntry(packed=packed, dtype=target, **common)
    keys, values = tensors["keys"], tensors["values"]
    target = codec.float_dtype if dtype == KEEP_STORAGE_DTYPE else (dtype if dtype is not None else model_dtype)
    if keys.dtype != target:  # a cast allocates new memory anyway, so the result no longer aliases the blob
        keys, values = keys.to(target), values.to(target)
    return EncodedEntry(keys=keys, values=values, **common)
