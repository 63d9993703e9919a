"""The query tower: the embedder's own model with low-rank (LoRA) deltas merged into its top layers, for search
queries only.

Why: recall compares a *question* with *statements* ("Would Caroline pursue writing as a career?" against "I'm
still looking into counseling jobs"), and all-MiniLM-L6-v2 was trained on symmetric pairs. A tower tuned on
question → evidence pairs (``research/query_tower_ablation.py``: the bundled MiniLM, LoRA rank 8 on the top two
layers, trained on LoCoMo's dev conversations against the frozen document vectors) moves the question's vector
towards the statements that answer it. Only the query side changes, so:

- every stored vector stays valid (documents and the turn context vectors keep the base model's ``encode``),
  no store is re-embedded, and a store written before the tower still answers with it;
- the tower has the base model's shape, so the query keeps its ONNX int8 graph and its cost (~3.4 ms).

The file is safetensors, PEFT's key names (``<module>.lora_A.weight`` of shape ``(r, in)``, ``<module>.lora_B.weight``
of shape ``(out, r)``) and metadata ``format = agentmem-query-tower``, ``scale`` (LoRA's alpha / r) and ``base`` (the
model it was trained for). Merging is exact: ``W ← W + scale · B · A`` in a copy of the model.

Example:
    >>> from agentmem.embed.minilm import MiniLMEmbedder
    >>> base, question = MiniLMEmbedder().model, ["Would Caroline pursue writing as a career?"]
    >>> before = base.encode(question)
    >>> tuned = QueryTower.load(BUNDLED_TOWER).merged(base)      # a copy: the base model is untouched
    >>> bool((base.encode(question) == before).all()), bool((tuned.encode(question) == before).all())
    (True, False)
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmem.errors import InvalidInputError

BUNDLED_TOWER = Path(__file__).parent / "weights" / "query_tower.safetensors"
FORMAT = "agentmem-query-tower"
BUNDLED_BASE = "sentence-transformers/all-MiniLM-L6-v2"  # the model the bundled tower was trained for


@dataclass(frozen=True)
class QueryTower:
    """LoRA deltas for a sentence-transformers model's transformer, read from one safetensors file.

    Example:
        >>> tower = QueryTower.load(BUNDLED_TOWER)
        >>> tower.base, len(tower.digest), all(m.startswith("encoder.layer.") for m in tower.modules)
        ('sentence-transformers/all-MiniLM-L6-v2', 16, True)
    """

    path: Path
    digest: str  # the file's sha256 (first 16 hex digits): names the tower in caches
    base: str
    scale: float
    modules: tuple[str, ...]  # the transformer's module names that get a delta

    @classmethod
    def load(cls, path: str | Path) -> QueryTower:
        """Read and check a tower file's header (the tensors are read when merging).

        Example:
            >>> QueryTower.load("/nonexistent.safetensors")
            Traceback (most recent call last):
            ...
            agentmem.errors.InvalidInputError: query tower file not found: /nonexistent.safetensors
        """
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise InvalidInputError(f"query tower file not found: {path}")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta, keys = f.metadata() or {}, list(f.keys())
        except Exception as exc:  # not safetensors at all, or a truncated file
            raise InvalidInputError(f"query tower {path} is not a readable safetensors file: {exc}") from exc
        if meta.get("format") != FORMAT:
            raise InvalidInputError(f"query tower {path}: metadata format is {meta.get('format')!r}, not {FORMAT!r}")
        modules = sorted({k.rsplit(".lora_", 1)[0] for k in keys if ".lora_" in k})
        if not modules or any(f"{m}.lora_{s}.weight" not in keys for m in modules for s in "AB"):
            raise InvalidInputError(f"query tower {path}: every module needs lora_A.weight and lora_B.weight")
        try:
            scale = float(meta["scale"])
        except (KeyError, ValueError) as exc:
            raise InvalidInputError(f"query tower {path}: metadata 'scale' missing or not a number") from exc
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        return cls(path, digest, meta.get("base", ""), scale, tuple(modules))

    def merged(self, model: Any) -> Any:
        """A copy of the sentence-transformers ``model`` with the deltas added to its transformer's weights; the
        copy's transformer carries ``query_tower = digest`` (its ONNX graphs are cached under that name).

        Example:
            >>> from agentmem.embed.minilm import MiniLMEmbedder
            >>> tower = QueryTower.load(BUNDLED_TOWER)
            >>> tower.merged(MiniLMEmbedder().model)[0].query_tower == tower.digest
            True
        """
        import torch
        from safetensors.torch import load_file

        tensors = load_file(str(self.path))
        tuned = copy.deepcopy(model)
        hf = tuned[0].auto_model
        named = dict(hf.named_modules())
        for name in self.modules:
            linear = named.get(name)
            if not isinstance(linear, torch.nn.Linear):
                raise InvalidInputError(f"query tower {self.path}: the model has no linear layer {name!r}")
            delta = self.scale * tensors[f"{name}.lora_B.weight"] @ tensors[f"{name}.lora_A.weight"]
            if delta.shape != linear.weight.shape:
                raise InvalidInputError(f"query tower {self.path}: {name} delta is {tuple(delta.shape)}, the layer "
                                        f"{tuple(linear.weight.shape)} (trained for {self.base or 'another model'})")
            with torch.no_grad():
                linear.weight += delta.to(linear.weight.dtype)
        hf.eval()
        tuned[0].query_tower = self.digest
        return tuned


def save_tower(path: str | Path, deltas: dict[str, tuple[Any, Any]], *, scale: float, base: str) -> Path:
    """Write ``deltas`` (module name → (A of shape (r, in), B of shape (out, r)) tensors) as a tower file.

    Example:
        >>> import torch
        >>> p = save_tower("/tmp/t.safetensors", {"encoder.layer.5.output.dense": (torch.zeros(2, 1536),
        ...                torch.zeros(384, 2))}, scale=2.0, base=BUNDLED_BASE)
        >>> QueryTower.load(p).modules
        ('encoder.layer.5.output.dense',)
    """
    from safetensors.torch import save_file

    tensors = {}
    for name, (a, b) in deltas.items():
        tensors[f"{name}.lora_A.weight"] = a.detach().float().contiguous()
        tensors[f"{name}.lora_B.weight"] = b.detach().float().contiguous()
    save_file(tensors, str(path), metadata={"format": FORMAT, "scale": repr(float(scale)), "base": base})
    return Path(path)


__all__ = ["BUNDLED_BASE", "BUNDLED_TOWER", "FORMAT", "QueryTower", "save_tower"]
