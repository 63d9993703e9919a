"""Would ``Hit.score`` gain from reading a longer memory by its best sentence? A fact told inside a longer message is
diluted in the message's vector: "Hi, I'm Alice. I take 20 mg of lisinopril every morning." scores 0.2 for "What's
my name?" (under the mount threshold 0.3), where "Hi, I'm Alice Smith." alone scores 0.48.

Two variants of the score (:mod:`agentmem.recall.calibration`), each fitted by :mod:`fit_scores`' procedure (a
balanced logistic regression, each source weighing 1): ``text`` reads (cosine, overlap, cosine x overlap) as the
shipped score does; ``gain`` adds how much closer the memory's best stated sentence is to the query than its whole
text, ``max(0, best sentence's cosine - cosine)`` (0 for one sentence), read from the sentence vectors the
consolidation keeps on rows of several sentences (``EntryRecord.sentence_vectors``; research only: read from the
store's catalog). ``gain_offset`` keeps the shipped weights and fits the gain's weight alone (single-sentence memories
score as before). Every fit (each dev set, each with the small stores, all three) of each variant is scored on every
source, so the cross-dataset rows sit beside the in-sample ones; ``auc`` is each source's ROC AUC, threshold-free.
Also reported, fitted on nothing: ``compound``, small stores whose memories each tell two facts (:data:`COMPOUND`).

    python research/score_sentences.py --locomo-store DIR --realtalk-store DIR [--samples FILE] [--out FILE]

Last line: {"variants": {variant: {fit: {source: figures}}}, "weights": ..., "compound": ..., ...}
(research/notes/score_sentences.json; research/notes/scores.md, session 21).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "research"), str(ROOT / "benchmarks")]
import fit_scores  # noqa: E402

from agentmem import AgentMemory  # noqa: E402
from agentmem.entries.text_vectors import unpack_vectors  # noqa: E402
from agentmem.recall.calibration import Calibration, fit_logistic  # noqa: E402

K = fit_scores.K
FITS = (("locomo",), ("realtalk",), ("locomo", "small"), ("realtalk", "small"), fit_scores.SOURCES)

# memories that tell two things at once, as people write them; each question asks about one of the two
COMPOUND = [
    ("Hi, I'm Alice. I take 20 mg of lisinopril every morning.", ["What's my name?", "What medication do I take?"]),
    ("We just got back from Lisbon. My daughter Mia starts school on Monday.",
     ["Where did we travel recently?", "When does Mia start school?"]),
    ("I work as a pharmacist in Leeds. On weekends I coach a kids' football team.",
     ["What's my job?", "What do I do on weekends?"]),
    ("My sister Hana is getting married in June. I still need to buy a suit for it.",
     ["When is Hana's wedding?", "What do I need to buy?"]),
    ("The car is in the garage until Thursday. I've been taking the 42 bus to work.",
     ["When will my car be fixed?", "How am I getting to work?"]),
    ("I'm gluten intolerant. My favourite restaurant is the Thai place on Elm Street.",
     ["Do I have any dietary restrictions?", "Where do I like to eat out?"]),
    ("Our landlord raised the rent to 1,400 euros. We're thinking of moving to Utrecht.",
     ["How much is our rent?", "Where might we move?"]),
    ("Thanks for the tips! By the way, my dog Bruno is a golden retriever.",
     ["What breed is my dog?", "What is my dog's name?"]),
]
FILLER = ["I like green tea in the afternoon.", "The printer on the second floor is broken again.",
          "My brother lives in Denver.", "I finished the puzzle with 1,000 pieces.",
          "I'm reading a novel about a lighthouse keeper.", "I usually cycle to the office."]


def with_sentences(mem: AgentMemory, question: str, hits: list[Any], made: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``made`` (one sample per hit, same order) with ``sentence``: the query's best cosine with the hit's stated
    sentences (None: a row of one sentence)."""
    vec = mem._store.embed_query(question)  # the vector the search scores with
    rows = {r.id: r for r in mem._store.catalog.get([h.id for h in hits])}
    for h, s in zip(hits, made):
        blob = rows[h.id].sentence_vectors
        sentences = unpack_vectors(blob, vec.shape[-1]) if blob else np.zeros((0, vec.shape[-1]))
        s["sentence"] = float((sentences @ vec).max()) if len(sentences) else None
    return made


def compound_samples() -> list[dict[str, Any]]:
    """Two stores of 4 compound memories and the 6 fillers; each compound memory's questions asked."""
    out: list[dict[str, Any]] = []
    for half in (COMPOUND[:4], COMPOUND[4:]):
        with tempfile.TemporaryDirectory() as tmp, AgentMemory(tmp, kv_encoding="off") as mem:
            recs = [mem.remember(text, user_id="u", role="user") for text, _ in half]
            mem.remember_many([{"text": t, "user_id": "u", "role": "user"} for t in FILLER])
            for rec, (_, questions) in zip(recs, half):
                for question in questions:
                    hits = mem.recall(question, user_id="u", k=K)
                    out += with_sentences(mem, question, hits, [
                        fit_scores.hit_sample(h, int(h.id == rec.id), 0, "compound", rank, question)
                        for rank, h in enumerate(hits)])
    return out


def features(s: dict[str, Any], variant: str) -> list[float]:
    """A sample's inputs under ``variant`` (``text``: the shipped score's)."""
    base = Calibration.features(s["cosine"], s["overlap"])
    return base if variant == "text" else [*base, max(0.0, (s["sentence"] or s["cosine"]) - s["cosine"])]


class Model:
    """A fitted variant: logistic weights over :func:`features`, then the bias."""

    def __init__(self, variant: str, weights: np.ndarray) -> None:
        self.variant, self.weights = variant, weights

    def __call__(self, s: dict[str, Any]) -> float:
        return float(1.0 / (1.0 + np.exp(-(np.dot(self.weights[:-1], features(s, self.variant)) + self.weights[-1]))))


def fit(samples: list[dict[str, Any]], sources: tuple[str, ...], variant: str) -> Model:
    """``variant`` fitted on ``sources`` as fit_scores fits the score; ``gain_offset``: the gain's weight alone, the
    shipped weights held (a grid over 0-8 by 0.25 of the balanced log loss)."""
    rows = fit_scores.labelled(samples, sources)
    y, w = np.array([s["label"] for s in rows], dtype=float), fit_scores.balanced_weights(rows)
    if variant != "gain_offset":
        return Model(variant, fit_logistic(np.array([features(s, variant) for s in rows]), y, l2=1e-3,
                                           sample_weight=w))
    shipped = Calibration()
    held = [shipped.w_dense, shipped.w_overlap, shipped.w_both]

    def loss(b: float) -> float:
        p = np.clip([Model("gain", np.array([*held, b, shipped.bias]))(s) for s in rows], 1e-9, 1 - 1e-9)
        return float(-(w * (y * np.log(p) + (1 - y) * np.log(1 - p))).sum())

    best = min(np.arange(0.0, 8.01, 0.25), key=loss)
    return Model("gain", np.array([*held, best, shipped.bias]))


def auc(p: np.ndarray, y: np.ndarray) -> float:
    """ROC AUC of scores ``p`` for labels ``y`` (1 answers, 0 unrelated)."""
    ranks = np.empty(len(p))
    ranks[np.argsort(p, kind="stable")] = np.arange(1, len(p) + 1)
    pos = int(y.sum())
    return round(float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(p) - pos))), 4)


def figures(samples: list[dict[str, Any]], source: str, model: Model) -> dict[str, float]:
    """fit_scores.quality's figures of one source under ``model``, and the AUC."""
    rows = fit_scores.labelled(samples, (source,))
    p, y = np.array([model(s) for s in rows]), np.array([s["label"] for s in rows], dtype=float)
    return {"relevant>=0.5": round(float((p[y == 1] >= 0.5).mean()), 4),
            "unrelated<=0.3": round(float((p[y == 0] <= 0.3).mean()), 4),
            "kept@10": round(fit_scores.kept_at_half(samples, source, model), 4),
            "ece": round(fit_scores.balanced_ece(p, y, fit_scores.balanced_weights(rows)), 4), "auc": auc(p, y)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--locomo-store", type=Path, required=True)
    ap.add_argument("--realtalk-store", type=Path, required=True)
    ap.add_argument("--samples", type=Path, default=None, help="keep / reuse the collected samples here")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.samples is not None and args.samples.exists():
        samples = json.loads(args.samples.read_text())
    else:
        samples = (fit_scores.dev_samples("locomo", args.locomo_store, annotate=with_sentences)
                   + fit_scores.dev_samples("realtalk", args.realtalk_store, annotate=with_sentences)
                   + fit_scores.small_samples(annotate=with_sentences))
        if args.samples is not None:
            args.samples.write_text(json.dumps(samples))
    compound = compound_samples()
    result: dict[str, Any] = {"variants": {}, "weights": {}, "compound": {}, "multi_sentence_share": {
        src: round(float(np.mean([s["sentence"] is not None for s in samples if s["source"] == src])), 4)
        for src in fit_scores.SOURCES}}
    for variant in ("text", "gain", "gain_offset"):
        for sources in FITS:
            model = fit(samples, sources, variant)
            name = "+".join(sources)
            result["variants"].setdefault(variant, {})[name] = {src: figures(samples, src, model)
                                                                for src in fit_scores.SOURCES}
            result["weights"].setdefault(variant, {})[name] = [round(float(v), 4) for v in model.weights]
        own = np.array([model(s) for s in compound if s["label"] == 1])  # the all-three fit
        result["compound"][variant] = {"related>=0.5": round(float((own >= 0.5).mean()), 4),
                                       "related>=0.3": round(float((own >= 0.3).mean()), 4),
                                       "related_mean": round(float(own.mean()), 4)}
    line = json.dumps(result)
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
