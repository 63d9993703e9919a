"""Atomic, pickle-free training checkpoints: safetensors tensors + a JSON header.

A checkpoint is written to a temporary file in the target directory, flushed to disk, then renamed over the old
one, so a crash mid-write leaves the previous checkpoint intact (rename is atomic on POSIX and Windows).

Example:
    >>> import tempfile, os, torch
    >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.safetensors")
    >>> save_state(path, {"k": torch.ones(2)}, {"step": 3})
    >>> tensors, meta = load_state(path)
    >>> meta["step"], tensors["k"].tolist()
    (3, [1.0, 1.0])
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load, save

from agentmem._fs import publish, write_temp

__all__ = ["load_state", "save_state"]

_META_KEY = "agentmem.checkpoint"


def save_state(path: str | os.PathLike[str], tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Write ``tensors`` and JSON-serialisable ``meta`` to ``path`` atomically."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    blob = save({k: v.detach().contiguous() for k, v in tensors.items()},
                metadata={_META_KEY: json.dumps(meta, sort_keys=True)})
    publish(write_temp(target, blob), target)


def load_state(path: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a checkpoint written by :func:`save_state`."""
    data = Path(path).read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    meta = json.loads((header.get("__metadata__") or {}).get(_META_KEY, "{}"))
    return load(data), meta
