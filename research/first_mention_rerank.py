"""Does pulling an earlier near-duplicate of a top-10 turn into the top 10 win back old evidence? (issue #38, long
histories: later turns about the same topic outrank the early evidence.)

Over caches of ``research/_locomo_cache.py`` (own length, and grown by ``research/padded_dataset.py``): recall's shipped
ranking (``learned_ablation.shipped``, 40 deep); then for each turn ranked 11..``depth``, if it was said before some
top-10 turn and their stored vectors' cosine is at least ``tau``, it is inserted right after that turn (at most two
per question), and the list cut back to 10. Prints recall@5 / @10 per cache for each (tau, depth); the last line JSON.

    python research/first_mention_rerank.py /tmp/L0.pkl /tmp/R0.pkl /tmp/L-own.pkl /tmp/R-own.pkl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]
import learned_ablation as la  # noqa: E402

from agentmem.recall.retrieval import RetrievalParams  # noqa: E402

TAUS, DEPTHS, MAX_PULLED = (0.6, 0.7, 0.8, 0.9), (20, 40), 2


def rerank(data: la.Data, order: dict[str, int], q, ids: list[str], tau: float, depth: int) -> list[str]:
    """``ids`` with up to ``MAX_PULLED`` earlier near-duplicates of top-10 turns moved in after them; the first 10."""
    top, vectors = ids[:10], data.vecs[q.conv]
    pulled = []
    for b in ids[10:depth]:
        for a in top:
            if b in order and a in order and order[b] < order[a] and \
                    float(vectors[order[a]] @ vectors[order[b]]) >= tau:
                pulled.append((top.index(a), b))
                break
    out = list(top)
    for where, b in sorted(pulled)[:MAX_PULLED]:
        out.insert(out.index(top[where]) + 1, b)
    return out[:10]


def main() -> None:
    caches = [Path(p) for p in sys.argv[1:]]
    params = RetrievalParams()
    result: dict[str, dict[str, list[float]]] = {}
    for path in caches:
        data = la.Data(**la.load_cache(path))
        orders = {cid: {t["id"]: n for n, t in enumerate(ts)} for cid, ts in data.turns.items()}
        base = [la.shipped(q, q.cands, data.rows, params, k=40) for q in data.questions]
        rows = {"shipped": base}
        rows.update({f"tau={t},depth={d}": [rerank(data, orders[q.conv], q, ids, t, d)
                                              for q, ids in zip(data.questions, base)]
                     for t in TAUS for d in DEPTHS})
        result[path.stem] = {}
        for name, ranked in rows.items():
            s = la.summary(data.questions, [la.recall_of(q, ids) for q, ids in zip(data.questions, ranked)])
            result[path.stem][name] = [s["recall@5"], s["recall@10"]]
            print(path.stem, name, s["recall@5"], s["recall@10"], file=sys.stderr, flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
