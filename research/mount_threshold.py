"""What the default mount threshold (``MemoryConfig.mount_min_score``) keeps and lets in, at 0.3 and 0.5.

Two sources, every figure per source:

- the samples of ``research/fit_scores.py --samples FILE`` (LoCoMo dev, REALTALK dev, small stores; each pair's
  score recomputed with the shipped calibration): the share of answering pairs (evidence) and of unrelated pairs
  (another conversation's hits for the question, or the small stores' other memories) scoring at or above each
  threshold, and how many of a question's top 4 hits (``k=4``, generate's default) would be mounted;
- :data:`CONSTRAINTS`: preferences and constraints an agent must apply although the request does not restate them,
  written for this check and in no fit, stored together in one store, each asked its own question (the other 11
  memories, and 4 unrelated questions' hits, are the unrelated pairs), through the public API.

    python research/mount_threshold.py --samples /tmp/score-samples.json

Prints the tables; last line JSON (research/notes/mount_threshold.json).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from agentmem import AgentMemory
from agentmem.recall.calibration import Calibration, stems, word_overlap

THRESHOLDS = (0.3, 0.4, 0.5)
K = 4
# (memory, a request it constrains)
CONSTRAINTS = [
    ("Alice is vegetarian.", "Suggest a dinner recipe for Alice."),
    ("I don't eat pork.", "Can you suggest a sandwich for my lunch?"),
    ("Never schedule meetings for me on Fridays.", "Book a call with Sam on Friday at 3 pm."),
    ("I prefer metric units.", "How far is it from Paris to Berlin?"),
    ("My budget for the new laptop is 1,200 euros.", "Which laptop should I buy?"),
    ("I'm learning Spanish and want practice whenever possible.", "Reply to my friend's birthday message."),
    ("I get seasick on boats.", "Plan a day trip around the Greek islands for me."),
    ("My manager is called Dana Whitfield.", "Draft an email to my boss about the delay."),
    ("I moved to Lyon last May.", "Where do I live?"),
    ("Our team uses Python 3.12 and Poetry.", "Set up a new project skeleton for us."),
    ("I am allergic to cats.", "Should I adopt a kitten?"),
    ("I go to bed at 10 pm on weekdays.", "Can we have a video call at 11 pm on Tuesday?"),
]
UNRELATED = ["What is the capital of Peru?", "How do I change a flat bicycle tyre?", "Explain how photosynthesis works.",
             "What's 17 times 23?"]


def shares(answering: np.ndarray, unrelated: np.ndarray) -> dict[str, dict[str, float]]:
    """The share of answering and of unrelated pairs at or above each threshold.

    Example:
        >>> shares(np.array([0.2, 0.6]), np.array([0.1, 0.35]))["0.3"]
        {'answering': 0.5, 'unrelated': 0.5}
    """
    return {str(t): {"answering": round(float((answering >= t).mean()), 4),
                     "unrelated": round(float((unrelated >= t).mean()), 4)} for t in THRESHOLDS}


def from_samples(path: Path) -> dict[str, Any]:
    """:func:`shares` per source of the fit's samples, and the hits a ``k=4`` mount takes per question."""
    cal = Calibration()
    out: dict[str, Any] = {}
    for source, samples in json.loads(path.read_text()).items():
        per_q: dict[float, dict[int, int]] = {t: defaultdict(int) for t in THRESHOLDS}
        scored: dict[int, list[float]] = {1: [], 0: []}
        for s in samples:
            p = cal(cosine=s["cosine"], overlap=word_overlap(stems(s["question"]), s["text"], s["speaker"]))
            if s["label"] in scored:
                scored[s["label"]].append(p)
            own = s["label"] != 0 or source == "small"  # the question's own store (dev: its own conversation)
            if own and s["rank"] < K:
                for t in THRESHOLDS:
                    per_q[t][s["q"]] += p >= t
        questions = len({s["q"] for s in samples})
        out[source] = {"thresholds": shares(np.array(scored[1]), np.array(scored[0])),
                       "mounted_of_4": {str(t): round(sum(c.values()) / questions, 2) for t, c in per_q.items()},
                       "pairs": {"answering": len(scored[1]), "unrelated": len(scored[0])}}
    return out


def constraints() -> dict[str, Any]:
    """:data:`CONSTRAINTS` in one store: each pair's score, and :func:`shares` over them."""
    with tempfile.TemporaryDirectory() as tmp, AgentMemory(tmp, kv_encoding="off") as mem:
        records = mem.remember_many([dict(text=t, user_id="u") for t, _ in CONSTRAINTS])
        answering, unrelated, pairs = [], [], []
        for (text, question), rec in zip(CONSTRAINTS, records):
            scores = {h.id: h.score for h in mem.recall(question, user_id="u", k=len(CONSTRAINTS))}
            answering.append(scores.get(rec.id, 0.0))
            unrelated += [s for i, s in scores.items() if i != rec.id]
            pairs.append({"question": question, "memory": text, "score": round(answering[-1], 4)})
        for question in UNRELATED:
            unrelated += [h.score for h in mem.recall(question, user_id="u", k=len(CONSTRAINTS))]
    return {"thresholds": shares(np.array(answering), np.array(unrelated)), "pairs": pairs,
            "unrelated_pairs": len(unrelated)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=Path, required=True, help="research/fit_scores.py's --samples file")
    args = ap.parse_args()
    result = {"samples": from_samples(args.samples), "constraints": constraints()}
    for source, r in [*result["samples"].items(), ("constraints", result["constraints"])]:
        for t, v in r["thresholds"].items():
            print(f"{source:12} t={t}: answering {v['answering']:.3f}  unrelated {v['unrelated']:.3f}  "
                  f"mounted of 4: {r.get('mounted_of_4', {}).get(t, '-')}", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
