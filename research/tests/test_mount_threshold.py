"""research/mount_threshold.py: shares at each threshold, and the fit samples read per source (answering and
unrelated pairs apart, a k=4 mount counted over a question's own top 4 only)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import mount_threshold as mt  # noqa: E402


def test_shares_count_pairs_at_or_above_each_threshold() -> None:
    got = mt.shares(np.array([0.29, 0.3, 0.5, 0.9]), np.array([0.0, 0.1, 0.45, 0.5]))
    assert got["0.3"] == {"answering": 0.75, "unrelated": 0.5}
    assert got["0.5"] == {"answering": 0.5, "unrelated": 0.25}


def test_samples_are_scored_with_the_shipped_calibration_per_source(tmp_path: Path) -> None:
    def sample(q: int, rank: int, label: int, cosine: float) -> dict:
        return {"q": q, "rank": rank, "label": label, "cosine": cosine, "question": "Where is the cat?",
                "text": "The cat is on the mat.", "speaker": None}

    # question 0: its evidence (strong), an own non-evidence hit ranked 5th (not in a k=4 mount), and an unrelated hit
    samples = {"locomo": [sample(0, 0, 1, 0.9), sample(0, 4, -1, 0.9), sample(0, 0, 0, 0.0)]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(samples))
    got = mt.from_samples(path)["locomo"]
    assert got["pairs"] == {"answering": 1, "unrelated": 1}
    assert got["thresholds"]["0.5"]["answering"] == 1.0
    assert got["mounted_of_4"]["0.3"] == 1.0  # the evidence only: rank 4 is outside k=4, unrelated is not its own
