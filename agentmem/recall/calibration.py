"""Calibrated recall scores: the probability that a recalled memory is relevant to the query, in [0, 1].

The ranking score (:func:`agentmem.recall.retrieval.rank_scores`) is relative — scaled inside each query's
candidate pool — so it cannot say whether anything matched at all: with one stored item, every query's only
candidate is "the best". The calibrated score adds what is absolute about the query's evidence, the best cosine
similarity and the best BM25 score in its pool, in a logistic model (Platt scaling)::

    P(relevant) = sigmoid(w_rank · rank_score + w_dense · best_cosine + w_lexical · ln(1 + best_bm25) + bias)

The query-level terms are the same for every hit of one query, so the calibrated score keeps the ranking's order
(``min_score`` cuts a prefix), while an unrelated query — low cosine, no word in common — scores low whatever its
rank. The weights were fitted by ``benchmarks/locomo.py --folds 5`` on four conversations at a time (every
question asked of its own conversation and, as unrelated queries, of another one); the defaults are the median
of the five fits, and each fit's calibration is measured on the fifth conversation (research/notes/retrieval-lab-notes.md).

Example:
    >>> cal = Calibration()
    >>> cal(1.5, best_dense=0.65, best_lexical=12.0) > cal(0.6, best_dense=0.08, best_lexical=0.0)
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agentmem.recall.weights_file import bundled

_DEFAULTS = bundled("calibration")


@dataclass(frozen=True)
class Calibration:
    """Logistic map from (rank score, best cosine, best BM25) to P(relevant).

    Example:
        >>> 0.0 <= Calibration()(0.0, best_dense=0.0, best_lexical=0.0) <= 1.0
        True
    """

    # the bundled weights file's "calibration" group (agentmem/recall/weights/ranking.json, with its provenance):
    # the median of the five fold fits of `benchmarks/locomo.py --folds 5` (each fitted on four conversations), refitted
    # in session 6 with the list-question rule, exact dense pools and int8 query vectors in the rank score: held-out
    # ECE 0.0095 / Brier 0.038 against the previous constants' 0.0262 / 0.0436 on the same folds (research/notes/retrieval-lab-notes.md)
    # checked in session 10 against 9e5f0a4's head under RetrievalParams() (research/calibration_check.py): held-out
    # ECE 0.0085 / Brier 0.039; the median procedure nested 0.0082 (a tie), locomo.py's fold median 0.0118: kept
    w_rank: float = _DEFAULTS["w_rank"]
    w_dense: float = _DEFAULTS["w_dense"]
    w_lexical: float = _DEFAULTS["w_lexical"]
    bias: float = _DEFAULTS["bias"]

    def __call__(self, rank_score: float, *, best_dense: float, best_lexical: float) -> float:
        z = (self.w_rank * rank_score + self.w_dense * best_dense
             + self.w_lexical * math.log1p(max(best_lexical, 0.0)) + self.bias)
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0

    @staticmethod
    def features(rank_score: float, best_dense: float, best_lexical: float) -> list[float]:
        """The model's inputs, in the order of :meth:`fit`'s columns."""
        return [rank_score, best_dense, math.log1p(max(best_lexical, 0.0))]

    @classmethod
    def fit(cls, x: Sequence[Sequence[float]], y: Sequence[int], *, l2: float = 1e-3, steps: int = 50) -> Calibration:
        """Maximum-likelihood logistic regression (Newton's method, a little L2 for stability).

        ``x`` rows are :meth:`features`; ``y`` is 1 for a relevant hit, 0 otherwise.

        Example:
            >>> cal = Calibration.fit([[1.5, 0.7, 2.5], [0.4, 0.2, 0.0]] * 20, [1, 0] * 20)
            >>> cal(1.5, best_dense=0.7, best_lexical=11.0) > 0.9
            True
        """
        w = fit_logistic(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64), l2=l2, steps=steps)
        return cls(*(round(float(v), 3) for v in w))


def fit_logistic(x: np.ndarray, y: np.ndarray, *, l2: float, steps: int = 50,
                 nonneg: Sequence[int] = ()) -> np.ndarray:
    """Maximum-likelihood logistic regression by Newton's method with an L2 penalty on the weights (not the bias):
    the weights of ``x``'s columns, then the bias. Shared by the calibration and the learned head's fits.
    ``nonneg``: columns whose weight is held >= 0 (projected Newton with an active set: a held weight at 0 whose
    gradient pushes it below 0 is left out of the step, then held weights are clamped at 0).

    Example:
        >>> w = fit_logistic(np.array([[0.0], [1.0], [0.0], [1.0]]), np.array([0.0, 1.0, 0.0, 1.0]), l2=1.0)
        >>> bool(w[0] > 0 > w[1])
        True
        >>> x = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
        >>> w = fit_logistic(x, np.array([1.0, 0.0, 1.0, 0.0]), l2=1.0, nonneg=[0])
        >>> bool(w[0] == 0.0 and w[1] > 0)
        True
    """
    design = np.column_stack([x, np.ones(len(x))])
    d = design.shape[1]
    w = np.zeros(d)
    reg = l2 * np.eye(d)
    reg[-1, -1] = 0.0  # the bias is not shrunk
    held = np.zeros(d, dtype=bool)
    held[list(nonneg)] = True
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ w, -30, 30)))
        grad = design.T @ (p - y) + reg @ w
        hess = (design * (p * (1 - p))[:, None]).T @ design + reg
        free = ~(held & (w <= 0) & (grad > 0))
        step = np.zeros(d)
        step[free] = np.linalg.solve(hess[np.ix_(free, free)], grad[free])
        new = w - step
        new[held] = np.maximum(new[held], 0.0)
        moved = float(np.abs(new - w).max())
        w = new
        if moved < 1e-8:
            break
    return w


__all__ = ["Calibration", "fit_logistic"]
