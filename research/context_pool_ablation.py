"""A smaller turn-context pool (issue #16, recall latency): the cached LoCoMo candidates
(``research/_locomo_cache.py``, pools stored at 100, best first) with the turn-context pool cut to its best ``n``
(what a search asking for ``n`` returns) and the placements of the context-only ids it drops removed, scored two
ways: the shipped ranking with its fixed learned-head weights (fitted on the 100-pool), and the nested CV of
``research/category_ablation.py``'s ``base`` (the shipped head refitted inside the folds: L2 / blend chosen by
leave-one-conversation-out inside the 4 training conversations, scored on the 5th).

    python research/context_pool_ablation.py --cache /tmp/q-cache.pkl --sizes 100 50 30

Last line: {"<n>": {"fixed": {...}, "refit": {...}}, ...}
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]  # research/, benchmarks/
import category_ablation as ca  # noqa: E402
import learned_ablation as la  # noqa: E402

from agentmem.recall.learned_rank import FEATURES, HeadModel  # noqa: E402
from agentmem.recall.retrieval import Candidates, RetrievalParams, best_first  # noqa: E402


def cut(cands: Candidates, n: int) -> Candidates:
    """``cands`` with the turn-context pool cut to its best ``n`` and only the kept ids' placements.

    Example:
        >>> c = cut(Candidates({"a": 0.9}, {}, {"a": 1, "b": 2, "c": 3}, turn_context={"b": 0.8, "c": 0.7}), 1)
        >>> c.turn_context, sorted(c.places)
        ({'b': 0.8}, ['a', 'b'])
    """
    ctx = dict(best_first(cands.turn_context)[:n])
    keep = cands.dense.keys() | cands.lexical.keys() | ctx.keys()
    return Candidates(dict(cands.dense), dict(cands.lexical), {i: p for i, p in cands.places.items() if i in keep},
                      context=dict(cands.context), turn_context=ctx)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True, type=Path)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 50, 30])
    ap.add_argument("--refit-weights", action="store_true",
                    help="also: the shipped weights refitted on the cut pools (median of the five fold fits), in-sample")
    args = ap.parse_args()
    data = la.Data(**la.load_cache(args.cache))
    vecs = ca.unit_vectors(data)
    hand = RetrievalParams(learned_head=False)
    nonneg = [FEATURES.index(f) for f in la.MONOTONE["dense"]]
    opts = argparse.Namespace(rescue_depth=50, draw_sessions=3)
    result: dict[str, Any] = {}
    for n in args.sizes:
        t0 = time.time()
        qs = []
        for q in data.questions:
            qq = copy.copy(q)
            qq.cands = cut(q.cands, n)
            qs.append(qq)
        fixed = la.summary(qs, [la.recall_of(q, la.shipped(q, q.cands, data.rows, RetrievalParams())) for q in qs])
        feats = [ca.head(q, data.rows, hand, vecs, opts, "") for q in qs]
        feats = [(ids, X[:, ca.columns("")]) for ids, X in feats]
        r = la.ltr_nested(data, {"base": feats}, nonneg=nonneg)
        refitted = {}
        if args.refit_weights:  # the shipped setting (L2 0.1, blend 1) fitted per fold; its median weights shipped
            med = la.ltr_nested(data, {"base": feats}, [(0.1, 1.0)], nonneg=nonneg)["median_weights"]
            model = HeadModel(weights=tuple(med[:-1]), bias=med[-1])
            refitted = la.summary(qs, [la.recall_of(q, la.shipped(q, q.cands, data.rows, RetrievalParams(),
                                                                  model=model)) for q in qs])
            refitted["median_weights"] = med
        result[str(n)] = {"fixed": fixed, "fixed_refitted_weights": refitted, "refit": r["cv"], "chosen": r["chosen"],
                          "head_mean": round(sum(len(i) for i, _ in feats) / len(feats), 1)}
        print(n, json.dumps(result[str(n)]), round(time.time() - t0, 1), flush=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
