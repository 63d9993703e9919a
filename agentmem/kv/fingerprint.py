"""Identity of a (model, tokenizer, dtype): KV made under one fingerprint is only valid under the same one.

The fingerprint is a frozen value object whose ``digest`` (sha256 of its canonical JSON) is stored in every KV
blob. It is stable across processes (no Python ``hash()``, no dict-order dependence) and changes when the
architecture, RoPE settings, dtype, weights or tokenizer change.

Weights digest: sha256 over every state-dict entry's name, shape and **all** bytes of its values rounded to
bfloat16 (tied tensors are hashed once and referenced by name). Rounding to the coarsest dtype agentmem runs in
makes the digest the same for one checkpoint loaded in float32 or bfloat16, so the weights digest names *which
weights* and the separate ``dtype`` field names *which precision*; a blob whose fingerprint differs in ``dtype``
only is convertible (:meth:`ModelFingerprint.convertible_to`): its KV are cast on load instead of re-encoded.
(A float16 load can round differently; its blobs are then simply re-encoded.) Computed once per model object
and reused while no parameter is modified in place (~0.5 s for SmolLM2-135M on a shared 2-core CPU).

Example:
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> fp = model_fingerprint(*tiny_causal_lm("llama"))
    >>> ModelFingerprint.from_dict(fp.to_dict()) == fp
    True
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import weakref
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["FINGERPRINT_VERSION", "ModelFingerprint", "model_fingerprint", "tokenizer_digest", "weights_digest"]

# 2: weights digest over bfloat16-rounded values (dtype-independent), see the module docstring.
FINGERPRINT_VERSION = 2


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


@dataclass(frozen=True)
class ModelFingerprint:
    """Everything that decides what a model's KV cache looks like and means."""

    architecture: str
    model_type: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rope: str  # canonical JSON of the rotary settings ("null" for models without RoPE)
    dtype: str
    tokenizer_digest: str
    weights_digest: str
    version: int = FINGERPRINT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelFingerprint:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown fingerprint fields: {sorted(unknown)}")
        return cls(**data)

    def to_json(self) -> str:
        return _canonical(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> ModelFingerprint:
        return cls.from_dict(json.loads(text))

    @functools.cached_property
    def digest(self) -> str:
        """sha256 hex of the canonical JSON; what blobs store and compare.

        Cached: the object is frozen, and every blob load compares it (re-serialising cost ~0.1 ms per call).
        """
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def differences(self, other: ModelFingerprint) -> list[str]:
        """Names of the fields that differ (safe to log: no weights, no KV)."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(other, f.name)]

    def convertible_to(self, other: ModelFingerprint) -> bool:
        """Whether KV made under ``self`` may be mounted by ``other`` after a dtype cast: same weights, tokenizer
        and architecture, another precision only (e.g. blobs of a float32 run mounted by a bfloat16 GPU run).

        Example:
            >>> from agentmem.kv.testing import tiny_causal_lm
            >>> fp32 = model_fingerprint(*tiny_causal_lm("llama"))
            >>> fp32.convertible_to(dataclasses.replace(fp32, dtype="bfloat16"))
            True
            >>> fp32.convertible_to(model_fingerprint(*tiny_causal_lm("llama", seed=1)))    # other weights
            False
        """
        return self.differences(other) == ["dtype"]


# Caches keyed on the object; the weights entry also records each tensor's version counter, which torch bumps on
# every in-place write, so an optimizer step or load_state_dict invalidates it.
_WEIGHTS_CACHE: weakref.WeakKeyDictionary[Any, tuple[tuple, str]] = weakref.WeakKeyDictionary()
_TOKENIZER_CACHE: weakref.WeakKeyDictionary[Any, tuple[int, str]] = weakref.WeakKeyDictionary()


def _weights_key(model: torch.nn.Module) -> tuple:
    return tuple((n, t.data_ptr(), t._version, t.dtype) for n, t in model.state_dict(keep_vars=True).items())


def _digest_kind(t: torch.Tensor) -> str:
    # floating tensors of any precision are hashed alike (as bfloat16); integer buffers keep their own dtype
    return "float" if t.is_floating_point() else str(t.dtype)


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 hex over names, shapes and bfloat16-rounded bytes of every state-dict tensor (tied ones once).

    Example:
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> model, _ = tiny_causal_lm("llama")
        >>> digest = weights_digest(model)
        >>> digest == weights_digest(model.to(torch.bfloat16)), digest == weights_digest(tiny_causal_lm("llama", 1)[0])
        (True, False)
    """
    key = _weights_key(model)
    cached = _WEIGHTS_CACHE.get(model)
    if cached is not None and cached[0] == key:
        return cached[1]
    h = hashlib.sha256()
    seen: dict[tuple[int, tuple[int, ...]], str] = {}
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach()
        h.update(f"{name}|{_digest_kind(t)}|{tuple(t.shape)}|".encode())
        ident = (t.data_ptr(), tuple(t.shape))
        if ident in seen:  # tied weights (e.g. lm_head = embed_tokens): same bytes, hash a reference
            h.update(f"tied:{seen[ident]}".encode())
            continue
        seen[ident] = name
        if t.is_floating_point():  # precision-independent: see the module docstring
            t = t.to(torch.bfloat16)
        flat = t.to("cpu").contiguous().reshape(-1).view(torch.uint8)
        h.update(memoryview(flat.numpy()))
    digest = h.hexdigest()
    _WEIGHTS_CACHE[model] = (key, digest)
    return digest


def _tokenizer_payload(tokenizer: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "chat_template": getattr(tokenizer, "chat_template", None),
        "special_tokens": {k: str(v) for k, v in sorted((tokenizer.special_tokens_map or {}).items())},
        "added_tokens": sorted(
            (int(i), str(t), bool(getattr(t, "special", False)))
            for i, t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items()
        ),
    }
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # The full tokenizer.json (vocab, merges, normalizer, pre-tokenizer), parsed and re-dumped with sorted keys
        # so Rust hash-map order cannot change the digest. Padding/truncation are call-time state, not identity.
        spec = json.loads(backend.to_str())
        spec.pop("padding", None)
        spec.pop("truncation", None)
        payload["backend"] = spec
    else:
        payload["vocab"] = sorted(tokenizer.get_vocab().items())
    return payload


def tokenizer_digest(tokenizer: Any) -> str:
    """sha256 hex of the tokenizer's vocab/merges, special tokens and chat template."""
    template_key = hash(getattr(tokenizer, "chat_template", None))  # in-process only: detects a changed template
    try:
        cached = _TOKENIZER_CACHE.get(tokenizer)
    except TypeError:  # not weak-referenceable
        cached = None
    if cached is not None and cached[0] == template_key:
        return cached[1]
    digest = hashlib.sha256(_canonical(_tokenizer_payload(tokenizer)).encode()).hexdigest()
    try:
        _TOKENIZER_CACHE[tokenizer] = (template_key, digest)
    except TypeError:
        pass
    return digest


def _rope_settings(config: Any) -> Any:
    rope = getattr(config, "rope_parameters", None)
    if rope is None:
        return None
    return {k: v for k, v in dict(rope).items()}


def model_fingerprint(model: torch.nn.Module, tokenizer: Any) -> ModelFingerprint:
    """Fingerprint a loaded ``(model, tokenizer)``; ~0.5 s the first time for 135M fp32 params, then cached.

    Example:
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> model, tokenizer = tiny_causal_lm("llama")
        >>> fp = model_fingerprint(model, tokenizer)
        >>> len(fp.digest)
        64
    """
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    heads = int(getattr(config, "num_attention_heads", None) or getattr(config, "n_head"))
    hidden = int(getattr(config, "hidden_size", None) or getattr(config, "n_embd"))
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    layers = int(getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer"))
    return ModelFingerprint(
        architecture=type(model).__name__,
        model_type=str(getattr(config, "model_type", "")),
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=int(config.vocab_size),
        rope=_canonical(_rope_settings(config)),
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        tokenizer_digest=tokenizer_digest(tokenizer),
        weights_digest=weights_digest(model),
    )
