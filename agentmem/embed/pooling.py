"""The fast query paths' shared pieces: whether a model is Transformer → mean Pooling (→ Normalize), that pipeline
computed directly, and a forward pass held to one thread.

Example:
    >>> with single_thread():
    ...     pass
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np


def is_mean_pooled(model: Any) -> bool:
    """Whether a sentence-transformers model is Transformer → mean Pooling (→ Normalize), the pipeline the fast
    query paths reproduce exactly."""
    names = [type(m).__name__ for m in model]
    if names[:2] != ["Transformer", "Pooling"] or names[2:] not in ([], ["Normalize"]):
        return False
    return getattr(model[1], "pooling_mode", None) == "mean" and hasattr(model[0], "auto_model")


def mean_pooled_forward(model: Any, texts: Sequence[str]) -> np.ndarray | None:
    """The same embeddings as ``model.encode`` for a Transformer → mean Pooling → Normalize pipeline, computed
    directly (None for any other pipeline).

    A query is a handful of tokens, so sentence-transformers' per-call bookkeeping (mode switches over every
    submodule, feature dicts) costs a fifth of the forward pass itself; recall latency is dominated by it.
    """
    import torch

    if not is_mean_pooled(model):
        return None
    transformer = model[0]
    hf = transformer.auto_model
    if hf.training:
        hf.eval()  # dropout off, as encode() would set it
    batch = transformer.tokenizer(list(texts), padding=True, truncation=True,
                                  max_length=model.max_seq_length, return_tensors="pt")
    with torch.inference_mode():
        hidden = hf(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        pooled = torch.nn.functional.normalize(pooled, dim=-1)
    return pooled.float().numpy()


@contextlib.contextmanager
def single_thread() -> Any:
    """Run a tiny forward pass (a query) on one thread.

    Intra-op parallelism does not pay for a handful of tokens, and on a busy CPU a 2-thread pass waits for both
    threads to be scheduled: measured here under load, 429 ms (2 threads) vs 57 ms (1 thread) per query.
    """
    import torch

    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


__all__ = ["is_mean_pooled", "mean_pooled_forward", "single_thread"]
