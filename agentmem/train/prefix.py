"""A trained KV prefix, its training record, safetensors bytes, and the staleness rule.

A trained entry is a bank entry like any other: per-layer keys/values for ``p`` positions that start at
``offset`` (the shared preamble's length), mounted after the preamble and re-rotated exactly if mounted elsewhere.
What sets it apart is the ``record``: which document and which model it stands for. If either changed, the
prefix no longer means the document and must not be mounted until retrained.

Bytes are safetensors (never pickle): tensors ``keys``, ``values`` ``(layers, kv_heads, p, head_dim)`` and
``token_ids`` (the document tokens the prefix was initialised from, informational), plus metadata
``agentmem.format``, ``offset`` and ``record`` (JSON).

Example:
    >>> import torch
    >>> k = torch.zeros(2, 2, 4, 16)
    >>> tp = TrainedPrefix(k, k.clone(), [1, 2, 3, 4], offset=0, record={"document_sha256": document_digest("x")})
    >>> TrainedPrefix.from_bytes(tp.to_bytes()).tokens
    4
    >>> is_stale(tp.record, "x", None) is None
    True
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import load, save

from agentmem.errors import BlobCorruptedError, StaleEntryError

__all__ = ["FORMAT", "TrainedPrefix", "check_fresh", "document_digest", "is_stale"]

FORMAT = "agentmem.trained-prefix/1"


def document_digest(document: str) -> str:
    """sha256 hex of the document's UTF-8 bytes: the identity a trained entry is bound to."""
    return hashlib.sha256(document.encode("utf-8")).hexdigest()


@dataclass
class TrainedPrefix:
    """Per-layer KV of a trained prefix plus its training record.

    ``keys``/``values``: ``(layers, kv_heads, p, head_dim)``, positions ``[offset, offset + p)``.
    ``record``: ``steps``, ``losses``, ``document_sha256``, ``tokens`` (p), ``seed``, ``lr``,
    ``model_fingerprint``, ``wall_seconds``, ``created_at`` and the other hyperparameters.
    """

    keys: torch.Tensor
    values: torch.Tensor
    token_ids: list[int]
    offset: int
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        """Number of KV positions (p)."""
        return int(self.keys.shape[2])

    def kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys, self.values

    def to_entry(self) -> Any:
        """This prefix as an :class:`agentmem.kv.EncodedEntry`, so the engine's codec and mounting take it as is.

        ``token_ids`` are the document tokens the prefix was initialised from (one id per KV position, as the
        codec requires); they are *not* what the KV encodes after training, so the engine must neither compare
        them with a memory's text nor recompute them ("kv+fix"). The record does not fit the codec's header:
        store it in the entry's metadata.
        """
        from agentmem.kv.types import EncodedEntry

        return EncodedEntry(
            token_ids=torch.tensor(self.token_ids, dtype=torch.int64), keys=self.keys, values=self.values,
            offset=int(self.offset), fingerprint=str(self.record.get("model_fingerprint", "")),
            preamble_digest=str(self.record.get("preamble_digest", "")))

    @classmethod
    def from_entry(cls, entry: Any, record: dict[str, Any]) -> TrainedPrefix:
        """Inverse of :meth:`to_entry` given the record kept in metadata."""
        return cls(entry.keys, entry.values, entry.token_ids.tolist(), int(entry.offset), dict(record))

    def to_bytes(self) -> bytes:
        """safetensors bytes; the record travels as JSON in the header metadata."""
        tensors = {
            "keys": self.keys.detach().contiguous(),
            "values": self.values.detach().contiguous(),
            "token_ids": torch.tensor(self.token_ids, dtype=torch.int64),
        }
        meta = {"agentmem.format": FORMAT, "offset": str(int(self.offset)),
                "record": json.dumps(self.record, sort_keys=True)}
        return save(tensors, metadata=meta)

    @classmethod
    def from_bytes(cls, data: bytes) -> TrainedPrefix:
        """Inverse of :meth:`to_bytes` (bit-exact); raises :class:`BlobCorruptedError` on anything else."""
        try:
            tensors = load(data)
            meta = _metadata(data)
        except Exception as exc:  # safetensors raises several types for truncated/garbled input
            raise BlobCorruptedError(f"not a trained-prefix blob: {exc}") from exc
        if meta.get("agentmem.format") != FORMAT or not {"keys", "values", "token_ids"} <= tensors.keys():
            raise BlobCorruptedError(f"not a trained-prefix blob (format {meta.get('agentmem.format')!r})")
        return cls(tensors["keys"], tensors["values"], tensors["token_ids"].tolist(), int(meta["offset"]),
                   json.loads(meta.get("record", "{}")))


def _metadata(data: bytes) -> dict[str, str]:
    # safetensors layout: 8-byte little-endian header length, then the JSON header; metadata is "__metadata__".
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    return header.get("__metadata__", {}) or {}


def is_stale(record: dict[str, Any], document: str | None, fingerprint_digest: str | None, *,
             preamble_digest: str | None = None) -> str | None:
    """Why a trained entry must not be mounted, or ``None`` when it is current.

    ``document=None`` / ``fingerprint_digest=None`` / ``preamble_digest=None`` skip that check (e.g. the caller
    only knows the model). A changed preamble (system prompt) also makes the prefix stale: it was trained to
    follow that exact preamble.

    Example:
        >>> is_stale({"document_sha256": document_digest("a"), "model_fingerprint": "m1"}, "b", "m1")[:16]
        'document changed'
    """
    want_doc = record.get("document_sha256")
    if document is not None and want_doc != document_digest(document):
        now = document_digest(document)
        return f"document changed since training (sha256 {str(want_doc)[:12]}… ≠ {now[:12]}…)"
    want_model = record.get("model_fingerprint")
    if fingerprint_digest is not None and want_model != fingerprint_digest:
        return f"model changed since training (fingerprint {str(want_model)[:12]}… ≠ {fingerprint_digest[:12]}…)"
    want_pre = record.get("preamble_digest")
    if preamble_digest is not None and want_pre != preamble_digest:
        return "prompt preamble changed since training"
    return None


def check_fresh(record: dict[str, Any], document: str | None, fingerprint_digest: str | None, *,
                preamble_digest: str | None = None) -> None:
    """Raise :class:`~agentmem.errors.StaleEntryError` if :func:`is_stale` finds a reason."""
    reason = is_stale(record, document, fingerprint_digest, preamble_digest=preamble_digest)
    if reason is not None:
        raise StaleEntryError(f"trained entry is stale: {reason}; retrain it before mounting")
