"""The pairwise supersession model of ``consolidation="local"``: does a new memory replace an older one?

A logistic regression over general signals of the pair (older memory A, newer memory B of the same speaker), all
computed from the bundled sentence embedder's unit vectors of the bare texts and their content words:

* ``cos``: cosine of A and B;
* ``margin``: ``cos`` minus B's *background*, the median cosine of B to its (up to) 10 nearest older memories of the
  speaker; with fewer than 3 (a new user's first memories, a recall that found one or two of the speaker's) the
  model's ``background_prior``, the median background of conversation memories measured on a dataset
  (``research/background_prior.py``; 1.0, as before it was measured, where the weights file has none: nothing
  can stand out, so a new user's first memories were never compared);
* ``jaccard``: content-word overlap;
* ``nearest``: 1 when A is B's nearest older memory;
* ``a * b``: the element-wise product of the two vectors (which directions they agree on: the attribute, the frame),
  scaled by 10;
* ``b``: B's own vector, scaled by 3 (whether B reads as a statement of change at all).

No phrase list: every weight is learned. The bundled weights (``supersession_pairs.json``) were fitted by
``research/fit_supersession.py``: positives are (old statement, update) pairs of the "tune" half of
``benchmarks/ku_scenarios.py``; negatives are that half's other pairs (chit-chat, other facts, look-alike statements
of the same attribute) and same-speaker nearest-neighbour pairs of LoCoMo conversations. The supersession threshold
is the highest score of any LoCoMo pair (no conversation turn of the fitting data is superseded); the
cross-validated figures (held-out scenario attributes, held-out conversations) are in docs/lifecycle.md. The weights
belong to the bundled all-MiniLM-L6-v2: a store with another embedder falls back to the cosine rule.

Example:
    >>> model = PairModel.bundled()
    >>> model is not None and model.dim
    384
    >>> v = np.eye(384, dtype=np.float32)
    >>> model.scores(v[0], {"paris"}, [v[0], v[1]], [{"lyon"}, {"dog"}]).shape
    (2,)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

WEIGHTS = Path(__file__).parent / "weights" / "supersession_pairs.json"
BACKGROUND_NEIGHBOURS = 10  # background = median cosine to this many nearest older memories of the speaker
MIN_BACKGROUND = 3  # with fewer older memories, the background is 1.0 (nothing stands out)
PRODUCT_SCALE, NEW_SCALE = 10.0, 3.0  # feature scales used when fitting (keep in step with the weights)


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def pair_features(new: np.ndarray, new_words: set[str], olds: Sequence[np.ndarray],
                  old_words: Sequence[set[str]], *, min_background: int = MIN_BACKGROUND,
                  background_prior: float = 1.0) -> np.ndarray:
    """One feature row per older memory (see the module docstring); vectors are unit-normalised. The background
    needs ``min_background`` memories; with fewer it is ``background_prior``.

    Example:
        >>> v = np.eye(4, dtype=np.float32)
        >>> pair_features(v[0], {"a"}, [v[0], v[1]], [{"a"}, {"b"}])[:, :4].round(2).tolist()
        [[1.0, 0.0, 1.0, 1.0], [0.0, -1.0, 0.0, 0.0]]
    """
    if not len(olds):
        return np.zeros((0, 4 + 2 * len(new)), dtype=np.float32)
    old = np.asarray(olds, dtype=np.float32)
    cos = old @ new
    top = np.sort(cos)[::-1][:BACKGROUND_NEIGHBOURS]
    background = _sorted_median(top) if len(top) >= min_background else background_prior
    jaccards = np.array([_jaccard(w, new_words) for w in old_words])
    # the row [cos, margin, jaccard, nearest, a * b, b] written in place: the values (and dtype) np.hstack of the
    # parts gave, without stacking them first (recall scores ~10 such matrices per query)
    d = len(new)
    out = np.empty((len(old), 4 + 2 * d), dtype=np.result_type(cos.dtype, jaccards.dtype, old.dtype, new.dtype))
    out[:, 0] = cos
    out[:, 1] = cos - background
    out[:, 2] = jaccards
    out[:, 3] = 0.0
    out[int(np.argmax(cos)), 3] = 1.0
    out[:, 4 : 4 + d] = PRODUCT_SCALE * old * new
    out[:, 4 + d :] = NEW_SCALE * new
    return out


def _sorted_median(top: np.ndarray) -> float:
    """``float(np.median(top))`` for a sorted vector, without np.median's generic machinery (~20 us a call): the
    middle element, or the two middle ones' mean as np.mean computes it (their sum in the vector's dtype, / 2).

    >>> top = np.array([0.9, 0.5, 0.2, 0.1], dtype=np.float32)
    >>> _sorted_median(top) == float(np.median(top)), _sorted_median(top[:3]) == float(np.median(top[:3]))
    (True, True)
    """
    half = len(top) // 2
    return float(top[half]) if len(top) % 2 else float((top[half - 1] + top[half]) / 2)


@dataclass(frozen=True)
class PairModel:
    """Fitted weights: ``score = features @ weights + bias`` (a logit); ``supersede`` is the threshold at which an
    older memory is superseded, ``conflict`` the lower one at which recall puts the newer of two hits first;
    ``background_prior`` the background a speaker with fewer than 3 older memories is given."""

    weights: np.ndarray
    bias: float
    supersede: float
    conflict: float
    dim: int
    background_prior: float = 1.0

    @staticmethod
    def bundled() -> PairModel | None:
        """The weights shipped with agentmem (fitted for the bundled all-MiniLM-L6-v2); None when the file is absent
        (``research/fit_supersession.py`` writes it), which leaves the cosine rule in charge."""
        return _load(str(WEIGHTS)) if WEIGHTS.exists() else None

    def scores(self, new: np.ndarray, new_words: set[str], olds: Sequence[np.ndarray],
               old_words: Sequence[set[str]], *, min_background: int = MIN_BACKGROUND) -> np.ndarray:
        """The logit that ``new`` replaces each of ``olds`` (same speaker, older)."""
        features = pair_features(new, new_words, olds, old_words, min_background=min_background,
                                 background_prior=self.background_prior)
        return features @ self.weights + self.bias

    def scores_in_place(self, new: np.ndarray, new_words: set[str], old_cosines: np.ndarray, places: Sequence[int],
                        candidates: np.ndarray, candidate_words: Sequence[set[str]], *,
                        min_background: int = MIN_BACKGROUND) -> np.ndarray:
        """The logit that ``new`` replaces each of ``candidates`` (unit vectors, one per row) were it the older
        memory at ``places[k]`` of the list whose cosines to ``new`` are ``old_cosines``, the others as they are:
        what :meth:`scores` gives at that place with the candidate in it (recall scores each sentence of a longer
        memory so), for every candidate at once and without building the other rows' features.

        Example:
            >>> model = PairModel.bundled()
            >>> rng = np.random.default_rng(0)
            >>> v = rng.normal(size=(6, 384)).astype(np.float32); v /= np.linalg.norm(v, axis=1, keepdims=True)
            >>> olds, words = list(v[1:4]), [{"a"}, {"b"}, {"c"}]
            >>> one_by_one = [model.scores(v[0], {"a"}, [olds[0], v[4], olds[2]], [words[0], {"d"}, words[2]])[1],
            ...               model.scores(v[0], {"a"}, [olds[0], olds[1], v[5]], [words[0], words[1], {"e"}])[2]]
            >>> in_place = model.scores_in_place(v[0], {"a"}, np.asarray(olds) @ v[0], [1, 2], v[4:], [{"d"}, {"e"}])
            >>> bool(np.allclose(in_place, one_by_one, atol=1e-4))
            True
        """
        d = len(new)
        cand = np.asarray(candidates, dtype=np.float32)
        cos = cand @ new
        rows = np.arange(len(cand))
        every = np.tile(np.asarray(old_cosines, dtype=np.float32), (len(cand), 1))
        every[rows, places] = cos  # each candidate's list: the older cosines with its own in its place
        top = -np.sort(-every, axis=1)[:, :BACKGROUND_NEIGHBOURS]
        if top.shape[1] >= min_background:  # the median of each row's top, as _sorted_median takes it
            half = top.shape[1] // 2
            background = top[:, half] if top.shape[1] % 2 else (top[:, half - 1] + top[:, half]) / 2
        else:
            background = np.full(len(cand), self.background_prior, dtype=np.float32)
        nearest = (np.argmax(every, axis=1) == np.asarray(places)).astype(np.float32)
        jaccards = np.array([_jaccard(w, new_words) for w in candidate_words])
        w = self.weights
        return (w[0] * cos + w[1] * (cos - background) + w[2] * jaccards + w[3] * nearest
                + PRODUCT_SCALE * (cand * new) @ w[4 : 4 + d] + NEW_SCALE * float(new @ w[4 + d :]) + self.bias)

@lru_cache(maxsize=4)
def _load(path: str) -> PairModel:
    data = json.loads(Path(path).read_text())
    weights = np.asarray(data["weights"], dtype=np.float32)
    return PairModel(weights, float(data["bias"]), float(data["supersede"]), float(data["conflict"]),
                     int(data["dim"]), float(data.get("background_prior", {}).get("value", 1.0)))


__all__ = ["PairModel", "WEIGHTS", "pair_features"]
