"""Do recall's fitted ranking parts hold on a dataset they were not fitted on? (issue #38, "generalise")

Two dev sets, each cached by ``research/_locomo_cache.py`` (one ingest with the default consolidation, the store's
own candidates): ``L`` = LoCoMo dev, ``R`` = REALTALK dev. Everything is ranked by the library's own functions over
those candidates (``locomo_cv.ranking``), so the figures are recall's end-to-end order without conflict demotion.

* ``retrieval``: the scalars of ``ranking.json``'s "retrieval" group that ``benchmarks/locomo.py``'s grid moves, one
  at a time (each other value of the grid, and 0 for a boost: the part dropped), plus ``learned_head=False`` and
  ``head_reserve=0``. Every variant's recall@5/@10 on both sets beside the shipped ranking's. The cross-dataset
  choice: the variant (shipped included) with the best summed recall@5 + @10 on one set, scored on the other.
* ``head``: the learned head order (``learned_rank.HeadModel``; shipped = fitted on LoCoMo dev). Refitted with the
  shipped recipe (head 20 + reserve 20, the 20 features + 4 cues, L2 0.1 on standardised features, dense / context
  weights held >= 0, blend 1) on all of one set and scored on the other (``L->R``, ``R->L``); in-sample is each
  set's leave-one-conversation-out figure of the same recipe (fitted on the other conversations of that set). The
  hand-set order (no learned head) beside it.

    python research/_locomo_cache.py --data ../shared/data/locomo/locomo_dev5.json --store S1 --out /tmp/L.pkl
    python research/_locomo_cache.py --data ../shared/data/realtalk/realtalk_dev5.json --store S2 --out /tmp/R.pkl
    python research/ranking_crossfit.py --L /tmp/L.pkl --R /tmp/R.pkl

Last line: {"retrieval": {"shipped": {"L": {...}, "R": {...}}, "<name>=<value>": {...}, ...,
"choice": {"L->R": ..., "R->L": ...}}, "head": {"shipped": ..., "hand_set": ..., "in_sample": ..., "L->R": ...,
"R->L": ...}}
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]

import learned_ablation as la  # noqa: E402
import locomo  # noqa: E402
import locomo_cv  # noqa: E402

from agentmem.recall.learned_rank import FEATURES  # noqa: E402
from agentmem.recall.retrieval import RetrievalParams  # noqa: E402

# the shipped head recipe (ranking.json's head_model provenance)
DEPTH, RESERVE, CUES, L2, BLEND = 20, 20, "overlap,rare_overlap,session_mass,list_first", 0.1, 1.0
# one-at-a-time alternatives: locomo.py's grid, 0 for each boost (the part dropped), the head switched off / narrowed
# spillover is not in locomo.py's grid (hand-set in round 1): its values here, 0 the part dropped
ALTERNATIVES: dict[str, list[Any]] = {**{k: list(v) for k, v in locomo_cv.GRID.items()},
                                      "spillover": [0.05, 0.1, 0.15], "learned_head": [False], "head_reserve": [0]}


def brief(qs: list[Any], rec: list[dict[int, float]]) -> dict[str, Any]:
    s = la.summary(qs, rec)
    return {"recall@5": s["recall@5"], "recall@10": s["recall@10"], "by_cat": s["by_cat"]}


def retrieval_table(sets: dict[str, la.Data], only: list[str] | None = None) -> dict[str, Any]:
    """Shipped and one-at-a-time variants (of the ``only`` parameters, default all) on both sets, and the
    cross-dataset choice among them."""
    shipped = RetrievalParams()
    variants = {"shipped": shipped}
    for name, values in ALTERNATIVES.items():
        if only and name not in only:
            continue
        for value in dict.fromkeys([*values, *([0.0] if name.endswith("_boost") or name == "spillover" else [])]):
            if value != getattr(shipped, name):
                variants[f"{name}={value}"] = replace(shipped, **{name: value})
    table: dict[str, Any] = {}
    sums: dict[str, dict[str, float]] = {}
    for vname, p in variants.items():
        table[vname], sums[vname] = {}, {}
        for dname, data in sets.items():
            rec = [la.recall_of(q, la.shipped(q, q.cands, data.rows, p)) for q in data.questions]
            table[vname][dname] = brief(data.questions, rec)
            sums[vname][dname] = table[vname][dname]["recall@5"] + table[vname][dname]["recall@10"]
        print(vname, json.dumps(table[vname]), file=sys.stderr, flush=True)
    choice = {}
    for fit, score in (("L", "R"), ("R", "L")):
        best = max(variants, key=lambda v: (sums[v][fit], v == "shipped"))
        choice[f"{fit}->{score}"] = {"chosen": best, "in_sample": table[best][fit], "scored": table[best][score],
                                     "shipped": table["shipped"][score]}
    for d in sets:
        best = max(variants, key=lambda v: (sums[v][d], v == "shipped"))
        choice[f"in_sample_{d}"] = {"chosen": best, "scored": table[best][d]}
    return {**table, "choice": choice}


def head_table(sets: dict[str, la.Data]) -> dict[str, Any]:
    """The learned head: shipped, hand-set order, in-sample (leave one conversation out) and cross-dataset refits."""
    base = RetrievalParams(learned_head=False)
    cols = la.columns_of(CUES)
    nonneg = [FEATURES.index(f) for f in la.MONOTONE["dense"]]
    heads: dict[str, list[tuple[list[str], np.ndarray]]] = {}
    for d, data in sets.items():
        heads[d] = [(ids, X[:, cols]) for ids, X in
                    (la.head_features(q, q.cands, data.rows, base, DEPTH, RESERVE) for q in data.questions)]

    def fit(d: str, members: list[int]) -> np.ndarray:
        qs = sets[d].questions
        X = np.concatenate([heads[d][j][1] for j in members])
        y = np.concatenate([[float(i in qs[j].gold) for i in heads[d][j][0]] for j in members])
        return la.fit_lr(X, y, L2, nonneg=nonneg)

    def scored(d: str, w: np.ndarray, members: list[int]) -> list[dict[int, float]]:
        qs = sets[d].questions
        return [la.recall_of(qs[j], la.lr_rank(*heads[d][j], w, BLEND)) for j in members]

    out: dict[str, Any] = {"shipped": {}, "hand_set": {}, "in_sample": {}}
    weights = {}
    for d, data in sets.items():
        qs = data.questions
        out["shipped"][d] = brief(qs, [la.recall_of(q, la.shipped(q, q.cands, data.rows, RetrievalParams()))
                                       for q in qs])
        out["hand_set"][d] = brief(qs, [la.recall_of(q, la.shipped(q, q.cands, data.rows, base)) for q in qs])
        held: list[dict[int, float]] = [{} for _ in qs]
        for c in data.convs:
            test = [j for j, q in enumerate(qs) if q.conv == c]
            w = fit(d, [j for j, q in enumerate(qs) if q.conv != c])
            for j, r in zip(test, scored(d, w, test)):
                held[j] = r
        out["in_sample"][d] = brief(qs, held)
        weights[d] = fit(d, list(range(len(qs))))
    for a, b in (("L", "R"), ("R", "L")):
        out[f"{a}->{b}"] = brief(sets[b].questions, scored(b, weights[a], list(range(len(sets[b].questions)))))
    out["refit_weights"] = {d: [round(float(v), 4) for v in w] for d, w in weights.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--L", required=True, type=Path, help="LoCoMo dev cache (research/_locomo_cache.py)")
    ap.add_argument("--R", required=True, type=Path, help="REALTALK dev cache (research/_locomo_cache.py)")
    ap.add_argument("--parts", nargs="+", default=["retrieval", "head"], choices=["retrieval", "head"])
    ap.add_argument("--only", nargs="*", default=None, choices=list(ALTERNATIVES),
                    help="the retrieval table's variants of these parameters only (default: all)")
    args = ap.parse_args()
    sets = {"L": la.Data(**la.load_cache(args.L)), "R": la.Data(**la.load_cache(args.R))}
    result: dict[str, Any] = {"questions": {d: len(s.questions) for d, s in sets.items()}}
    if "retrieval" in args.parts:
        result["retrieval"] = retrieval_table(sets, args.only)
    if "head" in args.parts:
        result["head"] = head_table(sets)
        print("head", json.dumps({k: v for k, v in result["head"].items() if k != "refit_weights"}),
              file=sys.stderr, flush=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
