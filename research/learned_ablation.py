"""Learned ranking on LoCoMo (issue #16), cross-validated over conversations: every model is trained on 4
conversations' questions and scored on the 5th; its hyper-parameters are chosen inside the 4 (leave one of them
out), never on the held-out one.

- ``ltr``: learning to rank over the features recall already has for its head (the shipped score, scaled dense /
  BM25 / context cosines, the spillover and session-boost parts, speaker and time matches, list-question flag,
  turn length, the ranks in each pool): a logistic regression on (head entry, is evidence), the head re-ordered by
  it. Would ship as a handful of constants.
- ``adapter``: a learned linear query adapter on the MiniLM query vector, q' = normalise(q + W q) (full or low
  rank W), trained with a softmax over the conversation's turns (question -> its evidence turns); the dense and
  turn-context pools are searched again, exactly, with q'. Would ship as a small weight file.

Needs the cache of ``research/_locomo_cache.py`` (one ingest, the store's own candidates, the vectors):

    python research/learned_ablation.py --cache /tmp/q-cache.pkl --signals ltr adapter
    python research/learned_ablation.py --cache /tmp/q-cache.pkl --signals diagnose ltr --depth 20 --cues none all

``diagnose``: where each category's evidence sits (top 10, 11-20, 21-100, further, outside the pool).
``ltr_choose``: the head's width (``--reserve``), the feature set (``--cues``, from ``agentmem.recall.head_cues``), the L2
weight and the blend all chosen inside the 4 training conversations. ``fit``: the first ``--depth`` / ``--reserve``
/ ``--cues`` at ``--fit-l2`` / ``--fit-blend`` fitted on each fold's 4 conversations: its held-out figure and the
median of the five fits (what a shipped model's constants would be, as session 7's are):

    python research/learned_ablation.py --cache /tmp/q-cache.pkl --signals fit --depth 20 --reserve 20 \
        --cues overlap,rare_overlap,session_mass,list_first --fit-l2 10 --fit-blend 1

Last line: {"baseline": {...}, "<model>": {"cv": {...}, "chosen": [...]}, ...}
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import pickle
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]  # research/, benchmarks/
import _locomo_cache  # noqa: E402,F401  (the cache's row type must be importable to unpickle it)
import locomo  # noqa: E402
import locomo_cv  # noqa: E402

from agentmem.recall.calibration import fit_logistic  # noqa: E402
from agentmem.recall.head import HeadLoader, head_of  # noqa: E402
from agentmem.recall.head_cues import CUES, cue_columns  # noqa: E402
from agentmem.recall.learned_rank import FEATURES, HeadModel, features  # noqa: E402
from agentmem.recall.multihop import for_query  # noqa: E402
from agentmem.recall.retrieval import Candidates, RetrievalParams, rank_parts  # noqa: E402

KS = [5, 10]


@dataclass
class Data:
    questions: list[Any]
    rows: dict[str, Any]
    places: dict[str, Any]
    turns: dict[str, list[dict]]
    vecs: dict[str, np.ndarray]
    ctx: dict[str, np.ndarray]
    qvecs: np.ndarray

    @property
    def convs(self) -> list[str]:
        return sorted({q.conv for q in self.questions})


def recall_of(q: Any, ids: list[str]) -> dict[int, float]:
    return {k: len(q.gold & set(ids[:k])) / len(q.gold) for k in KS}


def summary(qs: list[Any], rec: list[dict[int, float]]) -> dict[str, Any]:
    """Pooled recall@k, the mean of the per-conversation figures, and recall@10 by category."""
    out: dict[str, Any] = {f"recall@{k}": round(statistics.fmean(r[k] for r in rec), 4) for k in KS}
    by_conv: dict[str, list[float]] = defaultdict(list)
    cats: dict[int, list[float]] = defaultdict(list)
    for q, r in zip(qs, rec):
        by_conv[q.conv].append(r[10])
        cats[q.category].append(r[10])
    out["fold_mean@10"] = round(statistics.fmean(statistics.fmean(v) for v in by_conv.values()), 4)
    out["by_cat"] = {str(c): round(statistics.fmean(v), 3) for c, v in sorted(cats.items())}
    return out


def shipped(q: Any, cands: Candidates, rows: dict, p: RetrievalParams, k: int = 10,
            model: HeadModel = HeadModel()) -> list[str]:
    """The best ``k`` ids of recall's ranking (``agentmem.recall.head.rank_candidates``, every row admitted) under
    ``p``, the learned order with ``model``'s weights (default the shipped ones)."""
    return [i for i, _ in locomo_cv.ranking(q, cands, rows, p, k, model)]


# ---------------------------------------------------------------- where the evidence sits

def diagnose(data: Data, p: RetrievalParams) -> dict[str, Any]:
    """Where the evidence of each category's questions sits under ``p``'s ranking: in the top 10, ranked 11-20
    (the head the learned order re-orders), 21-100, further down the scored pool, or outside it (no retriever nor
    spillover found it): the share of evidence turns in each, by category."""
    buckets = ("top10", "11-20", "21-100", ">100", "outside")
    count: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(buckets, 0))
    for q in data.questions:
        pq = for_query(p, q.text)
        scores, _, _ = rank_parts(q.cands, pq)
        rest = [i for i, _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))]
        top = [i for i, _ in locomo_cv.ranking(q, q.cands, data.rows, p, 20)]
        in_top = set(top)
        order = top + [i for i in rest if i not in in_top]
        pos = {i: n for n, i in enumerate(order)}
        for g in q.gold:
            n = pos.get(g)
            b = "outside" if n is None else "top10" if n < 10 else "11-20" if n < 20 else "21-100" if n < 100 \
                else ">100"
            count[q.category][b] += 1
    return {str(c): {b: round(v[b] / sum(v.values()), 3) for b in buckets} | {"evidence": sum(v.values())}
            for c, v in sorted(count.items())}


# ---------------------------------------------------------------- learning to rank over the head's features

def head_features(q: Any, cands: Candidates, rows: dict, p: RetrievalParams, depth: int, reserve: int = 0,
                  load: HeadLoader | None = None) -> tuple[list[str], np.ndarray]:
    """The shipped ranking's head of ``depth`` (ids, in the hand-set order) and the library's feature rows
    (:func:`agentmem.recall.learned_rank.features`: exactly what recall computes), the question-text cues
    (``head_cues.CUES``) as further columns. ``reserve`` > 0: the head also holds the ``reserve`` best of the dense
    and of the turn-context pools (``head_cues.widen``: a wider head the learned order can lift from). ``load``:
    the head's loader (:func:`agentmem.recall.head.head_of`; default :func:`locomo_cv.row_loader`, which a widening
    one calls)."""
    h = head_of(q.text, cands, p, depth, reserve, load or locomo_cv.row_loader(rows))
    X = features(q.text, h.entries, h.order, cands, h.fused, h.spilled, h.params)
    return [i for i, _ in h.order], np.hstack([X, cue_columns(q.text, h.entries, h.order, cands)])


def columns_of(cue_set: str) -> list[int]:
    """The feature columns of a ``--cues`` item: "none" (the shipped 20), "all", or cue names joined by commas."""
    names = [] if cue_set == "none" else list(CUES) if cue_set == "all" else cue_set.split(",")
    return list(range(len(FEATURES))) + [len(FEATURES) + CUES.index(n) for n in names]


# ``--monotone`` sets: feature columns whose weight is held >= 0 (more of it never ranks an entry lower)
MONOTONE = {"none": (), "dense": ("dense", "dense_rank", "context", "context_rank", "in_dense"),
            "evidence": ("dense", "dense_rank", "context", "context_rank", "in_dense", "lexical", "lexical_rank",
                         "in_lexical", "share", "score")}


def fit_lr(X: np.ndarray, y: np.ndarray, l2: float, steps: int = 40, nonneg: list[int] | None = None
           ) -> np.ndarray:
    """Logistic regression by Newton's method on standardised columns (weights include the scaling and bias);
    ``nonneg``: columns whose weight is held >= 0 (standardising keeps a weight's sign)."""
    mu, sd = X.mean(0), X.std(0) + 1e-9
    Z, yy = (X - mu) / sd, np.asarray(y, dtype=np.float64)
    # a held fit takes up to twice the steps: a weight that meets 0 leaves the step, and Newton goes on without it
    w = fit_logistic(Z, yy, l2=l2, steps=2 * steps if nonneg else steps, nonneg=nonneg or ())
    return np.concatenate([w[:-1] / sd, [w[-1] - float((w[:-1] / sd) @ mu)]])


def lr_rank(ids: list[str], X: np.ndarray, w: np.ndarray, blend: float) -> list[str]:
    """Head re-ordered by blend × the model's logit + (1 - blend) × the shipped score's share of the top."""
    z = X @ w[:-1] + w[-1]
    s = blend * z + (1 - blend) * X[:, 0] * 10.0
    return [ids[n] for n in sorted(range(len(ids)), key=lambda n: (-s[n], n))]


def ltr(data: Data, p: RetrievalParams, depth: int, cols: list[int] | None = None, feats: list | None = None,
        reserve: int = 0, nonneg: list[int] | None = None) -> dict[str, Any]:
    """LTR over the head of ``depth`` (the feature columns ``cols``, default the shipped 20); l2 and blend chosen
    inside the 4 training conversations. ``feats``: :func:`head_features` of every question, when already made."""
    feats = feats or [head_features(q, q.cands, data.rows, p, depth, reserve) for q in data.questions]
    cols = cols or list(range(len(FEATURES)))
    return ltr_nested(data, {"": [(ids, X[:, cols]) for ids, X in feats]}, nonneg=nonneg)


def inner_cv(qs: list[Any], train_convs: list[str], configs: list[Any],
             recall_on: Callable[[list[int], list[int], Any], list[dict[int, float]]]) -> dict[Any, float]:
    """Each config's summed recall@5 + @10, leave-one-conversation-out inside ``train_convs``: ``recall_on(train,
    validation, cfg)`` (question indices) fits on the one and returns the other's per-question recall. Empty (every
    config 0) when there is one config: nothing to choose.

    Example:
        >>> qs = [type("Q", (), {"conv": c})() for c in "xyz"]
        >>> dict(inner_cv(qs, ["x", "y"], ["a", "b"], lambda tr, va, cfg: [{5: 1.0, 10: float(cfg == "b")}] * len(va)))
        {'a': 2.0, 'b': 4.0}
    """
    inner: dict[Any, float] = defaultdict(float)
    for v in train_convs if len(configs) > 1 else ():
        tr = [j for j, q in enumerate(qs) if q.conv in train_convs and q.conv != v]
        va = [j for j, q in enumerate(qs) if q.conv == v]
        for cfg in configs:
            inner[cfg] += sum(r[k] for r in recall_on(tr, va, cfg) for k in KS)
    return inner


@dataclass(frozen=True)
class Logistic:
    """:func:`fit_lr` / :func:`lr_rank` as :func:`ltr_fold`'s learner: a setting is (l2, blend); ``nonneg``: the
    columns whose weight is held >= 0. Another learner (``research/head_model_ablation.py``) has the same two
    methods: ``fit(X, y, sizes, setting)`` (``sizes``: the rows of each head, in order) and ``rank(heads, model,
    setting)`` (every head's ids re-ordered).

    Example:
        >>> m = Logistic().fit(np.array([[0.0], [1.0]] * 5), np.array([0.0, 1.0] * 5), [2] * 5, (1.0, 1.0))
        >>> Logistic().rank([(["a", "b"], np.array([[0.0], [1.0]]))], m, (1.0, 1.0))
        [['b', 'a']]
    """

    nonneg: tuple[int, ...] | None = None

    def fit(self, X: np.ndarray, y: np.ndarray, sizes: list[int], setting: tuple) -> np.ndarray:
        return fit_lr(X, y, setting[0], nonneg=list(self.nonneg) if self.nonneg else None)

    def rank(self, heads: list[tuple[list[str], np.ndarray]], w: np.ndarray, setting: tuple) -> list[list[str]]:
        return [lr_rank(ids, X, w, setting[1]) for ids, X in heads]


def ltr_fold(data: Data, variants: dict[str, list], held_conv: str,
             settings: list[tuple] | None = None, nonneg: list[int] | None = None, learner: Any = None
             ) -> tuple[dict[int, dict[int, float]], tuple, Any]:
    """One outer fold of :func:`ltr_nested`: the head / feature set (``variants``: name -> every question's (head
    ids, feature rows)), the l2 weight and the blend (of ``settings``, default a grid) chosen by
    leave-one-conversation-out inside every conversation but ``held_conv``, fitted on all of them and scored on
    ``held_conv``'s questions. ``learner``: the model (default :class:`Logistic` with ``nonneg``; another one's
    ``settings`` are its own). Returns question index -> recall, the chosen (variant, *setting), the fitted model."""
    qs = data.questions
    learner = learner or Logistic(tuple(nonneg) if nonneg else None)
    settings = settings or [(l2, b) for l2 in (0.1, 10.0, 1000.0) for b in (0.25, 0.5, 1.0)]
    configs = [(name, *s) for name in variants for s in settings]

    def train(members: list[int], cfg: tuple) -> Any:
        X = np.concatenate([variants[cfg[0]][j][1] for j in members])
        y = np.concatenate([[float(i in qs[j].gold) for i in variants[cfg[0]][j][0]] for j in members])
        return learner.fit(X, y, [len(variants[cfg[0]][j][0]) for j in members], cfg[1:])

    def score(members: list[int], w: Any, cfg: tuple) -> list[dict[int, float]]:
        ranked = learner.rank([variants[cfg[0]][j] for j in members], w, cfg[1:])
        return [recall_of(qs[j], ids) for j, ids in zip(members, ranked)]

    train_convs = [d for d in data.convs if d != held_conv]
    inner = inner_cv(qs, train_convs, configs, lambda tr, va, cfg: score(va, train(tr, cfg), cfg))
    best = max(configs, key=lambda cfg: inner[cfg])
    te = [j for j, q in enumerate(qs) if q.conv == held_conv]
    w = train([j for j, q in enumerate(qs) if q.conv != held_conv], best)
    return dict(zip(te, score(te, w, best))), best, w


def ltr_nested(data: Data, variants: dict[str, list], settings: list[tuple[float, float]] | None = None,
               nonneg: list[int] | None = None) -> dict[str, Any]:
    """LTR with the head / feature set (``variants``: name -> every question's (head ids, feature rows)), the l2
    weight and the blend (of ``settings``, default a grid) all chosen by leave-one-conversation-out inside the 4
    training conversations (:func:`ltr_fold`); one variant and one setting: that model fitted on each fold's 4
    (how the shipped weights are made: the median of the five fits)."""
    qs = data.questions
    held: list[dict[int, float]] = [{} for _ in qs]
    chosen, weights = [], []
    for c in data.convs:
        got, best, w = ltr_fold(data, variants, c, settings, nonneg)
        for j, r in got.items():
            held[j] = r
        chosen.append({"l2": best[1], "blend": best[2]} | ({"variant": best[0]} if len(variants) > 1 else {}))
        weights.append([round(float(v), 4) for v in w])
    first = next(iter(variants.values()))
    head_only = [recall_of(q, ids) for q, (ids, _) in zip(qs, first)]
    out = {"cv": summary(qs, held), "shipped_same_head": summary(qs, head_only), "chosen": chosen,
           "weights": weights}
    if len({len(w) for w in weights}) == 1:
        out["median_weights"] = [round(statistics.median(w[n] for w in weights), 4) for n in range(len(weights[0]))]
    return out


# ---------------------------------------------------------------- a learned linear query adapter

def unique_turns(data: Data) -> dict[str, tuple[list[str], np.ndarray, np.ndarray]]:
    """Per conversation: distinct entry ids, their unit vectors and unit context vectors."""
    out = {}
    for cid, ts in data.turns.items():
        seen: dict[str, int] = {}
        for n, t in enumerate(ts):
            seen.setdefault(t["id"], n)
        idx = list(seen.values())
        v, c = data.vecs[cid][idx], data.ctx[cid][idx]
        out[cid] = (list(seen), v / np.linalg.norm(v, axis=1, keepdims=True),
                    c / np.linalg.norm(c, axis=1, keepdims=True))
    return out


def exact_cands(q: Any, qv: np.ndarray, conv: tuple, places: dict, pool: int = 100) -> Candidates:
    """The store's candidates for ``q`` with the dense and turn-context pools searched exactly with ``qv``."""
    ids, V, C = conv
    qv = qv / np.linalg.norm(qv)
    d, c = V @ qv, C @ qv
    dense = {ids[n]: float(d[n]) for n in np.argsort(-d)[:pool]}
    ctx = {ids[n]: float(c[n]) for n in np.argsort(-c)[:pool]}
    wanted = dense.keys() | q.cands.lexical.keys() | ctx.keys()
    return Candidates(dense, dict(q.cands.lexical), {i: places[i] for i in wanted if i in places}, turn_context=ctx)


def train_adapter(qv: np.ndarray, gold: list[list[int]], conv_of: list[str], V: dict[str, np.ndarray], *,
                  rank: int, l2: float, steps: int, tau: float = 20.0, seed: int = 0) -> np.ndarray:
    """W (d × d) for q' = normalise(q + q W), trained by softmax over each question's conversation turns."""
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(1)  # a shared 2-core machine: one thread is as fast as two for these sizes
    d = qv.shape[1]
    groups = defaultdict(list)
    for j, c in enumerate(conv_of):
        groups[c].append(j)
    Q = {c: torch.tensor(qv[js], dtype=torch.float32) for c, js in groups.items()}
    Vt = {c: torch.tensor(V[c], dtype=torch.float32) for c in groups}
    target = {}
    for c, js in groups.items():
        t = torch.zeros(len(js), V[c].shape[0])
        for r, j in enumerate(js):
            t[r, gold[j]] = 1.0 / len(gold[j])
        target[c] = t
    if rank >= d:
        A = torch.zeros(d, d, requires_grad=True)
        params = [A]
        W = lambda: A  # noqa: E731
    else:
        A = (0.01 * torch.randn(d, rank)).requires_grad_()
        B = torch.zeros(rank, d, requires_grad=True)
        params = [A, B]
        W = lambda: A @ B  # noqa: E731
    opt = torch.optim.Adam(params, lr=1e-3)
    n = sum(len(js) for js in groups.values())
    for _ in range(steps):
        opt.zero_grad()
        Wm = W()
        loss = 0.0
        for c in groups:
            q2 = Q[c] + Q[c] @ Wm
            q2 = q2 / q2.norm(dim=1, keepdim=True)
            logp = torch.log_softmax(tau * q2 @ Vt[c].T, dim=1)
            loss = loss - (target[c] * logp).sum() / n
        loss = loss + l2 * (Wm ** 2).sum()
        loss.backward()
        opt.step()
    return W().detach().numpy()


def adapter(data: Data, p: RetrievalParams) -> dict[str, Any]:
    """The query adapter, CV over conversations; rank / l2 / steps chosen inside the 4 training ones."""
    qs, conv = data.questions, unique_turns(data)
    pos = {c: {i: n for n, i in enumerate(conv[c][0])} for c in conv}
    gold = [[pos[q.conv][i] for i in q.gold if i in pos[q.conv]] for q in qs]
    conv_of = [q.conv for q in qs]
    V = {c: conv[c][1] for c in conv}
    qv = data.qvecs / np.linalg.norm(data.qvecs, axis=1, keepdims=True)
    configs = [None] + [(r, l2, s) for r, l2, s in ((384, 0.01, 200), (384, 0.1, 200), (32, 0.01, 200),
                                                    (384, 0.01, 600))]

    def run(members: list[int], W: np.ndarray | None) -> list[dict[int, float]]:
        out = []
        for j in members:
            v = qv[j] if W is None else qv[j] + qv[j] @ W
            out.append(recall_of(qs[j], shipped(qs[j], exact_cands(qs[j], v, conv[qs[j].conv], data.places),
                                                 data.rows, p)))
        return out

    def fit(members: list[int], cfg) -> np.ndarray | None:
        if cfg is None:
            return None
        ok = [j for j in members if gold[j]]
        return train_adapter(qv[ok], [gold[j] for j in ok], [conv_of[j] for j in ok], V,
                             rank=cfg[0], l2=cfg[1], steps=cfg[2])

    held: list[dict[int, float]] = [{} for _ in qs]
    chosen, inner_scores = [], []
    for c in data.convs:
        train_convs = [d for d in data.convs if d != c]
        inner = inner_cv(qs, train_convs, configs, lambda tr, va, cfg: run(va, fit(tr, cfg)))
        best = max(configs, key=lambda cfg: (inner[cfg], cfg is None))
        tr = [j for j, q in enumerate(qs) if q.conv != c]
        te = [j for j, q in enumerate(qs) if q.conv == c]
        for j, r in zip(te, run(te, fit(tr, best))):
            held[j] = r
        chosen.append(best)
        inner_scores.append({str(cfg): round(s, 2) for cfg, s in inner.items()})
        print("adapter fold", c, best, inner_scores[-1], flush=True)
    exact = run(list(range(len(qs))), None)
    return {"cv": summary(qs, held), "exact_baseline": summary(qs, exact), "chosen": [str(b) for b in chosen],
            "inner": inner_scores}


def run_ltr(data: Data, p: RetrievalParams, args: argparse.Namespace, feats_of: Any, nonneg: list[int] | None,
            tag: str, result: dict[str, Any]) -> None:
    """The ``ltr`` / ``ltr_choose`` / ``fit`` signals of ``args`` with the ``nonneg`` weights held >= 0, each
    result stored under its name + ``tag``."""
    if "ltr" in args.signals:
        for depth, reserve in itertools.product(args.depth, args.reserve):
            feats = feats_of(depth, reserve)
            for cue_set in args.cues:
                t0 = time.time()
                name = f"ltr_d{depth}" + (f"r{reserve}" if reserve else "")
                name += ("" if cue_set == "none" else f"+{cue_set}") + tag
                result[name] = ltr(data, p, depth, columns_of(cue_set), feats, nonneg=nonneg)
                print(name, {k: v for k, v in result[name].items() if k != "weights"}, round(time.time() - t0, 1),
                      flush=True)
    if "ltr_choose" in args.signals:  # the head's width and the feature set chosen inside the folds too
        variants = {}
        for depth, reserve in itertools.product(args.depth, args.reserve):
            feats = feats_of(depth, reserve)
            for cue_set in args.cues:
                cols = columns_of(cue_set)
                variants[f"d{depth}r{reserve}+{cue_set}"] = [(ids, X[:, cols]) for ids, X in feats]
        t0 = time.time()
        result["ltr_choose" + tag] = ltr_nested(data, variants, nonneg=nonneg)
        print("ltr_choose" + tag, {k: v for k, v in result["ltr_choose" + tag].items() if k != "weights"},
              round(time.time() - t0, 1), flush=True)
    if "fit" in args.signals:  # the shipped setting fitted per fold: its held-out figure and the median weights
        depth, reserve, cue_set = args.depth[0], args.reserve[0], args.cues[0]
        feats = feats_of(depth, reserve)
        cols = columns_of(cue_set)
        result["fit" + tag] = ltr_nested(data, {f"d{depth}r{reserve}+{cue_set}": [(ids, X[:, cols])
                                                                                  for ids, X in feats]},
                                         [(args.fit_l2, args.fit_blend)], nonneg=nonneg)
        print("fit" + tag, {k: v for k, v in result["fit" + tag].items() if k != "weights"}, flush=True)


class _Unpickler(pickle.Unpickler):
    """The cache's rows were pickled by ``_locomo_cache`` run as ``__main__``: find their class there."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "__main__" and name == "Row":
            return _locomo_cache.Row
        return super().find_class(module, name)


def load_cache(path: Path) -> dict[str, Any]:
    """The dict ``research/_locomo_cache.py`` wrote."""
    with path.open("rb") as f:
        return _Unpickler(f).load()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True, type=Path)
    ap.add_argument("--signals", nargs="+", default=["ltr", "adapter"])
    ap.add_argument("--depth", type=int, nargs="+", default=[20, 40])
    ap.add_argument("--reserve", type=int, nargs="+", default=[0],
                    help="ltr's head also holds this many of the best of the dense and turn-context pools")
    ap.add_argument("--fit-l2", type=float, default=10.0, help="fit: the L2 weight (standardised features)")
    ap.add_argument("--fit-blend", type=float, default=1.0, help="fit: the blend with the hand-set order")
    ap.add_argument("--monotone", nargs="+", default=["none"], choices=list(MONOTONE),
                    help="weights held >= 0: none, dense (the dense / context features), evidence (+ BM25, share)")
    ap.add_argument("--cues", nargs="+", default=["none"],
                    help="feature sets for ltr: none (the shipped 20), all, or question-text cue names joined by "
                    "commas (agentmem.recall.head_cues.CUES), each added to the 20")
    args = ap.parse_args()
    data = Data(**load_cache(args.cache))
    p = RetrievalParams(learned_head=False)  # the baseline: the ranking without the learned head order
    result: dict[str, Any] = {"baseline": summary(data.questions, [recall_of(q, shipped(q, q.cands, data.rows, p))
                                                                   for q in data.questions])}
    print("baseline", result["baseline"], flush=True)
    if "diagnose" in args.signals:
        for name, params in (("hand_set", p), ("learned_head", RetrievalParams())):
            result[f"evidence_{name}"] = diagnose(data, params)
            print(f"evidence_{name}", result[f"evidence_{name}"], flush=True)
    # every question's head and feature rows for one head shape, made once for all the signals that use it
    feats_of = functools.cache(lambda depth, reserve: [head_features(q, q.cands, data.rows, p, depth, reserve)
                                                       for q in data.questions])
    for mono in args.monotone:  # each set of weights held >= 0 ("none": the unconstrained fit)
        nonneg = [FEATURES.index(f) for f in MONOTONE[mono]] or None
        tag = "" if mono == "none" else f"~{mono}"
        run_ltr(data, p, args, feats_of, nonneg, tag, result)
    if "adapter" in args.signals:
        t0 = time.time()
        result["adapter"] = adapter(data, p)
        print("adapter", {k: v for k, v in result["adapter"].items() if k != "inner"}, round(time.time() - t0, 1),
              flush=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
