"""Plot recall p50 / p95 per backend from ``benchmarks/scale.py`` results (their last JSON lines).

    python benchmarks/plot_scale.py docs/scale-results.jsonl docs/scale.png

Each input line is one scale.py result (an optional ``label`` key is added under its bar); the goals of issue 12 (p95 <= 30 ms embedded, <= 40 ms PostgreSQL) are
drawn as markers. Last line: {"plot": PATH, "backends": [...]}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GOALS_MS = {"embedded": 30.0, "postgres": 40.0}


def main() -> None:
    """Read the results, draw the bars, print the JSON line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    # an optional "label" (e.g. the session that measured it) tells runs of one backend apart
    labels = [f"{r['backend']}\n{r['entries']:,} entries / {r.get('users', 1)} user(s)"
              + (f"\n{r['label']}" if r.get("label") else "") for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(1.8 + 2.2 * len(rows), 4))
    ax.bar([x - 0.2 for x in xs], [r["p50_ms"] for r in rows], width=0.4, label="p50")
    ax.bar([x + 0.2 for x in xs], [r["p95_ms"] for r in rows], width=0.4, label="p95")
    for x, r in zip(xs, rows):
        if r["backend"] in GOALS_MS:
            ax.plot([x - 0.45, x + 0.45], [GOALS_MS[r["backend"]]] * 2, "k--", lw=1)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("recall latency, ms (embedding included)")
    ax.set_title("benchmarks/scale.py (dashed: p95 goal)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(json.dumps({"plot": str(out), "backends": [r["backend"] for r in rows]}))


if __name__ == "__main__":
    main()
