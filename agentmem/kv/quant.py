"""Integer KV codecs (KIVI's layout): keys quantized per channel, values per token, in groups, with scales beside.

KIVI (Liu et al., 2024) found that keys have a few outlier *channels* (so one scale per channel, shared by a group
of tokens, keeps them from swamping everyone else's precision) while values have no such structure (so one scale
per token, over a group of channels). Both use asymmetric min/max quantization: ``x ≈ code * scale + zero``, codes
in ``[0, 2**bits - 1]``, scales and zero points stored in float16.

Codes are packed along the head dimension, ``8 // bits`` per byte, planar: with ``W = head_dim * bits / 8`` bytes
per row, element ``i`` is in byte ``i % W`` at bit ``(i // W) * bits``. One key row is ``W`` contiguous bytes and
the mount kernel (:mod:`agentmem.kv.rope_kernel`) unpacks, scales, rotates and writes it in one pass.

Stored sizes for SmolLM2-135M (30 layers x 3 KV heads x 64 dims; fp32 = 46,080 B/token), full groups:

    codec   key bits  value bits  bytes/token (codes + scales)   vs fp32
    int8    8         8           11,520 + 1,080 = 12,600        3.7x
    int4    4         4            5,760 + 1,080 =  6,840        6.7x
    k4v2    4         2            4,320 + 1,080 =  5,400        8.5x
    int2    2         2            2,880 + 1,080 =  3,960       11.6x
    int4h   4         4 (rotated)  5,760 +   720 =  6,480        7.1x   (key scales per 64 tokens)
    k4v3h   4         3 (rotated)  5,040 +   720 =  5,760        8.0x
    k3v3h   3         3 (rotated)  4,320 +   720 =  5,040        9.1x
    k4v2h   4         2 (rotated)  4,320 +   720 =  5,040        9.1x
    k4v3hs  4         3 (rot., sym) 5,040 +   360 =  5,400        8.5x   (keys per 128 tokens, ranges clipped)
    k4v3hsf 4         3 (rot., sym) 5,040 +   360 =  5,400        8.5x   (k4v3hs, ranges from the fine grid)
    k4v3hsl 4         3; layer 1: 4  5,064 +   360 =  5,424        8.5x   (k4v3hsf, layer 1's values 4-bit)
    k4v3hsl2 4        3; 1, 18: 4    5,088 +   360 =  5,448        8.5x   (and layer 18's values)

3-bit codes are a 2-bit plane then a 1-bit plane (``W = 3 * head_dim / 8``). ``value_transform="hadamard"``
rotates value rows by :func:`hadamard_matrix` before quantizing (spreading outlier channels over the row, so the
per-token range shrinks); the mount kernel rotates them back while writing them. ``value_symmetric`` stores one
scale per value group and no zero point (implied: the middle of the code range). ``clip`` picks each group's range
by an encode-time search (:data:`CLIP_GRID`); a 60-token SmolLM2 turn pays one 128-token key group, so ``k4v3hs``
stores 5,635 B/token there (8.2x fewer than fp32).

Example:
    >>> keys, values = torch.randn(2, 1, 40, 64), torch.randn(2, 1, 40, 64)   # [layers, kv heads, tokens, head dim]
    >>> packed = quantize_kv(keys, values, CODECS["int4"])
    >>> keys2, values2 = dequantize_kv(packed)
    >>> keys2.shape, bool((values2 - values).abs().mean() < 0.25)
    (torch.Size([2, 1, 40, 64]), True)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from agentmem.kv.rope import _cached_tables, rerotate_keys_into
from agentmem.kv.rope_kernel import dequant_runs_into, fused_dequant_applies, kernels_available
from agentmem.kv.types import EncodedEntry

__all__ = [
    "CODECS",
    "FLOAT_CODECS",
    "Codec",
    "PackedKV",
    "QuantizedEntry",
    "codec_for",
    "dequantize_kv",
    "hadamard_matrix",
    "implied_zero",
    "packed_width",
    "place_packed",
    "quantize_kv",
]

BIT_WIDTHS = (2, 3, 4, 8)

FLOAT_CODECS: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


@dataclass(frozen=True)
class Codec:
    """How an entry's KV are stored: a float dtype, or integer codes with their bit widths and group sizes.

    ``key_group`` is the number of tokens that share one scale per channel; ``value_group`` the number of channels
    that share one scale per token (capped at the head dim). Part of every blob header (:meth:`to_dict`).

    Example:
        >>> CODECS["int4"].bytes_per_token(num_layers=30, kv_heads=3, head_dim=64)
        6840.0
    """

    name: str
    key_bits: int | None = None  # None: a float codec
    value_bits: int | None = None
    key_group: int = 32
    value_group: int = 64
    value_transform: str | None = None  # "hadamard": values rotated (orthonormal Hadamard) before quantization
    # Values quantized symmetrically: one fp16 scale per group, the zero point implied (-scale * levels / 2), so
    # it is not stored. After a Hadamard rotation a value row is centred near zero, so this costs little range.
    value_symmetric: bool = False
    # Each group's range is shrunk by the factor of CLIP_GRID with the least squared error on that group (clipping
    # a few extreme elements buys every other element a finer step). Encode-time only; decoding is the same.
    clip: bool = False
    # Which grid the clip search tries: "coarse" (CLIP_GRID, 9 factors) or "fine" (FINE_CLIP_GRID, 23). Encode
    # time only, like ``clip``: the decoder reads the same codes and scales.
    clip_grid: str = "coarse"
    # Layers stored at other bit widths, ((layer, key_bits, value_bits), ...) sorted by layer: a sensitive layer
    # bought more bits. Their codes are tensors of their own; the shared codes tensors hold the other layers.
    layer_bits: tuple[tuple[int, int, int], ...] = ()

    @property
    def quantized(self) -> bool:
        return self.key_bits is not None

    @property
    def float_dtype(self) -> torch.dtype | None:
        return FLOAT_CODECS.get(self.name)

    def to_dict(self) -> dict:
        if not self.quantized:
            return {"name": self.name}
        out = {"name": self.name, "key_bits": self.key_bits, "value_bits": self.value_bits,
               "key_group": self.key_group, "value_group": self.value_group}
        if self.value_transform is not None:  # absent in the headers of every codec that predates it
            out["value_transform"] = self.value_transform
        for flag in ("value_symmetric", "clip"):  # likewise: present only when set
            if getattr(self, flag):
                out[flag] = True
        if self.clip_grid != "coarse":
            out["clip_grid"] = self.clip_grid
        if self.layer_bits:
            out["layer_bits"] = [list(t) for t in self.layer_bits]
        return out

    def bits(self, layer: int) -> tuple[int, int]:
        """(key bits, value bits) of ``layer``.

        Example:
            >>> CODECS["k4v3hsl"].bits(1), CODECS["k4v3hsl"].bits(2)
            ((4, 4), (4, 3))
        """
        for at, kb, vb in self.layer_bits:
            if at == layer:
                return kb, vb
        return self.key_bits, self.value_bits

    @classmethod
    def from_dict(cls, data: object) -> Codec:
        """The codec a blob header describes; ``ValueError`` if it is malformed or has impossible parameters."""
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ValueError("codec is not an object with a name")
        if data["name"] in FLOAT_CODECS and set(data) == {"name"}:
            return CODECS[data["name"]]
        try:
            codec = cls(name=data["name"], key_bits=int(data["key_bits"]), value_bits=int(data["value_bits"]),
                        key_group=int(data["key_group"]), value_group=int(data["value_group"]),
                        value_transform=data.get("value_transform"),
                        value_symmetric=data.get("value_symmetric", False), clip=data.get("clip", False),
                        clip_grid=data.get("clip_grid", "coarse"),
                        layer_bits=tuple(tuple(int(x) for x in t) for t in data.get("layer_bits", ())))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError("codec parameters are missing or not integers") from exc
        if not isinstance(codec.value_symmetric, bool) or not isinstance(codec.clip, bool):
            raise ValueError("codec value_symmetric and clip must be booleans")
        if codec.clip_grid not in CLIP_GRIDS:
            raise ValueError(f"codec clip_grid must be one of {sorted(CLIP_GRIDS)}")
        layers = [t[0] for t in codec.layer_bits]
        if any(len(t) != 3 for t in codec.layer_bits) or layers != sorted(set(layers)) or min(layers, default=0) < 0:
            raise ValueError("codec layer_bits must be distinct (layer, key_bits, value_bits) sorted by layer")
        widths = [b for t in codec.layer_bits for b in t[1:]]
        if any(b not in BIT_WIDTHS for b in (codec.key_bits, codec.value_bits, *widths)):
            raise ValueError(f"codec bit widths must be one of {BIT_WIDTHS}")
        if codec.value_transform not in (None, "hadamard"):
            raise ValueError("codec value_transform must be absent or 'hadamard'")
        if codec.key_group < 1 or codec.value_group < 1:
            raise ValueError("codec group sizes must be positive")
        return codec

    def bytes_per_token(self, *, num_layers: int, kv_heads: int, head_dim: int) -> float:
        """Stored bytes per token with full groups (short entries pay a little more for their key scales)."""
        heads = num_layers * kv_heads
        if not self.quantized:
            return heads * head_dim * 2 * self.float_dtype.itemsize
        codes = kv_heads * head_dim * sum(sum(self.bits(i)) for i in range(num_layers)) / 8
        key_scales = heads * head_dim * 4 / self.key_group  # fp16 scale + zero per channel, per group of tokens
        per_scale = 2 if self.value_symmetric else 4  # fp16 scale (+ zero point)
        value_scales = heads * math.ceil(head_dim / min(self.value_group, head_dim)) * per_scale
        return codes + key_scales + value_scales


CODECS: dict[str, Codec] = {name: Codec(name) for name in FLOAT_CODECS} | {
    "int8": Codec("int8", 8, 8),
    "int4": Codec("int4", 4, 4),
    "k4v2": Codec("k4v2", 4, 2),
    "int2": Codec("int2", 2, 2),
    # Values rotated by a Hadamard transform before quantizing; one key scale group per 64 tokens (a whole
    # LoCoMo-sized turn), docs/kv-compression.md.
    "int4h": Codec("int4h", 4, 4, key_group=64, value_transform="hadamard"),
    "k4v3h": Codec("k4v3h", 4, 3, key_group=64, value_transform="hadamard"),
    "k3v3h": Codec("k3v3h", 3, 3, key_group=64, value_transform="hadamard"),
    "k4v2h": Codec("k4v2h", 4, 2, key_group=64, value_transform="hadamard"),
    # One key scale group per 128 tokens (a whole turn), values rotated and symmetric (one fp16 scale per token),
    # every range chosen by the clip search.
    "k4v3hs": Codec("k4v3hs", 4, 3, key_group=128, value_transform="hadamard", value_symmetric=True, clip=True),
    # The same format, ranges chosen on the fine grid (23 factors): lower KL at no stored byte, ~2.5x the encode
    # time of k4v3hs' search (docs/kv-compression.md, session 4).
    "k4v3hsf": Codec("k4v3hsf", 4, 3, key_group=128, value_transform="hadamard", value_symmetric=True, clip=True,
                     clip_grid="fine"),
    # k4v3hsf with layer 1's values at 4 bits: the layer whose 3-bit values cost the most KL on the tune split
    # (leave-one-layer-out, research/kv_codec_variants.py); +24 B/token on SmolLM2.
    "k4v3hsl": Codec("k4v3hsl", 4, 3, key_group=128, value_transform="hadamard", value_symmetric=True, clip=True,
                     clip_grid="fine", layer_bits=((1, 4, 4),)),
    # ... and layer 18's too (the next most sensitive values on the tune split; +48 B/token in all)
    "k4v3hsl2": Codec("k4v3hsl2", 4, 3, key_group=128, value_transform="hadamard", value_symmetric=True, clip=True,
                      clip_grid="fine", layer_bits=((1, 4, 4), (18, 4, 4))),
}


def codec_for(name: str | torch.dtype) -> Codec:
    """The registered codec called ``name`` (a torch float dtype is accepted for the float codecs).

    Example:
        >>> codec_for(torch.float16).name
        'float16'
    """
    if isinstance(name, torch.dtype):
        name = str(name).removeprefix("torch.")
    try:
        return CODECS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown KV codec {name!r}; choose one of {sorted(CODECS)}") from None


@dataclass(frozen=True, eq=False)
class PackedKV:
    """Quantized KV of one entry: packed codes ``[L, H, T, D*bits/8]`` (uint8) and float scales/zero points.

    Key scales/zeros are ``[L, H, ceil(T / key_group), D]`` (per channel, per group of tokens); value
    scales/zeros ``[L, H, T, ceil(D / value_group)]`` (per token, per group of channels). Scales may be float16
    (as stored) or float32 (as the mount kernel reads them). ``value_zeros`` is ``None`` for a codec with
    ``value_symmetric`` (implied by the scales: :meth:`value_offsets`).
    """

    codec: Codec
    key_codes: torch.Tensor
    key_scales: torch.Tensor
    key_zeros: torch.Tensor
    value_codes: torch.Tensor
    value_scales: torch.Tensor
    value_zeros: torch.Tensor | None
    head_dim: int
    # The codec's layer_bits layers: ((layer, key codes [H, T, W], value codes [H, T, W']), ...); the shared
    # ``key_codes``/``value_codes`` hold every other layer, in order.
    layer_codes: tuple[tuple[int, torch.Tensor, torch.Tensor], ...] = ()

    def layer_runs(self) -> list[tuple[int, int, torch.Tensor, int, torch.Tensor, int]]:
        """Contiguous runs of layers with one bit width: ``(first, stop, key codes, key bits, value codes,
        value bits)``, codes ``[stop - first, H, T, W]``; one run for a codec without ``layer_bits``.

        Example:
            >>> kv = torch.randn(30, 1, 8, 64)
            >>> packed = quantize_kv(kv, kv, CODECS["k4v3hsl"])    # layer 1's values keep 4 bits
            >>> [(a, b, kb, vb) for a, b, _, kb, _, vb in packed.layer_runs()]
            [(0, 1, 4, 3), (1, 2, 4, 4), (2, 30, 4, 3)]
        """
        own = {layer: (kc, vc) for layer, kc, vc in self.layer_codes}
        runs, shared, layer, num_layers = [], 0, 0, self.shape[0]
        while layer < num_layers:
            if layer in own:
                kb, vb = self.codec.bits(layer)
                kc, vc = own[layer]
                runs.append((layer, layer + 1, kc.unsqueeze(0), kb, vc.unsqueeze(0), vb))
                layer += 1
                continue
            first = layer
            while layer < num_layers and layer not in own:
                layer += 1
            n = layer - first
            runs.append((first, layer, self.key_codes[shared : shared + n], self.codec.key_bits,
                         self.value_codes[shared : shared + n], self.codec.value_bits))
            shared += n
        return runs

    def value_offsets(self) -> torch.Tensor:
        """The value zero points as float32, stored or implied (symmetric codes)."""
        if self.value_zeros is None:
            zero = implied_zero(self.value_scales, self.codec.value_bits)
            for layer, _, _ in self.layer_codes:  # the middle of each layer's own code range
                zero[layer] = implied_zero(self.value_scales[layer], self.codec.bits(layer)[1])
            return zero
        return self.value_zeros.float()

    def stored(self) -> dict[str, torch.Tensor]:
        """The tensors a blob stores, by name (scales as float16; no ``value_zeros`` when they are implied).

        Example:
            >>> k = v = torch.randn(2, 1, 8, 64)
            >>> sorted(quantize_kv(k, v, CODECS["int4"]).stored())[:2]
            ['key_scales', 'key_zeros']
        """
        half = torch.float16
        out = {"keys": self.key_codes.cpu().contiguous(), "values": self.value_codes.cpu().contiguous(),
               "key_scales": self.key_scales.to("cpu", half).contiguous(),
               "key_zeros": self.key_zeros.to("cpu", half).contiguous(),
               "value_scales": self.value_scales.to("cpu", half).contiguous()}
        if self.value_zeros is not None:
            out["value_zeros"] = self.value_zeros.to("cpu", half).contiguous()
        for layer, kc, vc in self.layer_codes:
            out[f"keys@{layer}"], out[f"values@{layer}"] = kc.cpu().contiguous(), vc.cpu().contiguous()
        return out

    @classmethod
    def from_stored(cls, codec: Codec, tensors: dict[str, torch.Tensor], head_dim: int) -> PackedKV:
        """The inverse of :meth:`stored`; scales widened to float32 once (the mount kernel reads float32).

        Example:
            >>> packed = quantize_kv(torch.randn(2, 1, 8, 64), torch.randn(2, 1, 8, 64), CODECS["int4"])
            >>> again = PackedKV.from_stored(packed.codec, packed.stored(), packed.head_dim)
            >>> torch.equal(again.key_codes, packed.key_codes)
            True
        """
        zeros = None if codec.value_symmetric else tensors["value_zeros"]  # KeyError: a blob missing them
        own = tuple((layer, tensors[f"keys@{layer}"], tensors[f"values@{layer}"]) for layer, _, _ in codec.layer_bits
                    if f"keys@{layer}" in tensors)  # (none for layers past a smaller model's last)
        return cls(codec=codec, key_codes=tensors["keys"], value_codes=tensors["values"], head_dim=head_dim,
                   layer_codes=own,
                   key_scales=tensors["key_scales"].float(), key_zeros=tensors["key_zeros"].float(),
                   value_scales=tensors["value_scales"].float(), value_zeros=None if zeros is None else zeros.float())

    @property
    def shape(self) -> tuple[int, int, int, int]:
        num_layers, heads, tokens, _ = self.key_codes.shape
        return (num_layers + len(self.layer_codes), heads, tokens, self.head_dim)

    @property
    def value_group(self) -> int:
        return min(self.codec.value_group, self.head_dim)


def packed_width(dim: int, bits: int) -> int:
    """Bytes per packed row of ``dim`` codes of ``bits`` bits; ``ValueError`` if ``dim`` does not pack evenly.

    Example:
        >>> packed_width(64, 3)
        24
    """
    need = 8 if bits == 3 else 8 // bits  # 3 bits: a 2-bit plane (D/4 bytes) + a 1-bit plane (D/8 bytes)
    if bits not in BIT_WIDTHS or dim % need:
        raise ValueError(f"head dim {dim} does not pack {bits}-bit codes (needs a multiple of {need})")
    return dim * bits // 8


def _pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes ``[..., D]`` (each < 2**bits) → ``[..., W]``, ``W = D * bits / 8``: element i at byte i % W,
    bit (i // W) * bits. Planar, so unpacking writes contiguous runs (the kernel's loops vectorise) and, at 4 bits,
    each byte holds one RoPE pair (i, i + D/2). 3 bits: the low 2 bits planar as 2-bit codes, then the high bit
    planar as 1-bit codes (two streams, each as regular as the others)."""
    if bits == 3:
        return torch.cat([_pack(codes & 3, 2), _pack(codes >> 2, 1)], dim=-1)
    per = 8 // bits
    if per == 1:
        return codes.contiguous()
    width = codes.shape[-1] // per
    out = codes[..., :width].clone()
    for j in range(1, per):
        out |= codes[..., j * width : (j + 1) * width] << (bits * j)
    return out.contiguous()


def _unpack(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    if bits == 3:
        lo = dim // 4
        return _unpack(packed[..., :lo], 2, dim) | (_unpack(packed[..., lo:], 1, dim) << 2)
    per = 8 // bits
    if per == 1:
        return packed
    mask = (1 << bits) - 1
    return torch.cat([(packed >> (bits * j)) & mask for j in range(per)], dim=-1)


# Range factors the clip search tries (1.0: plain min/max); fixed before any measurement, as GPTQ/AWQ-style grids.
CLIP_GRID = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6)
# Steps of 0.025 down to 0.45 (the variant study's grid, fixed in session 3 before it was run).
FINE_CLIP_GRID = tuple(round(1.0 - 0.025 * i, 3) for i in range(23))
CLIP_GRIDS = {"coarse": CLIP_GRID, "fine": FINE_CLIP_GRID}


def implied_zero(scale: torch.Tensor, bits: int) -> torch.Tensor:
    """The zero point of symmetric codes: the middle of the code range (float32, as the mount reads it).

    Example:
        >>> implied_zero(torch.tensor([0.5]), 3)
        tensor([-1.7500])
    """
    return scale.float() * (-((1 << bits) - 1) / 2)


def _group_ranges(xg: torch.Tensor, dim: int, bits: int, symmetric: bool, clip: bool, real: int | None = None,
                  grid: tuple[float, ...] = CLIP_GRID):
    """fp16 scales and float32 zero points (one per group, ``dim`` reduced) for the groups of ``xg``: min/max,
    or with ``clip`` the shrunk range of :data:`CLIP_GRID` that reconstructs each group with the least error.
    ``real``: only the first ``real`` elements of the flattened group axes count in that error (the rest is
    padding of the last group)."""
    levels = (1 << bits) - 1
    hi, lo = xg.amax(dim=dim, keepdim=True), xg.amin(dim=dim, keepdim=True)
    amax, mid, half = torch.maximum(hi, -lo), (hi + lo) / 2, (hi - lo) / 2
    best = None
    # One buffer for every factor's reconstruction error, computed in place: the same float32 operations in the
    # same order as the expression they replace (so the same errors and choices), without three fresh tensors
    # per factor: 2.6x faster per factor (1.7 -> 0.65 ms for a 60-token SmolLM2 turn's values, one core).
    # Stacking all factors into one tensor instead was 3-4x SLOWER (it leaves the cache; docs/kv-compression.md).
    buf = torch.empty_like(xg) if clip else None
    keep = None
    if clip and real is not None:  # padding repeats the last element: it must not weigh in
        keep = (torch.arange(xg.shape[dim - 1] * xg.shape[dim]) < real).view(xg.shape[dim - 1], xg.shape[dim])
        keep = keep.view(*keep.shape, *([1] * (xg.dim() - dim - 1))).to(xg.dtype)
    for c in grid if clip else (1.0,):
        if symmetric:
            scale = (2 * c * amax / levels).to(torch.float16)
            # An all-zero group: the smallest fp16 step. Symmetric codes have no exact 0 (mid-rise, the better
            # grid for rotated rows), so it comes back as +-2**-25.
            scale = torch.where(scale > 0, scale, torch.full_like(scale, 2.0 ** -24))
            zero = implied_zero(scale, bits)
        else:  # (c = 1: exactly the min/max of every earlier release, so re-encoding reproduces its codes)
            zero = (lo if c == 1.0 else mid - c * half).to(torch.float16).float()
            scale = (((hi if c == 1.0 else mid + c * half) - zero) / levels).to(torch.float16)
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # a constant group: every code 0, exact
        if not clip:
            return scale.squeeze(dim), zero.squeeze(dim)
        s = scale.float()
        sq = torch.sub(xg, zero, out=buf).div_(s).round_().clamp_(0, levels).mul_(s).add_(zero).sub_(xg).square_()
        if keep is not None:
            sq.mul_(keep)
        err = sq.sum(dim, keepdim=True)
        if best is None:
            best = [err, scale, zero]
            continue
        better = err < best[0]
        best = [torch.where(better, err, best[0]), torch.where(better, scale, best[1]),
                torch.where(better, zero, best[2])]
    return best[1].squeeze(dim), best[2].squeeze(dim)


def _codes(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int, expand) -> torch.Tensor:
    """uint8 codes of ``x`` given each group's scale and zero (``expand`` broadcasts them to x)."""
    s, z = expand(scale.float()), expand(zero.float())
    return torch.clamp(torch.round((x - z) / s), 0, (1 << bits) - 1).to(torch.uint8)


def quantize_kv(keys: torch.Tensor, values: torch.Tensor, codec: Codec) -> PackedKV:
    """Quantize ``[L, H, T, D]`` keys per channel (groups of ``key_group`` tokens) and values per token.

    Raises ``ValueError`` if ``D`` is not a multiple of the codes packed per byte.

    Example:
        >>> keys, values = torch.randn(2, 1, 8, 64), torch.randn(2, 1, 8, 64)
        >>> packed = quantize_kv(keys, values, CODECS["int4"])
        >>> packed.key_codes.shape[-1] == keys.shape[-1] // 2     # two 4-bit codes per byte
        True
    """
    if not codec.quantized:
        raise ValueError(f"{codec.name} is not an integer codec")
    num_layers, heads, tokens, dim = keys.shape
    for bits in (codec.key_bits, codec.value_bits, *(b for t in codec.layer_bits for b in t[1:])):
        packed_width(dim, bits)
    k = keys.detach().to(device="cpu", dtype=torch.float32)
    v = values.detach().to(device="cpu", dtype=torch.float32)
    if codec.value_transform == "hadamard":
        # Spreads each value row's energy over all channels (no outliers left to stretch a token's range); the
        # mount undoes it on the dequantized row (rope_kernel.hadamard_row), so it costs no extra pass.
        v = v @ hadamard_matrix(dim).T
    # The layers bought other widths (a smaller model than the codec was chosen for may lack some) are
    # quantized once, at their own widths; every other layer once, at the shared widths. Groups never span
    # layers, so this is what quantizing all layers at the shared widths and then these again gave.
    own_bits = [(layer, kb, vb) for layer, kb, vb in codec.layer_bits if layer < num_layers]
    shared = [i for i in range(num_layers) if i not in {layer for layer, _, _ in own_bits}]
    whole = len(shared) == num_layers
    key_codes, ks, kz, value_codes, vs, vz = _quantize_layers(
        k if whole else k[shared], v if whole else v[shared], codec, codec.key_bits, codec.value_bits)
    key_scales, key_zeros, value_scales, value_zeros = (
        _all_layers(t, shared, num_layers) for t in (ks, kz, vs, vz))
    own = []
    for layer, kb, vb in own_bits:
        kc, ks, kz, vc, vs, vz = _quantize_layers(k[layer : layer + 1], v[layer : layer + 1], codec, kb, vb)
        key_scales[layer], key_zeros[layer], value_scales[layer] = ks[0], kz[0], vs[0]
        if value_zeros is not None:
            value_zeros[layer] = vz[0]
        own.append((layer, _pack(kc[0], kb), _pack(vc[0], vb)))
    return PackedKV(
        codec=codec,
        key_codes=_pack(key_codes, codec.key_bits),
        key_scales=key_scales.contiguous(),
        key_zeros=key_zeros.to(torch.float16).contiguous(),
        value_codes=_pack(value_codes, codec.value_bits),
        value_scales=value_scales.contiguous(),
        value_zeros=None if value_zeros is None else value_zeros.to(torch.float16).contiguous(),
        head_dim=dim,
        layer_codes=tuple(own),
    )


def _all_layers(t: torch.Tensor | None, shared: list[int], num_layers: int) -> torch.Tensor | None:
    """``t`` (one row per shared layer) as a tensor over all ``num_layers`` layers, the others left to fill."""
    if t is None or len(shared) == num_layers:
        return t
    out = t.new_empty((num_layers, *t.shape[1:]))
    out[shared] = t
    return out


def _quantize_layers(k: torch.Tensor, v: torch.Tensor, codec: Codec, key_bits: int, value_bits: int):
    """Unpacked codes, scales and zero points of float keys and (already rotated) values ``[L, H, T, D]`` at the
    given widths, with ``codec``'s groups and range search (``value_zeros`` is ``None`` for symmetric values)."""
    num_layers, heads, tokens, dim = k.shape
    grid = CLIP_GRIDS[codec.clip_grid]
    kg, groups = codec.key_group, math.ceil(tokens / codec.key_group) if tokens else 0
    pad = groups * kg - tokens
    # Keys: ranges over each group of tokens, per channel. Padding repeats the last token so it changes nothing.
    # (One group, the usual case: no padding at all, so the clip search does no work on it.)
    kp = torch.cat([k, k[:, :, -1:].expand(-1, -1, pad, -1)], dim=2) if pad and groups > 1 else k
    key_scales, key_zeros = _group_ranges(kp.reshape(num_layers, heads, groups, -1, dim), 3, key_bits,
                                          False, codec.clip, real=tokens if kp is not k else None, grid=grid)
    key_codes = _codes(k, key_scales, key_zeros, key_bits, lambda t: t.repeat_interleave(kg, dim=2)[:, :, :tokens])
    vg = min(codec.value_group, dim)
    vgroups = math.ceil(dim / vg)
    vpad = vgroups * vg - dim
    vp = torch.cat([v, v[..., -1:].expand(-1, -1, -1, vpad)], dim=3) if vpad else v
    value_scales, value_zeros = _group_ranges(vp.reshape(num_layers, heads, tokens, vgroups, vg), 4, value_bits,
                                              codec.value_symmetric, codec.clip, real=dim, grid=grid)
    value_codes = _codes(v, value_scales, value_zeros, value_bits, lambda t: t.repeat_interleave(vg, dim=3)[..., :dim])
    return (key_codes, key_scales, key_zeros, value_codes, value_scales,
            None if codec.value_symmetric else value_zeros)


def dequantize_kv(
    packed: PackedKV, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values ``[L, H, T, D]`` back from their codes (the torch reference path; any device).

    Example:
        >>> k, v = torch.randn(2, 1, 8, 64), torch.randn(2, 1, 8, 64)
        >>> keys, values = dequantize_kv(quantize_kv(k, v, CODECS["int8"]))
        >>> bool((keys - k).abs().max() < 0.1)
        True
    """
    device = device or packed.key_codes.device
    tokens, dim = packed.shape[2], packed.head_dim
    runs = packed.layer_runs()
    kc = torch.cat([_unpack(c.to(device), bits, dim) for _, _, c, bits, _, _ in runs]).float()
    kg = packed.codec.key_group
    ks = packed.key_scales.to(device).float().repeat_interleave(kg, dim=2)[:, :, :tokens]
    kz = packed.key_zeros.to(device).float().repeat_interleave(kg, dim=2)[:, :, :tokens]
    vc = torch.cat([_unpack(c.to(device), bits, dim) for _, _, _, _, c, bits in runs]).float()
    vg = packed.value_group
    vs = packed.value_scales.to(device).float().repeat_interleave(vg, dim=3)[..., :dim]
    vz = packed.value_offsets().to(device).repeat_interleave(vg, dim=3)[..., :dim]
    values = torch.addcmul(vz, vc, vs)
    if packed.codec.value_transform == "hadamard":
        values = values @ hadamard_matrix(dim, device=values.device)  # orthonormal: M.T's inverse
    return torch.addcmul(kz, kc, ks).to(dtype), values.to(dtype)


@functools.lru_cache(maxsize=8)
def _hadamard_cpu(dim: int) -> torch.Tensor:
    if dim < 1 or dim & (dim - 1):
        raise ValueError(f"a Hadamard rotation needs a power-of-two head dim, not {dim}")
    b = 1 << (dim.bit_length() - 1) // 2  # dim = a * b, a in (b, 2b): the split the mount kernel uses
    a = dim // b

    def sylvester(n: int) -> torch.Tensor:
        h = torch.ones(1, 1, dtype=torch.float64)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        return h

    # Row i = the kernel's transform of e_i: X = e_i as [a, b]; H_a X; transpose; H_b (.); flatten; / sqrt(dim).
    eye = torch.eye(dim, dtype=torch.float64).reshape(dim, a, b)
    rows = (sylvester(b) @ (sylvester(a) @ eye).transpose(1, 2)).reshape(dim, dim) / math.sqrt(dim)
    return rows.float()


def hadamard_matrix(dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The orthonormal Hadamard matrix ``M`` (entries ±1/sqrt(dim), ``dim`` a power of two) that codecs with
    ``value_transform="hadamard"`` use: values are quantized as ``v @ M.T`` and come back as ``codes' @ M``.

    It is ``H_a ⊗ H_b`` followed by a fixed permutation of channels, which is what the mount kernel computes with
    contiguous butterflies only (``rope_kernel.hadamard_row``); the permutation changes nothing about the
    quantization (a value row is one group).

    Example:
        >>> m = hadamard_matrix(64)
        >>> torch.allclose(m @ m.T, torch.eye(64), atol=1e-6)
        True
    """
    return _hadamard_cpu(dim).to(device or "cpu")


def place_packed(
    dst_keys: torch.Tensor,
    dst_values: torch.Tensor,
    packed: PackedKV,
    *,
    delta: int,
    inv_freq: torch.Tensor | None,
    start: int,
    fused: bool = True,
) -> None:
    """Write ``packed`` dequantized into ``dst_*`` (``[L, H, T, D]`` views), keys moved by ``delta`` positions.

    On CPU float32 (the mount buffers) one fused pass per tensor reads the codes and writes floats, rotated for
    keys (:func:`agentmem.kv.rope_kernel.dequant_runs_into`). On CPU bfloat16 / float16 (a model run in half
    precision) the same pass writes a float32 stage that is cast into ``dst_*`` once: the kernels write float32
    only, and the torch reference took 5.6x longer (a 2,048-token k4v3hsl mount in bfloat16: 140 ms against 25 ms
    in float32). Elsewhere, or with ``fused=False``, the torch reference: dequantize, then rotate/copy. ``start``
    is the keys' encoded position (model-faithful angles).

    Example:
        >>> k, v = torch.randn(2, 1, 5, 64), torch.randn(2, 1, 5, 64)    # an entry encoded at offset 14
        >>> packed, inv_freq = quantize_kv(k, v, CODECS["int8"]), 1.0 / 10000 ** (torch.arange(0, 64, 2) / 64)
        >>> kbuf, vbuf = torch.zeros(2, 1, 1, 40, 64), torch.zeros(2, 1, 1, 40, 64)   # [L, batch, H, T, D]
        >>> p = 20                                                           # mounted at position 20
        >>> place_packed(kbuf[:, 0, :, p : p + 5], vbuf[:, 0, :, p : p + 5], packed, delta=p - 14,
        ...              inv_freq=inv_freq, start=14)
        >>> bool((vbuf[:, 0, :, p : p + 5] - v).abs().max() < 0.1), bool(kbuf[:, 0, :, :p].any())
        (True, False)
    """
    codec, tokens = packed.codec, packed.shape[2]
    if fused and tokens and _staged(dst_keys) and _staged(dst_values):
        stage_k, stage_v = torch.empty(dst_keys.shape), torch.empty(dst_values.shape)  # float32, rows contiguous
        place_packed(stage_k, stage_v, packed, delta=delta, inv_freq=inv_freq, start=start)
        dst_keys.copy_(stage_k)  # rounded once, from the float32 result
        dst_values.copy_(stage_v)
        return
    if fused and fused_dequant_applies(dst_keys) and fused_dequant_applies(dst_values) and tokens:
        cos2 = sin = None
        if delta != 0:
            half = inv_freq.numel()
            cos2, sin = _cached_tables(delta, inv_freq, torch.float32, torch.device("cpu"), start, tokens)
            if 2 * half > packed.head_dim:
                raise ValueError("rotary dims exceed the head dim")
        # Arrays, not tensors, from here on: the kernels take arrays, and numpy's slicing costs a fraction of
        # torch's (a mount places dozens of entries; the per-entry glue was ~10 % of a k4v3hsl mount).
        ks, kz, vs = (packed.key_scales.float().numpy(), packed.key_zeros.float().numpy(),
                      packed.value_scales.float().numpy())
        vz = None if packed.value_zeros is None else packed.value_zeros.float().numpy()
        runs = []
        for lo, hi, kc, kb, vc, vb in packed.layer_runs():  # one run unless the codec sets layer_bits
            # symmetric codes: the zero point is implied (implied_zero, the same float32 product)
            zero = vs[lo:hi] * np.float32(-((1 << vb) - 1) / 2) if vz is None else vz[lo:hi]
            runs.append((lo, hi, kc.numpy(), kb, ks[lo:hi], kz[lo:hi], vc.numpy(), vb, vs[lo:hi], zero))
        dequant_runs_into(dst_keys, dst_values, runs, key_group=codec.key_group, value_group=packed.value_group,
                          cos2=cos2, sin=sin, hadamard=codec.value_transform == "hadamard")
        return
    keys, values = dequantize_kv(packed, dtype=dst_keys.dtype, device=dst_keys.device)
    if delta == 0:
        dst_keys.copy_(keys)
    else:
        rerotate_keys_into(dst_keys, keys, delta, inv_freq.to(dst_keys.device), start=start)
    dst_values.copy_(values)


def _staged(dst: torch.Tensor) -> bool:
    """Whether ``dst`` (a half-precision CPU view) is filled through a float32 stage by the fused kernels."""
    if dst.dtype not in (torch.bfloat16, torch.float16) or dst.device.type != "cpu" or dst.requires_grad:
        return False
    return kernels_available()


class QuantizedEntry(EncodedEntry):
    """An :class:`EncodedEntry` whose KV are held as codes: mounting reads the codes (fewer bytes) directly.

    ``keys``/``values`` are dequantized on first access (in ``dtype``) and then kept, for code that wants floats;
    the mount never touches them (:func:`agentmem.kv.mount.Mount` places ``packed`` with the fused kernel).

    Example:
        >>> k, v = torch.randn(2, 1, 5, 64), torch.randn(2, 1, 5, 64)
        >>> q = QuantizedEntry(token_ids=torch.arange(5), packed=quantize_kv(k, v, CODECS["int4"]), offset=14,
        ...                    fingerprint="model digest", preamble_digest="preamble digest")
        >>> q.kv_shape == tuple(k.shape)
        True
    """

    def __init__(
        self, *, token_ids: torch.Tensor, packed: PackedKV, offset: int, fingerprint: str, preamble_digest: str,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        # EncodedEntry is a frozen dataclass; its generated __init__ would assign keys/values, which are lazy here.
        for name, value in (("token_ids", token_ids), ("packed", packed), ("offset", offset),
                            ("fingerprint", fingerprint), ("preamble_digest", preamble_digest), ("dtype", dtype),
                            ("_floats", None)):
            object.__setattr__(self, name, value)

    def _dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._floats is None:
            object.__setattr__(self, "_floats", dequantize_kv(self.packed, dtype=self.dtype))
        return self._floats

    @property
    def keys(self) -> torch.Tensor:  # type: ignore[override]
        return self._dequantized()[0]

    @property
    def values(self) -> torch.Tensor:  # type: ignore[override]
        return self._dequantized()[1]

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        return self.packed.shape

    def __repr__(self) -> str:
        return f"QuantizedEntry(codec={self.packed.codec.name}, shape={self.kv_shape}, offset={self.offset})"
