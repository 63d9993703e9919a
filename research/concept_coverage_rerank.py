"""Does a question's every content word matter? Re-rank by concept coverage (issue #38, long histories: later turns
that share one generic word of the question, "friends" or "job", outrank evidence that answers its specific part).

Over caches of ``research/_locomo_cache.py`` (own length, and grown to ~1,400 turns by ``research/padded_dataset.py``):
where each evidence turn sits in the shipped ranking (200 deep); then recall's shipped ranking
(``learned_ablation.shipped``, 40 deep) re-ordered: each content word of the question (not a stop word,
not a speaker's name) is embedded alone by the bundled MiniLM, and a turn's coverage is its stored vector's cosine
to each word, pooled by ``mean``, ``min`` or a soft minimum. The 40 are re-ordered by ``-rank / 10 + w * z(coverage)``
(coverage standardised within the question). Cross-dataset choice: the (pooling, w) with the best recall@5 + @10
summed over one dataset's caches (own length and padded) is scored on the other's. Prints every cell; last line JSON.

    python research/concept_coverage_rerank.py L0.pkl R0.pkl L.pkl R.pkl   (L*: LoCoMo, R*: REALTALK)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]
import learned_ablation as la  # noqa: E402

from agentmem.embed.minilm import bundled_embedding_model_path  # noqa: E402
from agentmem.recall.retrieval import RetrievalParams  # noqa: E402

# Function words and the question's own frame ("what kind of", "describe"): words no turn is expected to contain.
STOP = set("""a an the of to in on at for with and or but is are was were be been being do does did done have has had
what when where who whom which why how whose that this these those it its his her their them they he she him i you we
my your our me us about from by as into over after before during than then there here any some all each every would
could should will can may might must shall not no yes so if also just very much many more most other such kind sort
type thing things way ways view views think thoughts feel feels felt say said tell told describe mentioned mention
share shared like likes""".split())
POOLINGS, WEIGHTS, DEPTH = ("mean", "min", "softmin"), (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8), 40


def evidence_ranks(data: la.Data) -> dict[str, float]:
    """Where each evidence turn sits in the shipped ranking taken 200 deep: the share in ranks 1-10, 11-40, 41-200,
    and outside (not in any pool, or below 200)."""
    buckets = {"1-10": 0, "11-40": 0, "41-200": 0, "outside": 0}
    for q in data.questions:
        ids = la.shipped(q, q.cands, data.rows, RetrievalParams(), k=200)
        for g in q.gold:
            rank = ids.index(g) + 1 if g in ids else None
            buckets["outside" if rank is None else "1-10" if rank <= 10 else "11-40" if rank <= 40 else "41-200"] += 1
    total = sum(buckets.values())
    return {k: round(v / total, 3) for k, v in buckets.items()}


def content_words(question: str, names: set[str]) -> list[str]:
    words = (w.lower() for w in re.findall(r"[A-Za-z][A-Za-z'-]+", question))
    return [w for w in words if w not in STOP and w not in names and len(w) > 2]


def prepare(data: la.Data, embed) -> list[tuple]:
    """Per question: (question, the shipped 40 ids, their cosines to each content word [40, words])."""
    names = {cid: {n.lower() for t in ts for n in re.findall(r"[A-Za-z]+", t["speaker"])}
             for cid, ts in data.turns.items()}
    vocab = sorted({w for q in data.questions for w in content_words(q.text, names[q.conv])})
    word_vectors = dict(zip(vocab, embed(vocab)))
    orders = {cid: {t["id"]: n for n, t in enumerate(ts)} for cid, ts in data.turns.items()}
    items = []
    for q in data.questions:
        ids = la.shipped(q, q.cands, data.rows, RetrievalParams(), k=DEPTH)
        words = content_words(q.text, names[q.conv])
        turns = np.stack([data.vecs[q.conv][orders[q.conv][i]] for i in ids])
        sims = turns @ np.stack([word_vectors[w] for w in words]).T if words else np.zeros((len(ids), 1))
        items.append((q, ids, sims))
    return items


def rerank(items: list[tuple], weight: float, pooling: str) -> list[list[str]]:
    out = []
    for _, ids, sims in items:
        coverage = {"mean": sims.mean(1), "min": sims.min(1),
                    "softmin": -np.log(np.exp(-8 * sims).mean(1)) / 8}[pooling]
        coverage = (coverage - coverage.mean()) / (coverage.std() + 1e-6)
        score = -np.arange(len(ids)) / 10.0 + weight * coverage
        out.append([ids[i] for i in np.argsort(-score, kind="stable")])
    return out


def recall(items: list[tuple], ranked: list[list[str]]) -> list[float]:
    s = la.summary([q for q, _, _ in items], [la.recall_of(q, r) for (q, _, _), r in zip(items, ranked)])
    return [s["recall@5"], s["recall@10"]]


def cross_dataset(cells: dict[str, dict[str, list[float]]]) -> dict[str, dict]:
    """Fit (pooling, w) on one dataset's caches (names starting L or R), score the choice on the other's."""
    out = {}
    for fit, other in (("L", "R"), ("R", "L")):
        fit_caches = [c for c in cells if c.startswith(fit)]
        best = max(cells[fit_caches[0]], key=lambda v: sum(sum(cells[c][v]) for c in fit_caches))
        out[f"fit_{fit}"] = {"chosen": best, "scored_on_other": {c: {"shipped": cells[c]["mean|0.0"],
                                                                     "chosen": cells[c][best]}
                                                                 for c in cells if c.startswith(other)}}
    return out


def main() -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(bundled_embedding_model_path(), device="cpu")

    def embed(words: list[str]) -> np.ndarray:
        return model.encode(words, normalize_embeddings=True, batch_size=256)

    cells: dict[str, dict[str, list[float]]] = {}
    ranks: dict[str, dict[str, float]] = {}
    for path in map(Path, sys.argv[1:]):
        data = la.Data(**la.load_cache(path))  # read once: the padded caches are large
        ranks[path.stem] = evidence_ranks(data)
        print(path.stem, "evidence ranks", ranks[path.stem], file=sys.stderr, flush=True)
        items = prepare(data, embed)
        cells[path.stem] = {f"{p}|{w}": recall(items, rerank(items, w, p)) for p in POOLINGS for w in WEIGHTS}
        for variant, r in cells[path.stem].items():
            print(path.stem, variant, *r, file=sys.stderr, flush=True)
    print(json.dumps({"evidence_ranks": ranks, "cells": cells, "cross_dataset": cross_dataset(cells)}))


if __name__ == "__main__":
    main()
