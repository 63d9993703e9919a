"""Plot benchmarks/multiprocess.py results: visibility p95 per backend against its goal, before and after.

    python benchmarks/plot_multiprocess.py embedded.out postgres.out --out docs/multiprocess.png

Each input file is a multiprocess.py stdout; its last line (JSON) is read. ``--before`` takes earlier p95 figures as
``backend=ms`` (the round-2 session-1 results by default).

Last line: {"plot", "backends"}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GOALS = {"embedded": 1000.0, "postgres": 100.0}
BEFORE = {"embedded": 5684.7, "postgres": 213.6}  # docs/backends.md, round 2 session 1 (polling + re-open per read)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=Path("docs/multiprocess.png"))
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(p.read_text().strip().splitlines()[-1]) for p in args.results]
    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.6))
    axes = [axes] if len(rows) == 1 else list(axes)
    for ax, r in zip(axes, rows):
        name = r["backend"]
        labels = ["before\n(visibility)", "now\n(visibility)", "now\n(read done)"]
        values = [BEFORE.get(name, float("nan")), r["visibility_ms_p95"], r.get("seen_ms_p95") or float("nan")]
        ax.bar(labels, values, color=["#bbbbbb", "#3b7dd8", "#9cc0f0"])
        ax.axhline(GOALS[name], color="#d62728", ls="--", lw=1, label=f"goal {GOALS[name]:.0f} ms")
        ax.set_yscale("log")
        ax.set_ylabel("p95 ms (log)")
        ax.set_title(f"{name}, {r['workers']} workers: lost {r['lost']}, dup {r['duplicated']}, err {r['errors']}",
                     fontsize=9)
        for x, v in enumerate(values):
            ax.text(x, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
        ax.legend(fontsize=8)
    fig.suptitle("Several processes on one store: a write seen by another process (p95)", fontsize=10)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(json.dumps({"plot": str(args.out), "backends": [r["backend"] for r in rows]}))


if __name__ == "__main__":
    main()
