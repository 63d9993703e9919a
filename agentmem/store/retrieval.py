"""Hybrid retrieval: dense (Chroma) and lexical (FTS5/BM25) candidates fused by reciprocal rank.

Reciprocal-rank fusion needs no score calibration between retrievers, which is why it is the default:
cosine similarities and BM25 scores live on different scales that change with corpus and query.

Example:
    >>> rrf([["a", "b"], ["b", "c"]])[0][0]
    'b'
"""

from __future__ import annotations

from collections.abc import Sequence

RRF_K = 60  # the constant from Cormack et al. (2009); not tuned here


def rrf(rankings: Sequence[Sequence[str]], *, weights: Sequence[float] | None = None, k: int = RRF_K) -> list[tuple[str, float]]:
    """Fuse ranked id lists: score(id) = sum_i w_i / (k + rank_i(id)), best first."""
    weights = weights or [1.0] * len(rankings)
    scores: dict[str, float] = {}
    for ranking, w in zip(rankings, weights):
        for rank, entry_id in enumerate(ranking, start=1):
            scores[entry_id] = scores.get(entry_id, 0.0) + w / (k + rank)
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))


__all__ = ["RRF_K", "rrf"]
