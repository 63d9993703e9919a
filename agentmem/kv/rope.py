"""Exact re-positioning of cached keys under rotary position embeddings, and which models allow it.

RoPE rotates each (i, i + d/2) pair of a key (Llama's ``rotate_half`` convention) by angle ``p * inv_freq[i]``.
Rotations compose, so a key cached at position p moves to p + delta by one more rotation of ``delta * inv_freq``:
no model forward needed. The model's cos/sin are also multiplied by ``attention_scaling`` (YaRN); that factor is
already inside the cached key and a rotation preserves it, so re-rotation uses the *unscaled* cos/sin on purpose.

Example:
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> model, _ = tiny_causal_lm("llama")
    >>> inv_freq = rotary_inv_freq(model)
    >>> keys = torch.randn(1, 4, 8, 2 * inv_freq.numel())   # [batch, heads, tokens, head dim]
    >>> moved = rerotate_keys(keys, 17, inv_freq)            # keys were encoded 17 positions earlier
    >>> torch.allclose(rerotate_keys(moved, -17, inv_freq), keys, atol=1e-5)   # rotations compose
    True
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

from agentmem.errors import UnsupportedModelError
from agentmem.kv.rope_kernel import fused_rotation_applies, rotate_into

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "SUPPORTED_ROPE_TYPES",
    "kv_support",
    "require_kv_support",
    "rerotate_keys",
    "rerotate_keys_into",
    "rotary_inv_freq",
    "rotation_tables",
]

# Families known to apply RoPE with rotate_half to every layer's keys. Others (GPT-J's interleaved pairs, learned
# positions, ALiBi) need different maths, so they are refused rather than silently mounted wrong.
SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3", "olmo", "olmo2", "granite"})
# Static RoPE variants: inv_freq does not depend on the sequence length, so a rotation delta is exact.
# "dynamic" (NTK) and "longrope" change the frequencies with the length: a cached key cannot be moved exactly.
SUPPORTED_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


def _text_config(model: Any) -> Any:
    config = model.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def rotary_inv_freq(model: Any) -> torch.Tensor:
    """The model's own rotary ``inv_freq`` (float32, on the model's device); one module must own it."""
    found = [m.inv_freq for name, m in model.named_modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)]
    if not found:
        raise UnsupportedModelError(f"{type(model).__name__} has no rotary embedding module with inv_freq")
    first = found[0]
    if any(f.shape != first.shape or not torch.equal(f, first) for f in found[1:]):
        raise UnsupportedModelError(f"{type(model).__name__} uses different rotary frequencies per layer")
    return first.detach().float()


def kv_support(model: Any) -> str | None:
    """``None`` if this model's cached keys can be re-positioned exactly, else the reason why not.

    Text mode works for every causal LM; only KV mounting needs this. Example:
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> kv_support(tiny_causal_lm("llama")[0]) is None
        True
        >>> print(kv_support(tiny_causal_lm("gpt2")[0]))
        GPT2LMHeadModel (model_type gpt2) has learned absolute position embeddings (no RoPE), ...
    """
    config = _text_config(model)
    name = type(model).__name__
    model_type = getattr(config, "model_type", "?")
    if getattr(config, "is_encoder_decoder", False):
        return f"{name} is an encoder-decoder model; only decoder-only causal LMs can mount KV"
    rope = getattr(config, "rope_parameters", None)
    if rope is None:
        return (
            f"{name} (model_type {model_type}) has learned absolute position embeddings (no RoPE), so cached keys "
            "cannot be moved to a new position; use mode='text' with this model"
        )
    rope = dict(rope)
    if "rope_type" not in rope and rope and all(isinstance(v, dict) for v in rope.values()):
        return (
            f"{name} (model_type {model_type}) uses different RoPE settings per layer type ({sorted(rope)}), so one "
            "rotation cannot move every layer's keys; KV mounting is not supported, use mode='text'"
        )
    layer_types = getattr(config, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        return (
            f"{name} (model_type {model_type}) has sliding-window attention layers ({sorted(set(layer_types))}): "
            "a mounted entry's keys were computed against a different window than in-context keys would be, so "
            "mounting would not match re-encoding; KV mounting is not supported, use mode='text'"
        )
    window = getattr(config, "sliding_window", None)
    if window and (getattr(config, "use_sliding_window", None) is not False or model_type == "mistral"):
        return (
            f"{name} (model_type {model_type}) uses sliding-window attention (window {window}); a mounted cache "
            "would not match full re-encoding; KV mounting is not supported, use mode='text'"
        )
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"{name} (model_type {model_type}) is not a RoPE family agentmem has verified for exact re-rotation"
    rope_type = rope.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        return (
            f"{name} uses rope_type {rope_type!r}, whose frequencies depend on the sequence length, so cached keys "
            f"cannot be re-positioned exactly (supported: {sorted(SUPPORTED_ROPE_TYPES)})"
        )
    try:
        inv_freq = rotary_inv_freq(model)
    except UnsupportedModelError as exc:
        return str(exc)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if 2 * inv_freq.numel() > head_dim:
        return f"{name}: rotary dims {2 * inv_freq.numel()} exceed head dim {head_dim}"
    return None


def require_kv_support(model: Any) -> None:
    """Raise :class:`UnsupportedModelError` with the reason if ``kv_support`` refuses the model."""
    reason = kv_support(model)
    if reason is not None:
        raise UnsupportedModelError(reason)


def rotation_tables(
    delta: int, inv_freq: torch.Tensor, dtype: torch.dtype, *, start: int | None = None, length: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of the rotation that moves keys by ``delta`` positions, shape ``[half]`` or ``[length, half]``.

    Without ``start``: the exact angle ``delta * inv_freq`` (float64), one row for all tokens.

    With ``start`` (the position of the first of ``length`` keys): per-token angles that reproduce the model's own
    float32 angle rounding, i.e. ``fl32((start+t+delta) * f) - fl32((start+t) * f)`` evaluated in float64. A key
    moved this way equals (up to float noise) the key the model computes when it encodes the token at the new
    position, even thousands of positions away, where fp32 angle rounding alone would differ by ~1e-4.
    """
    f32 = inv_freq.to(torch.float32)
    if start is None:
        angles = float(delta) * f32.to(torch.float64)
    else:
        old = torch.arange(start, start + length, dtype=torch.float32, device=f32.device)[:, None] * f32
        new = torch.arange(start + delta, start + delta + length, dtype=torch.float32, device=f32.device)[:, None] * f32
        angles = new.to(torch.float64) - old.to(torch.float64)
    return angles.cos().to(dtype), angles.sin().to(dtype)


class _TableMemo:
    """A small LRU of rotation tables bounded by bytes (tables grow with the entry length), thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple, make) -> tuple[torch.Tensor, torch.Tensor]:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        value = make()
        size = sum(t.numel() * t.element_size() for t in value)
        with self._lock:
            if key not in self._items and size <= self.max_bytes:
                self._items[key] = value
                self._bytes += size
                while self._bytes > self.max_bytes:
                    _, old = self._items.popitem(last=False)
                    self._bytes -= sum(t.numel() * t.element_size() for t in old)
        return value


# 8 MB: ~170 tables of a 128-token SmolLM2 entry (48 KB each), plenty for the entries of a few mounts.
_TABLES = _TableMemo(8 << 20)


def _cached_tables(
    delta: int, inv_freq: torch.Tensor, dtype: torch.dtype, device: torch.device, start: int | None, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cat(cos, cos), sin)`` from :func:`rotation_tables`, memoised: mounting the same entries again (same
    offsets, lengths, deltas) reuses them instead of rebuilding eight small tensors per entry (~0.3 ms each).
    Keyed on the frequency *values*, so another model's ``inv_freq`` never hits a stale table. Read-only."""
    start = None if start is None else int(start)
    key = (int(delta), tuple(inv_freq.tolist()), dtype, str(device), start, int(length))

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        # Built on the CPU (float64 angles: MPS has no float64) and moved once; the memo keeps the device copy.
        cos, sin = rotation_tables(delta, inv_freq.to("cpu"), dtype, start=start, length=length)
        cos2 = torch.cat((cos, cos), dim=-1)
        return cos2.to(device, non_blocking=True), sin.to(device, non_blocking=True)

    return _TABLES.get(key, make)


def rerotate_keys_into(
    out: torch.Tensor, keys: torch.Tensor, delta: int, inv_freq: torch.Tensor, *, start: int | None = None
) -> torch.Tensor:
    """Write ``keys`` (``[..., T, head_dim]``) moved by ``delta`` positions into ``out``; returns ``out``.

    ``start`` is the keys' current position (enables model-faithful per-token angles, see :func:`rotation_tables`).
    CPU float32 runs one fused pass (:mod:`agentmem.kv.rope_kernel`); other dtypes and devices use torch ops.
    Vectorised over every leading dim, so all layers and heads of an entry move in one call; ``out`` may be a
    strided view into a larger buffer (that is how mounting avoids an extra copy). ``out`` must not alias ``keys``.
    """
    half = inv_freq.numel()
    rot = 2 * half
    # Tables in the output dtype: fp16/bf16 stored keys are rotated and widened to an fp32 cache in one pass.
    cos2, sin = _cached_tables(delta, inv_freq, out.dtype, keys.device, start, keys.shape[-2])
    if fused_rotation_applies(out, keys):  # CPU float32: one read and one write per key (see rope_kernel)
        rotate_into(out, keys, cos2, sin)
        return out
    # The torch path (any device/dtype; the reference for the fused kernel).
    # rotate_half convention: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). One full-width multiply then two
    # half-width fused multiply-adds, all written in place into ``out``: no temporaries, and measured ~25% faster
    # than four half-width passes (the full-width pass streams contiguous rows).
    torch.mul(keys[..., :rot], cos2, out=out[..., :rot])
    out[..., :half].addcmul_(keys[..., half:rot], sin, value=-1.0)
    out[..., half:rot].addcmul_(keys[..., :half], sin)
    if rot < keys.shape[-1]:  # partial rotary: the tail dims carry no position
        out[..., rot:].copy_(keys[..., rot:])
    return out


def rerotate_keys(
    keys: torch.Tensor, delta: int, inv_freq: torch.Tensor, *, start: int | None = None
) -> torch.Tensor:
    """Return a new tensor: ``keys`` (any leading dims, last two ``[tokens, head_dim]``) moved by ``delta``.

    The input is never modified; ``delta`` may be negative. Pass ``start`` (the keys' current position) to match
    the model's own float32 angles exactly. Example:
        >>> inv_freq = 1.0 / 10000 ** (torch.arange(0, 64, 2) / 64)
        >>> keys = torch.randn(2, 1, 5, 64)                       # encoded at positions 14..18
        >>> moved = rerotate_keys(keys, 120, inv_freq, start=14)  # now at 134..138
        >>> moved.shape == keys.shape and not torch.equal(moved, keys)
        True
    """
    if delta == 0:
        return keys.clone()
    return rerotate_keys_into(torch.empty_like(keys), keys, delta, inv_freq, start=start)
