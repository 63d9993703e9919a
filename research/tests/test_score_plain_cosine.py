"""research/score_plain_cosine.py: the feature sets read the right cosines, and quality() scores a fitted model the
way research/fit_scores.py does (balanced classes, kept@10 over each question's evidence)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import score_plain_cosine as spc  # noqa: E402


def test_feature_sets_read_the_tower_and_the_plain_cosine() -> None:
    s = {"cosine": 0.2, "plain": 0.6, "overlap": 0.5}
    assert spc.FEATURES["shipped"](s) == [0.2, 0.5, 0.1]
    assert spc.FEATURES["plain"](s) == [0.6, 0.5, 0.3]
    assert spc.FEATURES["max"](s) == [0.6, 0.5, 0.3]
    assert spc.FEATURES["both"](s) == [0.2, 0.6, 0.5, 0.1]


def test_quality_of_a_model_that_separates_the_classes() -> None:
    def sample(q: int, label: int, plain: float, **extra) -> dict:
        return {"source": "small", "q": q, "label": label, "cosine": 0.0, "plain": plain, "overlap": 0.0, **extra}

    samples = [sample(0, 1, 0.9), sample(0, 0, 0.1, gold=1), sample(1, 0, 0.1), sample(1, 0, 0.2, gold=1)]
    w = np.array([20.0, 0.0, 0.0, -10.0])  # plain cosine 0.9 -> ~1, 0.1 / 0.2 -> ~0
    got = spc.quality(samples, "small", "plain", w)
    assert got["answering>=0.5"] == 1.0 and got["unrelated<=0.3"] == 1.0
    assert got["kept@10"] == 1.0 and got["ece"] < 0.01
