"""research/head_model_ablation.py (research/notes/retrieval-lab-notes.md, session 15): the non-linear head model's learner is monotone
in the dense columns, blend 0 is the logistic order exactly, the numpy tree walk is sklearn's score, the pairwise
fit learns the evidence's side, and a nested fold never trains on its held-out conversation."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

pytest.importorskip("sklearn")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import head_model_ablation as hm  # noqa: E402
import learned_ablation as la  # noqa: E402

TREE = (7, 3, 0.1, 60, 0.0)


class Q(NamedTuple):
    conv: str
    gold: set[str]
    category: int = 1


def _toy(seed: int = 0, n: int = 600) -> tuple[np.ndarray, np.ndarray]:
    """Column 0 (held +1) is anti-correlated with the label given column 1: an unconstrained model would use it
    downwards."""
    rng = np.random.default_rng(seed)
    X = rng.random((n, 3))
    y = ((X[:, 1] - 0.8 * X[:, 0] + 0.1 * rng.standard_normal(n)) > 0.3).astype(float)
    return X, y


def test_the_boosted_model_never_ranks_a_closer_entry_lower() -> None:
    X, y = _toy()
    hgb, _ = hm.Boosted(monotone=(0,)).fit(X, y, [20] * 30, (*TREE, 1.0))
    grid = np.linspace(0, 1, 21)
    for row in X[:50]:
        Z = np.repeat(row[None], len(grid), 0)
        Z[:, 0] = grid
        assert np.all(np.diff(hgb.decision_function(Z)) >= -1e-12)  # +1 constraint on column 0 holds
    free, _ = hm.Boosted(monotone=()).fit(X, y, [20] * 30, (*TREE, 1.0))
    Z = np.repeat(X[:1], len(grid), 0)
    Z[:, 0] = grid
    assert np.diff(free.decision_function(Z)).min() < 0  # the toy set does push an unconstrained fit down


def test_blend_zero_is_the_logistic_order_and_one_is_the_trees() -> None:
    X, y = _toy(1)
    b = hm.Boosted(monotone=(0,))
    model = b.fit(X, y, [20] * 30, (*TREE, 0.0))
    heads = [([f"e{n}" for n in range(20)], X[k:k + 20]) for k in range(0, 100, 20)]
    w = la.fit_lr(X, y, hm.LOGISTIC[0], nonneg=[0])
    assert b.rank(heads, model, (*TREE, 0.0)) == la.Logistic((0,)).rank(heads, w, hm.LOGISTIC)
    by_trees = [[ids[n] for n in np.argsort(-model[0].decision_function(x), kind="stable")] for ids, x in heads]
    assert b.rank(heads, model, (*TREE, 1.0)) == by_trees
    assert len(b.cache) == 1  # the blends share one fit


def test_the_numpy_tree_walk_is_sklearns_score() -> None:
    X, y = _toy(2)
    hgb, _ = hm.Boosted(monotone=(0,)).fit(X, y, [20] * 30, (15, 4, 0.1, 40, 1.0, 1.0))
    assert np.allclose(hm.tree_walk(hgb)(X), hgb.decision_function(X))


def test_the_pairwise_fit_learns_the_evidence_side() -> None:
    rng = np.random.default_rng(3)
    X = rng.random((400, 2))
    y = np.zeros(400)
    y[np.argmax(X.reshape(20, 20, 2)[:, :, 0], 1) + np.arange(0, 400, 20)] = 1  # each head's evidence: top column 0
    w = hm.Pairwise().fit(X, y, [20] * 20, (1.0, 1.0))
    assert w[0] > 0 and abs(w[1]) < w[0] / 3


def test_the_interaction_columns_follow_the_list_flag() -> None:
    X = np.ones((2, len(hm.COLUMNS)))
    listed, held = hm.interactions(type("T", (), {"text": "What books did Ann read?"})(), X)
    plain, _ = hm.interactions(type("T", (), {"text": "Where did Ann go?"})(), X)
    at = len(hm.COLUMNS) + [n for n, i in enumerate(hm.INTERACTIONS) if i[0] == "list×dense"][0]
    assert listed[0, at] == 1.0 and plain[0, at] == 0.0 and at in held


class Spy(la.Logistic):
    """A learner recording the conversations each fit saw (column 1 holds the conversation's number)."""

    seen: list[set[int]] = []

    def fit(self, X: np.ndarray, y: np.ndarray, sizes: list[int], setting: tuple) -> Any:
        Spy.seen.append({int(v) for v in X[:, 1]})
        return super().fit(X, y, sizes, setting)


def _nested_toy() -> tuple[la.Data, list]:
    """4 conversations of 6 heads of 5; each head's evidence: its top of column 0; column 1: the conversation."""
    rng = np.random.default_rng(4)
    qs, feats = [], []
    for c in range(4):
        for k in range(6):
            ids = [f"{c}-{k}-{n}" for n in range(5)]
            X = np.c_[rng.random(5), np.full(5, c)]
            qs.append(Q(f"c{c}", {ids[int(np.argmax(X[:, 0]))]}))
            feats.append((ids, X))
    return la.Data(qs, {}, {}, {}, {}, {}, np.zeros((len(qs), 1))), feats


def test_the_all_dev_figure_fits_and_scores_every_question() -> None:
    data, feats = _nested_toy()
    Spy.seen = []
    out = hm.all_dev(data, feats, Spy(), (1.0, 1.0))
    assert Spy.seen == [{0, 1, 2, 3}] and out["recall@5"] == 1.0  # one fit on all four; column 0 separates
    assert out["by_cat"] == {"1": 1.0}


def test_a_fold_never_fits_on_its_held_out_conversation() -> None:
    data, feats = _nested_toy()
    qs = data.questions
    for held in range(4):
        Spy.seen = []
        got, best, _ = la.ltr_fold(data, {"v": feats}, f"c{held}", [(1.0, 1.0), (10.0, 0.5)], learner=Spy())
        assert Spy.seen and all(held not in s for s in Spy.seen)
        assert len(Spy.seen) == 3 * 2 + 1  # 3 inner leave-one-out fits per setting, then the fold's own
        assert {qs[j].conv for j in got} == {f"c{held}"} and best[0] == "v"
