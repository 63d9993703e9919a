"""The recall score: how likely a recalled memory answers the query, in [0, 1], read from that query and that memory
alone.

The ranking score (:func:`agentmem.recall.retrieval.rank_scores`) is relative — scaled inside each query's candidate
pool, lifted by the memory's neighbours and session — so it orders well but cannot say whether anything matched at
all: with one stored item, every query's only candidate is "the best". ``Hit.score`` is therefore computed apart
from the order, from two features of the (query, memory) pair that do not depend on the other candidates, on the
store's size or on its word statistics::

    cosine  = the query's vector (through the query tower) · the vector of the memory's own text, without the
              time and speaker its memory line carries (stored on its row)              (Hit.scores["text_dense"])
    overlap = the share of the query's content words the memory's text holds, by a crude stem, the memory's own
              speaker's name left out of the query                                           (Hit.scores["overlap"])
    score   = sigmoid(w_dense · cosine + w_overlap · overlap + w_both · cosine · overlap + bias)

so a memory scores the same in a 1-item store and a 100k-entry one, stored at any minute of any day (the time in
the line moved a short memory's cosine by up to 0.1: "I moved to Lyon last spring." scored 0.47-0.58 for "Which
city did I move to?" depending on when it was stored), and a threshold (``min_score``,
``MemoryConfig.mount_min_score``) means the same for every question and every store. The rank order stays free to
use every other signal; ``min_score`` keeps the hits at or above it in rank order (no longer always a prefix).
A row stored without a text vector (by a version that kept them only with consolidation on) is scored from its
memory line's cosine instead.

The weights (the bundled weights file's "calibration" group, with its provenance) are fitted by
``research/fit_scores.py`` on three sources with equal weight: LoCoMo dev and REALTALK dev (each question's evidence
turns among its top 10, against the top 10 of another conversation asked the same question with the speakers'
names swapped for that conversation's), and small stores of facts, preferences, tool outputs and documents
(:mod:`research.score_stores`), both classes weighted equally: a score of 0.5 means "as likely to answer the query as
not", with no prior on how many stored memories are relevant. Cross-dataset figures: research/notes/scores.md.

Example:
    >>> cal = Calibration()
    >>> cal(cosine=0.7, overlap=1.0) > 0.5 > 0.3 > cal(cosine=0.05, overlap=0.0)
    True
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agentmem.recall.head_cues import stem
from agentmem.recall.weights_file import bundled
from agentmem.text import STOPWORDS

_DEFAULTS = bundled("calibration")
_WORD = re.compile(r"[a-z0-9]+")


def stems(text: str) -> frozenset[str]:
    """The stems of ``text``'s content words (function words dropped, :data:`agentmem.text.STOPWORDS`), by
    :func:`agentmem.recall.head_cues.stem` ("painting" meets "paints").

    Example:
        >>> sorted(stems("When is my daughter's piano recital?"))
        ['daugh', 'piano', 'recit']
    """
    return frozenset(stem(w) for w in _WORD.findall(text.lower()) if w not in STOPWORDS)


def word_overlap(query: frozenset[str], text: str, speaker: str | None = None) -> float:
    """The share of the query's stems (:func:`stems`) that the memory's ``text`` holds, the memory's own
    ``speaker``'s name left out of the query (every turn of a speaker would match it; what they said is what
    answers); 0 for a query without other content words.

    Example:
        >>> word_overlap(stems("When is my daughter's piano recital?"), "My daughter's piano recital is on 14 May.")
        1.0
        >>> word_overlap(stems("What did Caroline paint?"), "I painted a sunset.", "Caroline")
        1.0
        >>> word_overlap(stems("where do I live?"), "I moved to Lyon.")
        0.0
    """
    if speaker:
        query = query - stems(speaker)
    return len(query & stems(text)) / len(query) if query else 0.0


@dataclass(frozen=True)
class Calibration:
    """Logistic map from a (query, memory) pair's cosine and word overlap to the probability that it answers.

    Example:
        >>> 0.0 <= Calibration()(cosine=0.0, overlap=0.0) <= 1.0
        True
    """

    w_dense: float = _DEFAULTS["w_dense"]
    w_overlap: float = _DEFAULTS["w_overlap"]
    w_both: float = _DEFAULTS["w_both"]
    bias: float = _DEFAULTS["bias"]

    def __call__(self, *, cosine: float, overlap: float) -> float:
        z = self.w_dense * cosine + self.w_overlap * overlap + self.w_both * cosine * overlap + self.bias
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0

    @staticmethod
    def features(cosine: float, overlap: float) -> list[float]:
        """The model's inputs, in the order of :meth:`fit`'s columns."""
        return [cosine, overlap, cosine * overlap]

    @classmethod
    def fit(cls, x: Sequence[Sequence[float]], y: Sequence[int], *, weights: Sequence[float] | None = None,
            l2: float = 1e-3) -> Calibration:
        """Weighted maximum-likelihood logistic regression over rows of :meth:`features` (``y`` 1 = answers).

        Example:
            >>> cal = Calibration.fit([Calibration.features(0.7, 1.0), Calibration.features(0.1, 0.0)] * 20, [1, 0] * 20)
            >>> cal(cosine=0.7, overlap=1.0) > 0.9
            True
        """
        w = fit_logistic(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64), l2=l2,
                         sample_weight=None if weights is None else np.asarray(weights, dtype=np.float64))
        return cls(*(round(float(v), 4) for v in w))


def fit_logistic(x: np.ndarray, y: np.ndarray, *, l2: float, steps: int = 50,
                 nonneg: Sequence[int] = (), sample_weight: np.ndarray | None = None) -> np.ndarray:
    """Maximum-likelihood logistic regression by Newton's method with an L2 penalty on the weights (not the bias):
    the weights of ``x``'s columns, then the bias. Shared by the score's and the learned head's fits.
    ``nonneg``: columns whose weight is held >= 0 (projected Newton with an active set: a held weight at 0 whose
    gradient pushes it below 0 is left out of the step, then held weights are clamped at 0). ``sample_weight``: each
    row's weight in the likelihood (default 1).

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
    sw = np.ones(len(x)) if sample_weight is None else sample_weight
    d = design.shape[1]
    w = np.zeros(d)
    reg = l2 * np.eye(d)
    reg[-1, -1] = 0.0  # the bias is not shrunk
    held = np.zeros(d, dtype=bool)
    held[list(nonneg)] = True
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ w, -30, 30)))
        grad = design.T @ (sw * (p - y)) + reg @ w
        hess = (design * (sw * p * (1 - p))[:, None]).T @ design + reg
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


__all__ = ["Calibration", "fit_logistic", "stems", "word_overlap"]
