"""A non-linear head model (issue #16, research/notes/retrieval-lab-notes.md session 15): the shipped head (``category_ablation``'s
``base``: 20 widened by the pools' best 20, the 20 features + 4 question cues, dense / context weights held >= 0)
re-ordered by something other than the one logistic model, measured by the same nested CV (``learned_ablation
.ltr_fold``: fitted on 4 conversations, the setting chosen by leave-one-conversation-out inside them, scored on the
5th, pooled over the 759 questions).

- ``base``: the shipped logistic model (L2 0.1 / 10 / 1000 × blend with the share 0.25 / 0.5 / 1).
- ``hgb``: sklearn's ``HistGradientBoostingClassifier`` pointwise (label: evidence turn or not), monotone +1 in the
  dense / context columns (``learned_ablation.MONOTONE["dense"]``, as the logistic fit holds them >= 0), its logit
  blended with the logistic model's: ``b × hgb + (1 - b) × logistic`` (b = 0: the logistic order exactly). The
  tree grid and b are chosen inside; the logistic part is the one every fold of ``base`` chooses (L2 0.1, blend 1).
- ``hgb_reg``: the same over a more regularised tree grid (:data:`TREES_REG`).
- ``inter``: the logistic model with a few interaction columns picked by reasoning (:data:`INTERACTIONS`).
- ``pair``: a RankNet-style linear model, the logistic loss on the feature differences of (evidence, other) pairs
  within each head, the same grid as ``base``.

``--sister``: whether every fold's chosen model still puts "My sister is called Inès." first for "sister's name"
(``tests/unit/test_memory_store.py``; session 9 lost it to a model that preferred BM25's top). ``--cost``: one head's
scoring time, sklearn's ``decision_function`` against a numpy walk of the same trees (:func:`tree_walk`).

    python research/head_model_ablation.py --cache /tmp/q-cache.pkl --models base hgb inter pair --sister --cost

Last line: {"<model>": {"cv": {...}, "chosen": [...]}, ..., "cost_ms": {...}}
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]  # research/, benchmarks/
import category_ablation as ca  # noqa: E402
import embedder_ablation as ea  # noqa: E402
import learned_ablation as la  # noqa: E402

from agentmem.recall.learned_rank import FEATURES, HEAD_CUES  # noqa: E402
from agentmem.recall.multihop import list_question  # noqa: E402

COLUMNS = list(FEATURES) + list(HEAD_CUES)  # the base head's 24 columns, in order
DENSE = [FEATURES.index(f) for f in la.MONOTONE["dense"]]  # held monotone (+1 / weight >= 0)
LOGISTIC = (0.1, 1.0)  # the (L2, blend) every fold of base chose inside on /tmp/q-cache.pkl
# the tree grid: (max_leaf_nodes, max_depth, learning_rate, max_iter, l2_regularization); few leaves, shallow
TREES = [(leaves, depth, rate, iters, l2) for (leaves, depth) in ((7, 3), (15, 4)) for rate in (0.05, 0.1)
         for iters in (100, 300) for l2 in (0.0, 1.0)]
# a second, more regularised grid (+ min_samples_leaf), run after the first's trees fitted all-dev far above their
# held-out figure (0.845 against 0.817 @10): shallower, fewer trees, leaves of 100 / 400 rows
TREES_REG = [(leaves, depth, 0.05, iters, 1.0, leaf) for (leaves, depth) in ((4, 2), (7, 3)) for iters in (50, 150)
             for leaf in (100, 400)]
# 0.1: a first run's inner folds all chose 0.25, the grid's lowest blend above 0
BLENDS = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0)
# (name, left column, right column or "list" for the list-question flag, held >= 0): chosen by what each should
# carry, not by the data. A list question gathers evidence across sessions, so its session mass, head rank and plain
# cosine may matter differently; a named speaker's or a dated turn with a high share is the likely answer; a
# question turn with a high share is the question echoed; a repeated word on a close turn is stronger than either.
INTERACTIONS = (("list×session_mass", "session_mass", "list", False), ("list×head_rank", "head_rank", "list", False),
                ("list×dense", "dense", "list", True), ("speaker×share", "speaker_match", "share", False),
                ("time×share", "time", "share", False), ("question×share", "is_question", "share", False),
                ("overlap×dense", "overlap", "dense", True))


def digest(*arrays: np.ndarray) -> str:
    """A key for a training set (the inner folds share them: conversations {c, v} left out in either order).

    Example:
        >>> digest(np.zeros(2)) == digest(np.zeros(2)) != digest(np.ones(2))
        True
    """
    h = hashlib.sha1()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@dataclass
class Boosted:
    """``ltr_fold``'s learner: a monotone ``HistGradientBoostingClassifier`` blended with the logistic model. A
    setting is (*one of :data:`TREES` / :data:`TREES_REG`, blend); the fits are memoised on the training set and
    the tree setting, so the blends share them.

    Example:
        >>> X = np.random.default_rng(0).random((200, 3)); y = (X[:, 0] > 0.7).astype(float)
        >>> b = Boosted(monotone=(0,)); m = b.fit(X, y, [20] * 10, (7, 3, 0.1, 50, 0.0, 1.0))
        >>> b.rank([(["lo", "hi"], np.array([[0.1, 0.5, 0.5], [0.9, 0.5, 0.5]]))], m, (7, 3, 0.1, 50, 0.0, 1.0))
        [['hi', 'lo']]
    """

    monotone: tuple[int, ...] = tuple(DENSE)
    logistic: tuple[float, float] = LOGISTIC
    cache: dict[tuple, Any] = field(default_factory=dict)

    def fit(self, X: np.ndarray, y: np.ndarray, sizes: list[int], setting: tuple) -> tuple[Any, np.ndarray]:
        from sklearn.ensemble import HistGradientBoostingClassifier

        key = (digest(X, y), setting[:-1])
        if key not in self.cache:
            leaves, depth, rate, iters, l2, *leaf = setting[:-1]  # min_samples_leaf: sklearn's 20 unless given
            cst = [1 if n in self.monotone else 0 for n in range(X.shape[1])]
            # no early stopping: it would hold out a random tenth of the rows (heads split across the two)
            hgb = HistGradientBoostingClassifier(max_leaf_nodes=leaves, max_depth=depth, learning_rate=rate,
                                                 max_iter=iters, l2_regularization=l2, monotonic_cst=cst,
                                                 min_samples_leaf=leaf[0] if leaf else 20,
                                                 early_stopping=False, random_state=0)
            self.cache[key] = (hgb.fit(X, y), la.fit_lr(X, y, self.logistic[0], nonneg=list(self.monotone)))
        return self.cache[key]

    def rank(self, heads: list[tuple[list[str], np.ndarray]], model: tuple[Any, np.ndarray], setting: tuple
             ) -> list[list[str]]:
        hgb, w = model
        X = np.concatenate([x for _, x in heads])
        b = setting[-1]
        lin = X @ w[:-1] + w[-1]
        # the logistic part as lr_rank at its blend (1: the logit alone); b = 0 skips the trees: exactly that order
        lin = self.logistic[1] * lin + (1 - self.logistic[1]) * 10.0 * X[:, 0]
        s = lin if b == 0 else b * hgb.decision_function(X) + (1 - b) * lin
        out, at = [], 0
        for ids, x in heads:
            part = s[at:at + len(ids)]
            at += len(ids)
            out.append([ids[n] for n in sorted(range(len(ids)), key=lambda n: (-part[n], n))])
        return out


@dataclass(frozen=True)
class Pairwise(la.Logistic):
    """RankNet-style: the logistic loss on X[evidence] - X[other] within each head (both signs, so no bias is
    learnt), ranked as :class:`learned_ablation.Logistic` ranks (setting (l2, blend)).

    Example:
        >>> X = np.array([[0.0, 1.0], [1.0, 0.0], [0.2, 1.0], [0.9, 0.1]]); y = np.array([0.0, 1.0, 0.0, 1.0])
        >>> w = Pairwise().fit(X, y, [2, 2], (1.0, 1.0)); bool(w[0] > 0 > w[1])
        True
    """

    def fit(self, X: np.ndarray, y: np.ndarray, sizes: list[int], setting: tuple) -> np.ndarray:
        diffs, at = [], 0
        for n in sizes:
            pos, neg = np.flatnonzero(y[at:at + n] > 0) + at, np.flatnonzero(y[at:at + n] == 0) + at
            at += n
            if len(pos) and len(neg):
                diffs.append((X[pos][:, None, :] - X[neg][None, :, :]).reshape(-1, X.shape[1]))
        D = np.concatenate(diffs)
        yy = np.r_[np.ones(len(D)), np.zeros(len(D))]
        return la.fit_lr(np.vstack([D, -D]), yy, setting[0], nonneg=list(self.nonneg) if self.nonneg else None)


def interactions(q: Any, X: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """``X`` (the base head's 24 columns) with :data:`INTERACTIONS`' columns after them, and the columns to hold
    >= 0 (the dense ones, and the interactions with the cosine).

    Example:
        >>> q = type("Q", (), {"text": "What books has Ann read?"})()
        >>> Z, held = interactions(q, np.ones((2, len(COLUMNS)))); Z.shape, len(held)
        ((2, 31), 7)
    """
    listed = float(list_question(q.text))
    extra = [X[:, COLUMNS.index(a)] * (listed if b == "list" else X[:, COLUMNS.index(b)])
             for _, a, b, _ in INTERACTIONS]
    held = DENSE + [len(COLUMNS) + n for n, (*_, mono) in enumerate(INTERACTIONS) if mono]
    return np.hstack([X, np.c_[tuple(extra)]]), held


def nested(data: la.Data, feats: list, settings: list[tuple], learner: Any, name: str) -> dict[str, Any]:
    """``learner`` over every question's (head ids, feature rows) ``feats``, nested over the conversations with
    :func:`learned_ablation.ltr_fold`: held-out summary, the all-dev one (:func:`all_dev`, at the setting most folds
    chose), each fold's chosen setting, and the five fitted models and per-question recall (``"models"``, ``"held"``,
    left out of the JSON)."""
    held: list[dict[int, float]] = [{} for _ in data.questions]
    chosen, models = [], []
    for c in tqdm(data.convs, desc=name, file=sys.stderr):
        got, best, model = la.ltr_fold(data, {name: feats}, c, settings, learner=learner)
        for j, r in got.items():
            held[j] = r
        chosen.append(list(best[1:]))
        models.append((model, best[1:]))
    common = max(chosen, key=chosen.count)  # the setting most folds chose (the first of a tie)
    per_conv = {c: round(float(np.mean([r[10] for r, q in zip(held, data.questions) if q.conv == c])), 4)
                for c in data.convs}
    return {"cv": la.summary(data.questions, held), "all_dev": all_dev(data, feats, learner, tuple(common)),
            "per_conv@10": per_conv, "chosen": chosen, "models": models, "held": held}


def all_dev(data: la.Data, feats: list, learner: Any, setting: tuple) -> dict[str, Any]:
    """The all-dev figure beside the held-out one: ``learner`` at ``setting`` fitted on every question and scored on
    the same (in-sample: how much the model can fit at all, not what it generalises)."""
    qs = data.questions
    X = np.concatenate([x for _, x in feats])
    y = np.concatenate([[float(i in q.gold) for i in ids] for q, (ids, _) in zip(qs, feats)])
    model = learner.fit(X, y, [len(ids) for ids, _ in feats], setting)
    return la.summary(qs, [la.recall_of(q, ids) for q, ids in zip(qs, learner.rank(feats, model, setting))])


def against(held: list[dict[int, float]], base: list[dict[int, float]]) -> dict[str, int]:
    """Questions whose held-out recall@10 went up / down against ``base``'s (how many moved, not by how much).

    Example:
        >>> against([{10: 1.0}, {10: 0.5}, {10: 0.0}], [{10: 0.5}, {10: 0.5}, {10: 1.0}])
        {'up': 1, 'down': 1}
    """
    pairs = list(zip(held, base))
    return {"up": sum(a[10] > b[10] for a, b in pairs), "down": sum(a[10] < b[10] for a, b in pairs)}


def sister_head() -> tuple[list[str], np.ndarray, str]:
    """The head of ``tests/unit/test_memory_store.py``'s "sister's name" recall (its ids, the 24 columns) and the
    id it must put first, captured from the library's own recall."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    from agentmem import AgentMemory
    from agentmem.recall import head as head_mod
    from agentmem.recall.head_cues import CUES, cue_columns
    from agentmem.recall.learned_rank import features

    got: dict[str, Any] = {}
    shipped = head_mod.reorder

    def capture(query: str, head: Any, order: Any, cands: Any, fused: Any, spilled: Any, params: Any,
                model: Any = None) -> Any:
        X = features(query, head, order, cands, fused, spilled, params)
        cues = cue_columns(query, head, order, cands)[:, [CUES.index(c) for c in HEAD_CUES]]
        got["ids"], got["X"] = [i for i, _ in order], np.hstack([X, cues])
        return shipped(query, head, order, cands, fused, spilled, params, model)

    head_mod.reorder = capture
    try:
        with tempfile.TemporaryDirectory() as d, AgentMemory(Path(d) / "m") as mem:
            recs = mem.remember_messages(  # the test's messages exactly
                [SystemMessage("be nice"), HumanMessage("My sister is called Inès."), AIMessage("Nice name!"),
                 ToolMessage("Paris: 18C", tool_call_id="c1", name="weather"),
                 {"role": "user", "content": "and my brother is Tom"}], user_id="u1", session_id="s1")
            mem.recall("sister's name", user_id="u1", k=1)
    finally:
        head_mod.reorder = shipped
    return got["ids"], got["X"], recs[0].id


def sister_check(result: dict[str, Any], learners: dict[str, Any], make: dict[str, Any]) -> dict[str, list[bool]]:
    """Per model: does each fold's fitted model (at its chosen setting) rank the sister turn first?"""
    ids, X, want = sister_head()
    out = {}
    for name, r in result.items():
        rows = make[name](X)
        out[name] = [learners[name].rank([(ids, rows)], m, s)[0][0] == want for m, s in r["models"]]
    return out


def tree_walk(hgb: Any) -> Any:
    """A numpy scorer equal to ``hgb.decision_function`` (binary, numeric features, no missing values): every tree's
    nodes padded into one array, all trees walked at once, one step per level.

    Example:
        >>> from sklearn.ensemble import HistGradientBoostingClassifier
        >>> X = np.random.default_rng(1).random((300, 4)); y = (X[:, 0] + X[:, 1] > 1).astype(int)
        >>> m = HistGradientBoostingClassifier(max_iter=20, max_depth=3).fit(X, y)
        >>> bool(np.allclose(tree_walk(m)(X), m.decision_function(X)))
        True
    """
    trees = [p[0].nodes for p in hgb._predictors]
    width = max(len(t) for t in trees)
    pad = lambda f, fill: np.stack([np.r_[t[f], np.full(width - len(t), fill, t[f].dtype)] for t in trees])  # noqa
    feat, thr, left, right = pad("feature_idx", 0), pad("num_threshold", 0.0), pad("left", 0), pad("right", 0)
    leaf, value = pad("is_leaf", 1).astype(bool), pad("value", 0.0)
    depth = int(max(t["depth"].max() for t in trees))
    rows = np.arange(len(trees))[:, None]
    base = float(np.ravel(hgb._baseline_prediction)[0])

    def score(X: np.ndarray) -> np.ndarray:
        node = np.zeros((len(trees), len(X)), dtype=np.int64)
        cols = np.arange(len(X))[None, :]
        for _ in range(depth):
            go_left = X[cols, feat[rows, node]] <= thr[rows, node]
            node = np.where(leaf[rows, node], node, np.where(go_left, left[rows, node], right[rows, node]))
        return value[rows, node].sum(0) + base

    return score


def cost(model: tuple[Any, np.ndarray], feats: list, n: int = 400) -> dict[str, float]:
    """One head's scoring time in ms (p50 / p95 over ``n`` heads): sklearn's ``predict_proba``, the numpy
    :func:`tree_walk`, and the logistic model's matrix product, single-threaded as recall runs."""
    hgb, w = model
    walk = tree_walk(hgb)
    heads = [X for _, X in feats[:n]]
    out: dict[str, float] = {}
    for name, f in (("predict_proba", hgb.predict_proba), ("tree_walk", walk), ("logistic", lambda X: X @ w[:-1])):
        f(heads[0])  # warm
        ms = []
        for X in heads:
            t0 = time.perf_counter()
            f(X)
            ms.append(1000 * (time.perf_counter() - t0))
        q = statistics.quantiles(ms, n=20)
        out[f"{name}_p50"], out[f"{name}_p95"] = round(statistics.median(ms), 3), round(q[18], 3)
    out["walk_equals"] = bool(np.allclose(walk(np.concatenate(heads)), hgb.decision_function(np.concatenate(heads))))
    out["trees"], out["head_rows_mean"] = len(hgb._predictors), round(float(np.mean([len(X) for X in heads])), 1)
    return out


def models(nonneg: list[int]) -> dict[str, tuple[Any, list[tuple], Any]]:
    """Each candidate: (learner, its settings, its feature rows from a question and the base rows)."""
    grid = [(l2, b) for l2 in (0.1, 10.0, 1000.0) for b in (0.25, 0.5, 1.0)]
    inter_held = interactions(type("Q", (), {"text": ""})(), np.zeros((1, len(COLUMNS))))[1]
    same = lambda q, X: X  # noqa: E731
    return {"base": (la.Logistic(tuple(nonneg)), grid, same),
            "hgb": (Boosted(), [(*t, b) for t in TREES for b in BLENDS], same),
            "hgb_reg": (Boosted(), [(*t, b) for t in TREES_REG for b in BLENDS], same),
            "inter": (la.Logistic(tuple(inter_held)), grid, lambda q, X: interactions(q, X)[0]),
            "pair": (Pairwise(tuple(nonneg)), grid, same)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True, type=Path)
    ap.add_argument("--models", nargs="+", default=["base", "hgb", "inter", "pair"])
    ap.add_argument("--sister", action="store_true", help="check each fold's model on the sister's-name head")
    ap.add_argument("--cost", action="store_true", help="time one head's scoring (hgb's fold-1 model)")
    args = ap.parse_args()
    data = la.Data(**la.load_cache(args.cache))
    feats = ea.head_feats(data.questions, data.rows, ca.unit_vectors(data))  # category_ablation's base head
    table = models(DENSE)
    result: dict[str, Any] = {}
    for name in args.models:
        learner, settings, make = table[name]
        rows = [(ids, make(q, X)) for q, (ids, X) in zip(data.questions, feats)]
        t0 = time.time()
        result[name] = nested(data, rows, settings, learner, name)
        print(name, json.dumps({k: v for k, v in result[name].items() if k not in ("models", "held")}),
              round(time.time() - t0, 1), flush=True)
    out: dict[str, Any] = {k: {m: v for m, v in r.items() if m not in ("models", "held")} for k, r in result.items()}
    for name in [n for n in result if n != "base" and "base" in result]:
        out[name]["vs_base@10"] = against(result[name]["held"], result["base"]["held"])
    if args.sister:
        sister_q = type("Q", (), {"text": "sister's name"})()
        out["sister_first"] = sister_check(result, {k: table[k][0] for k in result},
                                           {k: (lambda X, f=table[k][2]: f(sister_q, X)) for k in result})
        print("sister_first", out["sister_first"], flush=True)
    if args.cost and "hgb" in result:
        out["cost_ms"] = cost(result["hgb"]["models"][0][0], feats)
        print("cost_ms", out["cost_ms"], flush=True)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
