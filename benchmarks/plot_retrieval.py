"""Plot docs/retrieval.png from the last JSON lines of benchmarks/locomo.py kept in docs/retrieval-results.jsonl.

    python benchmarks/plot_retrieval.py [--results docs/retrieval-results.jsonl] [--out docs/retrieval.png]

Each line is one run's last JSON line plus a ``"label"``; the plot shows, per run, the held-out (cross-validated)
recall@5 / @10 and recall@10 per question category, against the goals (dashed lines).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GOALS = {"recall@5": 0.68, "recall@10": 0.80, "category": 0.55}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=Path("docs/retrieval-results.jsonl"))
    ap.add_argument("--out", type=Path, default=Path("docs/retrieval.png"))
    args = ap.parse_args()
    runs = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    names = ["recall@5", "recall@10", "cat. 1", "cat. 2", "cat. 3", "cat. 4"]
    fig, ax = plt.subplots(figsize=(10, 5.5))
    width = 0.8 / len(runs)
    for r, run in enumerate(runs):
        cv = run.get("cv", run)
        cats = cv.get("recall@10_by_category", {})
        values = [cv["recall@5"], cv["recall@10"], *(cats.get(c, 0.0) for c in "1234")]
        xs = [i + (r - (len(runs) - 1) / 2) * width for i in range(len(names))]
        bars = ax.bar(xs, values, width, label=run["label"])
        ax.bar_label(bars, fmt="%.3f", fontsize=6, padding=1, rotation=90)
    ax.hlines(GOALS["recall@5"], -0.45, 0.45, colors="k", linestyles="dashed", linewidth=1)
    ax.hlines(GOALS["recall@10"], 0.55, 1.45, colors="k", linestyles="dashed", linewidth=1)
    ax.hlines(GOALS["category"], 1.55, 5.45, colors="k", linestyles="dashed", linewidth=1, label="goal")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("held-out recall (5-fold CV over conversations)")
    ax.set_title("LoCoMo dev half: recall of the shipped defaults (research/locomo_cv.py --folds 5)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(json.dumps({"out": str(args.out), "runs": len(runs)}))


if __name__ == "__main__":
    main()
