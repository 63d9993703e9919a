"""Why does recall fall off with history length (issue #38), and does a wider candidate pool fix it?

From the caches of ``research/_locomo_cache.py`` built with a wide pool (``--pool 300``: each retriever's best 300),
for each dev set and each pool size N of ``--pools``: recall's ranking (``locomo_cv.ranking``, the shipped weights)
over the candidates each retriever would have returned with ``candidate_pool`` N (the cached best N of the dense,
lexical and turn-context pools; the turn-context pool capped by ``context_pool`` as recall caps it). Reported:
recall@5/@10 overall and by category, recall@10 of the evidence turns by age (how many turns of the conversation
come after it; the edges of ``research/recall_by_length.py``), and where each evidence turn sits by age: in the top
10, ranked 11-20 (by a recall with k=20), further down the scored pool, or outside it (no retriever nor
spillover found it). Two controls for the questions' own difficulty (older evidence may belong to harder questions):
``by_cat_age``, recall@10 by category for evidence younger and older than 284 turns (the median edge), and
``within_question``, over the questions whose evidence turns lie at different ages, how often the oldest and the
newest of them is found (the same question, the same store, only the age differs).

    python research/_locomo_cache.py --data ../shared/data/locomo/locomo_dev5.json --store S1 --out L300.pkl --pool 300
    python research/_locomo_cache.py --data ../shared/data/realtalk/realtalk_dev5.json --store S2 --out R300.pkl --pool 300
    python research/length_ablation.py --L L300.pkl --R R300.pkl --pools 100 200 300
    python research/length_ablation.py --L L300.pkl --R R300.pkl --pools 100 --set learned_head=false session_weight=0

``--set name=value`` ranks with those ``RetrievalParams`` fields changed (one variant each, beside the shipped one).

Last line: {"L": {"100": {"recall@5": ..., "recall@10": ..., "by_cat": {...}, "by_age": [...],
"where_by_age": [...]}, ...}, "R": {...}, "edges": [...]}
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]

import learned_ablation as la  # noqa: E402
import locomo_cv  # noqa: E402

from agentmem.recall.multihop import for_query  # noqa: E402
from agentmem.recall.retrieval import Candidates, RetrievalParams, best_first, rank_parts  # noqa: E402

EDGES = [2, 105, 200, 284, 354, 459, 678, 10**9]  # research/recall_by_length.py's age edges (both dev sets)
PLACES = ("top10", "11-20", "scored", "outside")


def narrowed(cands: Candidates, pool: int, context_pool: int) -> Candidates:
    """``cands`` as a search with ``candidate_pool`` = ``pool`` would have returned them: each pool's best ``pool``.

    Example:
        >>> c = narrowed(Candidates({"a": 0.9, "b": 0.1}, {"b": 2.0}), 1, 100)
        >>> c.dense, c.lexical
        ({'a': 0.9}, {'b': 2.0})
    """
    def top(scores: dict[str, float], n: int) -> dict[str, float]:
        return dict(best_first(scores)[:n])

    return Candidates(top(cands.dense, pool), top(cands.lexical, pool), cands.places,
                      turn_context=top(cands.turn_context, min(pool, context_pool)))


def ages(data: la.Data) -> dict[str, int]:
    """Every entry's age: how many turns of its conversation come after its last turn."""
    out: dict[str, int] = {}
    for turns in data.turns.values():
        for n, t in enumerate(turns):
            out[t["id"]] = len(turns) - 1 - n
    return out


def bucket(age: int) -> int:
    return next(b for b, (lo, hi) in enumerate(zip(EDGES, EDGES[1:])) if lo <= age < hi)


def evaluate(data: la.Data, pool: int, p: RetrievalParams) -> dict[str, Any]:
    """recall@5/@10 and the evidence's place by age, the candidates narrowed to ``pool``."""
    age_of = ages(data)
    rec, found, by_cat_age = [], defaultdict(list), defaultdict(list)
    oldest, newest = [], []
    where: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(PLACES, 0))
    for q in data.questions:
        cands = narrowed(q.cands, pool, p.context_pool)
        # recall(k=10)'s order; the head it re-orders is sized by k, so places 11-20 come from a k=20 ranking
        top = [i for i, _ in locomo_cv.ranking(q, cands, data.rows, p, 10)]
        top += [i for i, _ in locomo_cv.ranking(q, cands, data.rows, p, 20) if i not in top][:10]
        rec.append(la.recall_of(q, top))
        scored = rank_parts(cands, for_query(p, q.text))[0]
        for g in q.gold:
            b = bucket(age_of.get(g, 0))
            n = top.index(g) if g in top else None
            place = "top10" if n is not None and n < 10 else "11-20" if n is not None else \
                "scored" if g in scored else "outside"
            where[b][place] += 1
            found[b].append(place == "top10")
            by_cat_age[(q.category, "old" if age_of.get(g, 0) >= 284 else "young")].append(place == "top10")
        spread = sorted(q.gold, key=lambda g: age_of.get(g, 0))
        if len(spread) > 1 and age_of.get(spread[0], 0) != age_of.get(spread[-1], 0):
            newest.append(spread[0] in top[:10])
            oldest.append(spread[-1] in top[:10])
    summary = la.summary(data.questions, rec)
    return {"recall@5": summary["recall@5"], "recall@10": summary["recall@10"], "by_cat": summary["by_cat"],
            "by_age": [{"age": EDGES[b:b + 2], "turns": len(v), "recall@10": round(statistics.fmean(v), 4)}
                       for b, v in sorted(found.items())],
            "where_by_age": [{"age": EDGES[b:b + 2]} | {k: round(v[k] / sum(v.values()), 3) for k in PLACES}
                             for b, v in sorted(where.items())],
            "by_cat_age": {f"{c}/{a}": {"turns": len(v), "recall@10": round(statistics.fmean(v), 3)}
                           for (c, a), v in sorted(by_cat_age.items())},
            "within_question": {"questions": len(oldest), "oldest_found": round(statistics.fmean(oldest), 3),
                                "newest_found": round(statistics.fmean(newest), 3)} if oldest else {}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--L", required=True, type=Path, help="LoCoMo dev cache, wide pool (research/_locomo_cache.py)")
    ap.add_argument("--R", required=True, type=Path, help="REALTALK dev cache, wide pool")
    ap.add_argument("--pools", type=int, nargs="+", default=[100, 200, 300])
    ap.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                    help="variants: RetrievalParams fields changed one at a time (JSON values)")
    args = ap.parse_args()
    shipped = RetrievalParams()
    variants = {"shipped": shipped} | {s: replace(shipped, **{s.split("=")[0]: json.loads(s.split("=", 1)[1])})
                                       for s in args.set}
    result: dict[str, Any] = {"edges": EDGES}
    for name, path in (("L", args.L), ("R", args.R)):
        data = la.Data(**la.load_cache(path))
        result[name] = {}
        for vname, p in variants.items():
            for pool in args.pools:
                key = str(pool) if vname == "shipped" else f"{vname}@{pool}"
                result[name][key] = evaluate(data, pool, p)
                print(name, key, json.dumps(result[name][key]), file=sys.stderr, flush=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
