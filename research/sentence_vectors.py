"""Does a long turn hide its answer in one sentence? Dense evidence read per sentence (issue #38, long histories).

REALTALK's turns are longer than LoCoMo's (35 words on average against 23; one in ten over 70) and a turn's single
MiniLM vector averages every topic it touches, so a question about one of them meets a diluted vector. Here every
turn of two or more sentences also gets one vector per sentence (embedded as the turn is, ``"{speaker}: {sentence}"``,
by the bundled MiniLM), and a turn's dense evidence becomes ``(1 - a) * cos(turn) + a * max(cos(turn), best
sentence cos)``. The dense pool (100) is searched exactly with that score over every turn, the turn-context pool
exactly as before (``learned_ablation.exact_cands``), BM25's pool is the store's own; recall's shipped ranking
(``learned_ablation.shipped``) orders them. ``a = 0`` is the exact-search baseline; the store's own (HNSW) candidates
are reported beside it. Cross-dataset choice: the ``a`` with the best recall@5 + @10 summed over one dataset's caches
(own length and padded to ~1,400 turns by ``research/padded_dataset.py``) is scored on the other's.

    python research/sentence_vectors.py L0.pkl R0.pkl L.pkl R.pkl   (caches of research/_locomo_cache.py; L*: LoCoMo)

Prints every cell; last line JSON.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]
import learned_ablation as la  # noqa: E402

from agentmem.embed.minilm import bundled_embedding_model_path  # noqa: E402
from agentmem.recall.retrieval import Candidates, RetrievalParams  # noqa: E402

MIXES = (0.0, 0.25, 0.5, 0.75, 1.0)
POOL = 100
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str, min_words: int = 3) -> list[str]:
    """``text`` split after ``. ! ?``; a fragment shorter than ``min_words`` words joins the one before it.

    >>> sentences("Yes! I went to Lyon last week. It was lovely, the food too.")
    ['Yes! I went to Lyon last week.', 'It was lovely, the food too.']
    """
    out: list[str] = []
    for part in _SENTENCE_END.split(text.strip()):
        if out and (len(part.split()) < min_words or len(out[-1].split()) < min_words):
            out[-1] = f"{out[-1]} {part}"
        elif part:
            out.append(part)
    return out


def sentence_max(data: la.Data, embed, convs: dict[str, tuple]) -> dict[str, np.ndarray]:
    """Per conversation of ``convs`` (``la.unique_turns(data)``, in its order): each turn's best-sentence vector
    block as (owner index, unit vectors); turns of one sentence contribute nothing (their own vector stands)."""
    out = {}
    for cid, (ids, _, _) in convs.items():
        owners, texts = [], []
        for n, entry_id in enumerate(ids):
            row = data.rows[entry_id]
            parts = sentences(row.text or row.memory_text)
            if len(parts) > 1:
                owners += [n] * len(parts)
                texts += [f"{row.speaker}: {s}" if row.speaker else s for s in parts]
        out[cid] = (np.asarray(owners, dtype=np.int64), embed(texts) if texts else np.zeros((0, 384), np.float32))
    return out


def ranked(data: la.Data, convs: dict[str, tuple], sent: dict, mix: float) -> list[list[str]]:
    """Every question's top 10 under the shipped ranking, its dense pool scored with sentence mix ``mix`` (``convs``:
    ``la.unique_turns(data)``, computed once per cache)."""
    out = []
    for q, qv in zip(data.questions, data.qvecs):
        ids, V, C = convs[q.conv]
        owners, S = sent[q.conv]
        qv = qv / np.linalg.norm(qv)
        d = V @ qv
        best = d.copy()
        if len(owners):
            np.maximum.at(best, owners, S @ qv)
        score = (1 - mix) * d + mix * best
        c = C @ qv
        dense = {ids[n]: float(score[n]) for n in np.argsort(-score)[:POOL]}
        ctx = {ids[n]: float(c[n]) for n in np.argsort(-c)[:POOL]}
        wanted = dense.keys() | q.cands.lexical.keys() | ctx.keys()
        cands = Candidates(dense, dict(q.cands.lexical), {i: data.places[i] for i in wanted if i in data.places},
                           turn_context=ctx)
        out.append(la.shipped(q, cands, data.rows, RetrievalParams(), k=10))
    return out


def recall(data: la.Data, tops: list[list[str]]) -> list[float]:
    """[recall@5, recall@10] over the questions."""
    rec = [la.recall_of(q, ids) for q, ids in zip(data.questions, tops)]
    return [round(statistics.fmean(r[k] for r in rec), 4) for k in la.KS]


def cross_dataset(cells: dict[str, dict[str, list[float]]]) -> dict[str, dict]:
    """Fit ``a`` on one dataset's caches (L* or R*), score it on the other's."""
    out = {}
    for fit, score in (("L", "R"), ("R", "L")):
        fitted = [c for c in cells if c.startswith(fit)]
        best = max(map(str, MIXES), key=lambda m: sum(sum(cells[c][m]) for c in fitted))
        out[f"fit_{fit}"] = {"mix": float(best), **{c: {"chosen": cells[c][best], "a=0": cells[c]["0.0"]}
                                                  for c in cells if c.startswith(score)}}
    return out


def main() -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(bundled_embedding_model_path(), device="cpu")

    def embed(texts: list[str]) -> np.ndarray:
        return model.encode(texts, normalize_embeddings=True, batch_size=128).astype(np.float32)

    cells: dict[str, dict[str, list[float]]] = {}
    for path in map(Path, sys.argv[1:]):
        data = la.Data(**la.load_cache(path))
        convs = la.unique_turns(data)
        sent = sentence_max(data, embed, convs)
        cells[path.stem] = {"store": recall(data, [la.shipped(q, q.cands, data.rows, RetrievalParams(), k=10)
                                                   for q in data.questions])}
        cells[path.stem] |= {str(m): recall(data, ranked(data, convs, sent, m)) for m in MIXES}
        for variant, r in cells[path.stem].items():
            print(path.stem, variant, *r, file=sys.stderr, flush=True)
    print(json.dumps({"cells": cells, "cross_dataset": cross_dataset(cells)}))


if __name__ == "__main__":
    main()
