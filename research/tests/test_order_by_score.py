"""research/order_by_score.py: the score order keeps contradicted hits and questions behind the others, and the
figures count a dev set's own recalls only."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import order_by_score as obs  # noqa: E402


def _hit(rank: int, score: float, label: int, q: int = 0, **extra) -> dict:
    return {"q": q, "rank": rank, "score": score, "label": label, "contradicted": False, "asks": False, **extra}


def test_the_score_order_sorts_statements_and_leaves_contradicted_and_questions_behind() -> None:
    hits = [_hit(0, 0.2, -1), _hit(1, 0.9, 1, contradicted=True), _hit(2, 0.5, 1), _hit(3, 0.99, -1, asks=True),
            _hit(4, 0.7, -1)]
    assert [h["rank"] for h in obs.ordered(hits, "score")] == [4, 2, 0, 1, 3]
    assert [h["rank"] for h in obs.ordered(hits[::-1], "rank")] == [0, 1, 2, 3, 4]


def test_figures_skip_the_foreign_recall_of_a_dev_set() -> None:
    own = [_hit(0, 0.9, -1), _hit(1, 0.8, 1)]
    foreign = [_hit(0, 0.95, 0), _hit(1, 0.1, 0, gold=1)]
    got = obs.figures(own + foreign, "rank", dev=True)
    assert got["first"] == 0.0 and got["recall@3"] == 1.0 and got["mrr"] == 0.5 and got["questions"] == 1
    small = [_hit(0, 0.3, 0), _hit(1, 0.8, 1, gold=1)]
    assert obs.figures(small, "score", dev=False)["first"] == 1.0
