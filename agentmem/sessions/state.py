"""What a session is made of: its transcript (texts + token ids) and its working KV, and their on-disk form.

* :class:`Transcript`: the turns (scanned user text, reply text, the ids they occupy, the long-term memory ids
  they were stored as), every history token id after the preamble, how many of them have KV, and the validity
  key the KV was built under. Small; enough to rebuild the KV from scratch.
* :class:`SessionKV`: stacked buffers ``[layers, 1, kv_heads, capacity, head_dim]`` holding the preamble and the
  history, with spare capacity for the next turn. A :class:`~agentmem.kv.BufferedCache` is a zero-copy view on it.
* :func:`dump_session` / :func:`load_session`: one safetensors file (``ids``, ``keys``, ``values`` + JSON metadata),
  encrypted as a whole when a cipher is set. By default the KV keeps the model's dtype, so a restored session
  continues token-for-token like one that never left memory; ``codec=`` (``MemoryConfig.session_kv_codec``) stores
  it with one of :mod:`agentmem.kv.quant`'s integer codecs instead (a cold tier then holds several times more
  sessions, at the fidelity docs/kv-compression.md measures).
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from safetensors.torch import save as _st_save

from agentmem.errors import BlobCorruptedError
from agentmem.kv.quant import Codec, PackedKV, codec_for, dequantize_kv, quantize_kv
from agentmem.kv.turn import SessionKV  # re-exported: the engine's turn operation builds and grows it
from agentmem.security.sealer import session_aad  # re-exported: it lives with the sealer

__all__ = ["PackedSessionKV", "SessionKV", "Transcript", "Turn", "dump_session", "load_session", "session_aad"]

FORMAT = "agentmem.session"
FORMAT_VERSION = 1
_META_KEY = "agentmem.session"


@dataclass
class Turn:
    """One exchange. ``start``/``end`` index the transcript's ``ids``; ``record_ids`` are long-term memory ids."""

    user: str
    reply: str
    start: int
    end: int
    record_ids: list[str] = field(default_factory=list)
    at: float = 0.0


@dataclass
class Transcript:
    """A conversation's texts and token ids; ``kv_len`` of the ``ids`` have KV (the rest is pending)."""

    session_id: str
    user_id: str
    ids: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    kv_len: int = 0
    key: dict[str, Any] | None = None  # validity of the KV: fingerprint, preamble digest, kb version, epoch
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    evicted_turns: int = 0

    @property
    def in_cache_records(self) -> set[str]:
        return {r for t in self.turns for r in t.record_ids}

    def drop_turns(self, count: int) -> int:
        """Forget the oldest ``count`` turns (ids and offsets shift); returns how many ids left."""
        if count <= 0:
            return 0
        cut = self.turns[count].start if count < len(self.turns) else len(self.ids)
        del self.ids[:cut]
        del self.turns[:count]
        for t in self.turns:
            t.start -= cut
            t.end -= cut
        self.kv_len = max(0, self.kv_len - cut)
        self.evicted_turns += count
        return cut

    def meta(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("ids")
        return d

    @classmethod
    def from_meta(cls, meta: dict[str, Any], ids: list[int]) -> Transcript:
        turns = [Turn(**t) for t in meta.pop("turns")]
        return cls(ids=ids, turns=turns, **meta)


@dataclass
class PackedSessionKV:
    """Session KV held as integer codes (the warm tier with ``MemoryConfig.session_warm_kv_codec``): the codec's
    bytes in CPU memory instead of the model dtype's, so a warm budget holds several times more sessions.

    It has what the manager asks of a warm value (``length``, ``capacity``, ``nbytes``, :meth:`moved`); moving it
    back to the hot tier dequantizes it (the torch reference path of :mod:`agentmem.kv.quant`) into float buffers
    with room to grow. Lossy, at the codec's measured fidelity (docs/kv-compression.md).

    Example:
        >>> kv = SessionKV(torch.randn(2, 1, 2, 32, 64), torch.randn(2, 1, 2, 32, 64), 20)
        >>> warm = PackedSessionKV.pack(kv, "int8")
        >>> warm.nbytes < kv.nbytes / 3
        True
        >>> hot = warm.moved("cpu", capacity=warm.length + 64)   # a SessionKV again
        >>> hot.length, hot.capacity
        (20, 84)
    """

    packed: PackedKV  # codes of [L, H, T, D] (the batch dim of SessionKV dropped)
    length: int
    dtype: torch.dtype  # what :meth:`moved` gives back: the model's dtype

    @classmethod
    def pack(cls, kv: SessionKV, codec: str | Codec) -> PackedSessionKV:
        spec = codec if isinstance(codec, Codec) else codec_for(codec)
        if not spec.quantized:
            raise ValueError(f"{spec.name} is not an integer codec")
        keys = kv.keys[:, 0, :, : kv.length].detach()
        values = kv.values[:, 0, :, : kv.length].detach()
        return cls(quantize_kv(keys, values, spec), kv.length, kv.keys.dtype)

    @property
    def capacity(self) -> int:
        return self.length

    @property
    def nbytes(self) -> int:
        p = self.packed
        own = [t for _, kc, vc in p.layer_codes for t in (kc, vc)]  # a codec's layer_bits layers
        return sum(t.numel() * t.element_size() for t in (
            p.key_codes, p.value_codes, *own, *(getattr(p, n) for n in _QUANT)) if t is not None)

    @property
    def float_bytes_per_token(self) -> int:
        """What each token takes once dequantized (keys + values in ``dtype``)."""
        num_layers, heads, _, dim = self.packed.shape
        return 2 * num_layers * heads * dim * self.dtype.itemsize

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def moved(self, device: torch.device | str, *, capacity: int | None = None) -> SessionKV:
        """Dequantized float buffers on ``device`` with room for ``capacity`` tokens (default: ``length``)."""
        keys, values = dequantize_kv(self.packed, dtype=self.dtype)
        return SessionKV(keys.unsqueeze(1), values.unsqueeze(1), self.length).moved(device, capacity=capacity)


_QUANT = ("key_scales", "key_zeros", "value_scales", "value_zeros")


def dump_session(
    transcript: Transcript, kv: SessionKV | PackedSessionKV | None, *, codec: str | None = None
) -> bytes:
    """Serialise a session: its transcript and (if any) its valid KV as safetensors, in the KV's own dtype or, with
    ``codec`` an integer codec (``"int8"``, ``"int4"``, ...), as codes + scales (keys per channel, values per token).

    Example:
        >>> state = Transcript("s1", "u1", ids=list(range(20)), kv_len=20)
        >>> kv = SessionKV(torch.randn(2, 1, 2, 32, 64), torch.randn(2, 1, 2, 32, 64), 20)
        >>> blob = dump_session(state, kv, codec="int8")
        >>> transcript, kv2 = load_session(blob)       # kv2 in kv's dtype, dequantized
        >>> transcript.ids == state.ids, kv2.length, kv2.keys.dtype
        (True, 20, torch.float32)
    """
    spec = codec_for(codec) if codec is not None else None
    tensors = {"ids": torch.tensor(transcript.ids, dtype=torch.int64)}
    info: dict[str, Any] = {"format": FORMAT, "version": FORMAT_VERSION, "transcript": transcript.meta()}
    packed = None
    if isinstance(kv, PackedSessionKV):  # from the warm tier
        if spec == kv.packed.codec:
            packed = kv.packed  # its codes written as they are: no second rounding
        else:
            kv = kv.moved("cpu")
    if packed is not None or (kv is not None and kv.length > 0 and spec is not None and spec.quantized):
        if packed is None:  # [L, 1, H, T, D] -> per-layer [L, H, T, D]
            packed = quantize_kv(kv.keys[:, 0, :, : kv.length], kv.values[:, 0, :, : kv.length], spec)
        tensors.update(packed.stored())
        dtype = kv.dtype if isinstance(kv, PackedSessionKV) else kv.keys.dtype
        info.update(kv_codec=spec.to_dict(), kv_dtype=str(dtype).removeprefix("torch."))
    elif kv is not None and kv.length > 0:
        keys = kv.keys[..., : kv.length, :].detach().to("cpu")
        values = kv.values[..., : kv.length, :].detach().to("cpu")
        dtype = spec.float_dtype if spec is not None else keys.dtype
        tensors.update(keys=keys.to(dtype).contiguous(), values=values.to(dtype).contiguous())
    info["has_kv"] = "keys" in tensors
    return _st_save(tensors, metadata={_META_KEY: json.dumps(info, sort_keys=True, separators=(",", ":"))})


def _dequantized(info: dict[str, Any], tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    codec = Codec.from_dict(info["kv_codec"])
    codes = tensors["keys"]
    packed = PackedKV.from_stored(codec, tensors, head_dim=codes.shape[-1] * 8 // codec.key_bits)
    dtype = getattr(torch, str(info.get("kv_dtype", "float32")))
    keys, values = dequantize_kv(packed, dtype=dtype)
    return keys.unsqueeze(1), values.unsqueeze(1)


def load_session(blob: bytes, *, with_kv: bool = True) -> tuple[Transcript, SessionKV | None]:
    """Inverse of :func:`dump_session`; raises :class:`BlobCorruptedError` on anything malformed."""
    try:
        header, start = _read_header(blob)
        info = json.loads((header.get("__metadata__") or {})[_META_KEY])
        if info.get("format") != FORMAT or int(info.get("version", -1)) != FORMAT_VERSION:
            raise ValueError(f"unknown session format {info.get('format')!r} v{info.get('version')!r}")
        ids = _view(blob, start, header["ids"]).tolist()
        transcript = Transcript.from_meta(info["transcript"], ids)
        quantized = "kv_codec" in info
        # (a codec with symmetric values stores no value zero points: they are implied by the scales; one with
        # layer_bits stores those layers' codes apart, as keys@<layer> / values@<layer>)
        own = tuple(n for n in header if n.startswith(("keys@", "values@"))) if quantized else ()
        names = ("keys", "values", *(_QUANT if quantized else ()), *own)
        tensors = {name: _view(blob, start, header[name]) for name in names
                   if with_kv and info.get("has_kv") and (name != "value_zeros" or name in header)}
        if tensors and quantized:
            keys, values = _dequantized(info, tensors)
            tensors = {"keys": keys, "values": values}
    except BlobCorruptedError:
        raise
    except Exception as exc:  # safetensors, json and dataclass errors all mean the same: unusable file
        raise BlobCorruptedError(f"session file is unreadable ({type(exc).__name__})") from None
    kv = None
    if with_kv and info.get("has_kv"):
        keys, values = tensors["keys"], tensors["values"]
        if keys.dim() != 5 or keys.shape != values.shape:
            raise BlobCorruptedError("session file holds KV of an unexpected shape")
        kv = SessionKV(keys, values, int(keys.shape[3]))
    return transcript, kv


_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64, "U8": torch.uint8}


def _view(blob: bytes | bytearray | memoryview, start: int, spec: dict[str, Any]) -> torch.Tensor:
    """A tensor over the blob's bytes, no copy (read-only use: it is copied once, into the device buffers)."""
    dtype = _DTYPES[spec["dtype"]]
    shape = [int(x) for x in spec["shape"]]
    a, b = (int(x) for x in spec["data_offsets"])
    count = 1
    for x in shape:
        count *= x
    if not 0 <= a <= b <= len(blob) - start or b - a != count * dtype.itemsize:
        raise ValueError("tensor bounds do not match its shape")
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    with warnings.catch_warnings():  # bytes are read-only; we never write through these views
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(memoryview(blob)[start + a : start + b], dtype=dtype)
    return flat.view(shape)


def _read_header(blob: bytes) -> tuple[dict[str, Any], int]:
    """The safetensors JSON header and where the tensor data starts."""
    n = int.from_bytes(bytes(blob[:8]), "little")
    if n <= 0 or n > len(blob) - 8 or n > (1 << 26):
        raise ValueError("bad safetensors header length")
    return json.loads(bytes(blob[8 : 8 + n])), 8 + n
