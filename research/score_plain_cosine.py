"""Would ``Hit.score`` read better with the plain MiniLM query's cosine beside the query tower's? (issue #38, scores)

The score reads the query tower's cosine to the memory's own text (``Hit.scores["text_dense"]``); the tower was
tuned on LoCoMo questions, and short questions on small stores ("Where do I live?" / "I moved to Lyon last May.")
score low. Each sample of ``research/fit_scores.py --samples`` gets the plain (untuned) MiniLM cosine of its
question and text, and the score's logistic model is refitted with four feature sets: ``shipped`` (tower cosine,
overlap, their product), ``plain`` (the plain cosine instead), ``both`` (the two cosines, overlap, tower x overlap)
and ``max`` (the larger cosine). Each is fitted three ways, as ``fit_scores.py`` fits: without REALTALK (scored on
it: cross-dataset), without LoCoMo, and on all three sources; then the all-source fits score the held-out small
stores no fit saw (``research/mount_threshold.py``'s constraints, ``tests/unit/test_score_meaning.py``'s pairs).

    python research/score_plain_cosine.py --samples /tmp/score-samples.json

Last line JSON (research/notes/score_plain_cosine.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "research"), str(ROOT / "tests" / "unit")]
import fit_scores  # noqa: E402
import mount_threshold  # noqa: E402
import test_score_meaning  # noqa: E402

from agentmem import AgentMemory  # noqa: E402
from agentmem.embed.minilm import bundled_embedding_model_path  # noqa: E402
from agentmem.recall.calibration import fit_logistic, stems, word_overlap  # noqa: E402

Sample = dict[str, Any]
FEATURES: dict[str, Callable[[Sample], list[float]]] = {
    "shipped": lambda s: [s["cosine"], s["overlap"], s["cosine"] * s["overlap"]],
    "plain": lambda s: [s["plain"], s["overlap"], s["plain"] * s["overlap"]],
    "both": lambda s: [s["cosine"], s["plain"], s["overlap"], s["cosine"] * s["overlap"]],
    "max": lambda s: [max(s["cosine"], s["plain"]), s["overlap"], max(s["cosine"], s["plain"]) * s["overlap"]],
}
FITS = {"locomo+small": ("locomo", "small"), "realtalk+small": ("realtalk", "small"),
        "all": ("locomo", "realtalk", "small")}
SOURCES = ("locomo", "realtalk", "small")


def probability(features: str, w: np.ndarray, s: Sample) -> float:
    """The fitted model's score of one sample.

    Example:
        >>> probability("plain", np.array([0.0, 0.0, 0.0, 0.0]), {"plain": 0.4, "overlap": 0.0})
        0.5
    """
    return float(1.0 / (1.0 + np.exp(-(np.dot(FEATURES[features](s), w[:-1]) + w[-1]))))


def quality(samples: list[Sample], source: str, features: str, w: np.ndarray) -> dict[str, float]:
    """Balanced ECE, the answering pairs at >= 0.5 and >= 0.3, the unrelated at <= 0.3, and kept@10 at 0.5, as
    ``research/fit_scores.py`` reports them."""
    rows = [s for s in samples if s["source"] == source and s["label"] in (0, 1)]
    p = np.array([probability(features, w, s) for s in rows])
    y = np.array([s["label"] for s in rows])
    ece = fit_scores.balanced_ece(p, y.astype(float), fit_scores.balanced_weights(rows))
    kept = fit_scores.kept_at_half(samples, source, lambda s: probability(features, w, s))
    return {"ece": round(ece, 4), "answering>=0.5": round(float((p[y == 1] >= 0.5).mean()), 4),
            "answering>=0.3": round(float((p[y == 1] >= 0.3).mean()), 4),
            "unrelated<=0.3": round(float((p[y == 0] <= 0.3).mean()), 4), "kept@10": round(kept, 4)}


def held_out_stores(weights: dict[str, np.ndarray], encode: Callable[[list[str]], np.ndarray]) -> dict[str, Any]:
    """The all-source fits on small stores no fit saw: each question's own memory against the rest and against
    unrelated questions' hits, through the public API (tower cosine and overlap from ``Hit.scores``)."""
    sets = {"constraints": ([("turn", t, q) for t, q in mount_threshold.CONSTRAINTS], mount_threshold.UNRELATED),
            "score_meaning_tests": (test_score_meaning.PAIRS, test_score_meaning.UNRELATED)}
    out: dict[str, Any] = {}
    for name, (pairs, unrelated) in sets.items():
        got: dict[str, dict[int, list[float]]] = {f: {1: [], 0: []} for f in weights}
        with tempfile.TemporaryDirectory() as tmp, AgentMemory(tmp, kv_encoding="off") as mem:
            records = mem.remember_many([dict(text=t, user_id="u", kind=k) for k, t, _ in pairs])
            asked = [(q, r.id) for (_, _, q), r in zip(pairs, records)] + [(q, None) for q in unrelated]
            for question, own in asked:
                for h in mem.recall(question, user_id="u", k=len(pairs)):
                    q_vec, t_vec = encode([question, h.text])
                    s = {"cosine": h.scores["text_dense"], "plain": float(q_vec @ t_vec), "overlap": h.scores["overlap"]}
                    for f, w in weights.items():
                        got[f][int(h.id == own)].append(probability(f, w, s))
        out[name] = {f: {"answering>=0.5": round(float(np.mean(np.array(v[1]) >= 0.5)), 4),
                         "answering>=0.3": round(float(np.mean(np.array(v[1]) >= 0.3)), 4),
                         "unrelated>=0.3": round(float(np.mean(np.array(v[0]) >= 0.3)), 4)} for f, v in got.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=Path, required=True, help="research/fit_scores.py's --samples file")
    args = ap.parse_args()
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(bundled_embedding_model_path(), device="cpu")

    def encode(texts: list[str]) -> np.ndarray:
        return model.encode(texts, normalize_embeddings=True, batch_size=64, show_progress_bar=False)

    kept = json.loads(args.samples.read_text())
    samples = [s for source in SOURCES for s in kept[source]]
    texts, questions = sorted({s["text"] for s in samples}), sorted({s["question"] for s in samples})
    t_vecs, q_vecs = dict(zip(texts, encode(texts))), dict(zip(questions, encode(questions)))
    for s in samples:
        s["plain"] = float(t_vecs[s["text"]] @ q_vecs[s["question"]])
        s["overlap"] = word_overlap(stems(s["question"]), s["text"], s["speaker"])
    table: dict[str, Any] = {}
    all_source: dict[str, np.ndarray] = {}
    for features in FEATURES:
        for fit_name, sources in FITS.items():
            rows = [s for s in samples if s["source"] in sources and s["label"] in (0, 1)]
            w = fit_logistic(np.array([FEATURES[features](s) for s in rows]), np.array([s["label"] for s in rows], float),
                             l2=1e-3, sample_weight=fit_scores.balanced_weights(rows))
            table[f"{features}|{fit_name}"] = {src: quality(samples, src, features, w) for src in SOURCES}
            print(features, fit_name, table[f"{features}|{fit_name}"], file=sys.stderr, flush=True)
            if fit_name == "all":
                all_source[features] = w
    held = held_out_stores(all_source, encode)
    print(json.dumps({"table": table, "held_out_small_stores": held}))


if __name__ == "__main__":
    main()
