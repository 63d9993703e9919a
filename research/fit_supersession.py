"""Fit the pairwise supersession model of ``consolidation="local"`` (agentmem/consolidate/pairs.py).

Pairs (older memory A, newer memory B, same speaker), featurised by ``pair_features`` on the bundled MiniLM vectors:

* positives: (old statement, update) of ``ku_scenarios`` "tune" scenarios; negatives: every other pair of those
  streams (chit-chat, the user's other facts, look-alike statements of the same attribute); restatements of the
  same old value are left out (superseding one by the other is harmless either way);
* LoCoMo negatives: each turn against its 20 nearest older turns of the same speaker (conversations rarely restate
  a fact, and a superseded turn is hidden from every question).

Cross-validation: for each of the 5 LoCoMo conversations, fit on the tune pairs + the other 4 conversations, set
the threshold to the highest score of a training LoCoMo pair, and measure on the held-out "test" half of the
scenarios (other attributes, phrasings and values) and the held-out conversation. Then the shipped model: fitted on
the tune pairs + all 5 conversations, written to agentmem/consolidate/weights/supersession_pairs.json.

    python research/fit_supersession.py --locomo ../shared/data/locomo/locomo_dev5.json

Last line: {"cv": [{"fold": 0, "test_all_old_superseded": ..., "test_lookalike_superseded": ...,
"locomo_turns_hidden": ..., "locomo_evidence_hidden": ...}, ...], "written": "..."}
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]  # research/, benchmarks/

from ku_scenarios import Scenario, scenarios  # noqa: E402
from locomo import turn_text  # noqa: E402

from agentmem import AgentMemory  # noqa: E402
from agentmem.text import content_words  # noqa: E402
from agentmem.consolidate.pairs import WEIGHTS, pair_features  # noqa: E402

LOCOMO_NEIGHBOURS = 20  # what the store's consolidation looks at: 2 x 10 nearest memories
CONFLICT_QUANTILE = 0.9995  # recall's newer-first reordering: this share of LoCoMo pairs scores below it


def unit(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def scenario_pairs(items: list[Scenario], vec: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, list]:
    """Features, labels and (scenario, kind) of every pair of each stream (B against all its older memories)."""
    X, y, meta = [], [], []
    for si, s in enumerate(items):
        update = next(t for t in reversed(s.memories) if t not in s.alike)
        for j, b in enumerate(s.memories):
            olds = list(dict.fromkeys(a for a in s.memories[:j] if a != b))
            if not olds:
                continue
            f = pair_features(vec[b], content_words(b), [vec[a] for a in olds], [content_words(a) for a in olds])
            for a, row in zip(olds, f):
                if a in s.old_texts and b in s.old_texts:
                    continue
                positive = b == update and a in s.old_texts
                kind = "update" if positive else ("lookalike" if {a, b} & set(s.alike) else
                                                  "other" if {a, b} & {t for t, _ in s.other_facts} else "chatter")
                X.append(row)
                y.append(float(positive))
                meta.append((si, kind))
    return np.asarray(X), np.asarray(y), meta


def locomo_pairs(conv: dict, vec: np.ndarray) -> tuple[np.ndarray, list[tuple[str, bool]]]:
    """Each turn against its nearest older turns of the same speaker: features and (older dia_id, is evidence)."""
    evidence = {e for q in conv["qa"] if int(q.get("category", 0)) in (1, 2, 3, 4) for e in q.get("evidence", [])}
    turns = [t for s in conv["sessions"] for t in s["turns"]]
    words = [content_words(turn_text(t)) for t in turns]
    X, meta = [], []
    for j in range(1, len(turns)):
        idx = [i for i in range(j) if turns[i]["speaker"] == turns[j]["speaker"]]
        if not idx:
            continue
        sel = [idx[k] for k in np.argsort(-(vec[idx] @ vec[j]))[:LOCOMO_NEIGHBOURS]]
        X.extend(pair_features(vec[j], words[j], [vec[i] for i in sel], [words[i] for i in sel]))
        meta.extend((turns[i]["dia_id"], turns[i]["dia_id"] in evidence) for i in sel)
    return np.asarray(X), meta


def fit_logistic(X: np.ndarray, y: np.ndarray, *, l2: float = 1.0, iters: int = 30) -> tuple[np.ndarray, float]:
    """L2-regularised logistic regression by Newton steps; positives weighted to a tenth of the balance."""
    Xb = np.hstack([X, np.ones((len(X), 1))]).astype(np.float64)
    sw = np.where(y == 1, len(y) / max(1.0, y.sum()) / 10, 1.0)
    w = np.zeros(Xb.shape[1])
    reg = l2 * np.r_[np.ones(len(w) - 1), 0.0]
    for _ in range(iters):
        p = 1 / (1 + np.exp(-Xb @ w))
        step = np.linalg.solve((Xb * (sw * p * (1 - p))[:, None]).T @ Xb + np.diag(reg), Xb.T @ (sw * (p - y)) + reg * w)
        w -= step
        if np.abs(step).max() < 1e-6:
            break
    return w[:-1], float(w[-1])


def scenario_outcome(meta: list, scores: np.ndarray, threshold: float) -> tuple[float, float]:
    """Share of scenarios whose every old statement is superseded by the update, and share where a look-alike or
    another fact takes part in a supersession (wrong)."""
    every: dict[int, bool] = {}
    wrong: set[int] = set()
    for (si, kind), score in zip(meta, scores):
        if kind == "update":
            every[si] = every.get(si, True) and score >= threshold
        elif kind in ("lookalike", "other") and score >= threshold:
            wrong.add(si)
    n = len({si for si, _ in meta})
    return round(sum(every.values()) / n, 3), round(len(wrong) / n, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--locomo", type=Path, required=True)
    ap.add_argument("--n", type=int, default=300, help="scenarios per half")
    ap.add_argument("--out", type=Path, default=WEIGHTS)
    args = ap.parse_args()
    tune, test = scenarios("tune", n=args.n, seed=11), scenarios("test", n=args.n, seed=11)
    conversations = json.loads(args.locomo.read_text())
    with tempfile.TemporaryDirectory() as tmp, AgentMemory(Path(tmp) / "fit", consolidation="off") as mem:
        def embed(texts: list[str]) -> np.ndarray:
            return unit(mem._store.embedder.encode(texts, batch_size=64))
        texts = sorted({t for s in tune + test for t in s.memories})
        vec = dict(zip(texts, embed(texts)))
        lc = [locomo_pairs(c, embed([turn_text(t) for s in c["sessions"] for t in s["turns"]])) for c in conversations]
    Xt, yt, _ = scenario_pairs(tune, vec)
    Xs, _, ms = scenario_pairs(test, vec)
    cv = []
    for fold in range(len(lc)):
        negatives = np.vstack([lc[i][0] for i in range(len(lc)) if i != fold])
        w, b = fit_logistic(np.vstack([Xt, negatives]), np.r_[yt, np.zeros(len(negatives))])
        threshold = float((negatives @ w + b).max())
        held = lc[fold][0] @ w + b
        hidden = {d for (d, _), s in zip(lc[fold][1], held) if s >= threshold}
        every, wrong = scenario_outcome(ms, Xs @ w + b, threshold)
        cv.append({"fold": fold, "test_all_old_superseded": every, "test_wrong_supersession": wrong,
                   "locomo_turns_hidden": len(hidden),
                   "locomo_evidence_hidden": len({d for (d, ev), s in zip(lc[fold][1], held) if ev and d in hidden})})
        print(cv[-1], file=sys.stderr, flush=True)
    negatives = np.vstack([x for x, _ in lc])
    w, b = fit_logistic(np.vstack([Xt, negatives]), np.r_[yt, np.zeros(len(negatives))])
    neg = negatives @ w + b
    kept = json.loads(args.out.read_text()) if args.out.exists() else {}
    args.out.write_text(json.dumps({
        # measured separately (research/background_prior.py), and the file's provenance, written by hand: kept
        **{key: kept[key] for key in ("provenance", "background_prior") if key in kept},
        "about": "research/fit_supersession.py: logistic regression, tune scenarios + LoCoMo pairs (all 5 "
                 "conversations); supersede = highest LoCoMo pair score, conflict = its 0.9995 quantile",
        "dim": int(len(vec[texts[0]])), "bias": round(b, 6), "supersede": round(float(neg.max()), 6),
        "conflict": round(float(np.quantile(neg, CONFLICT_QUANTILE)), 6),
        "weights": [round(float(x), 6) for x in w]}))
    print(json.dumps({"cv": cv, "written": str(args.out)}), flush=True)


if __name__ == "__main__":
    main()
