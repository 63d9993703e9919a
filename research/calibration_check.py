"""The score calibration's held-out quality under the ranking recall ships (``RetrievalParams()``), on the LoCoMo
candidate cache of ``research/_locomo_cache.py`` (no store touched, ~1 minute).

``benchmarks/locomo.py --folds 5`` fits and measures the refits under each fold's grid choice of ranking
constants, which is not the ranking the library uses (only its ``calibration_shipped_heldout`` is under the
defaults); this script measures them all under the shipped defaults:

- ``refit``: each fold's fit on 4 conversations, measured on the 5th (``calibration_heldout``, but under the
  defaults);
- ``median_nested``: the shipping procedure itself held out: for each held-out conversation, the per-weight median
  of the 4 fits made inside the other 4 (each on 3 of them), measured on it;
- ``shipped``: ``Calibration()``'s constants on every conversation (locomo.py's ``calibration_shipped_heldout``), and
  any ``--also name=w_rank,w_dense,w_lexical,bias``.

    python research/calibration_check.py --cache /tmp/q-cache.pkl [--also grid_median=1.975,3.83,0.21,-9.166]

Last line: {"params": ..., "fits": [...], "median": {...}, "heldout": {"refit": {...}, "median_nested": {...}, ...}}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]  # research/, benchmarks/
import learned_ablation  # noqa: E402
import locomo  # noqa: E402

from agentmem.recall.calibration import Calibration  # noqa: E402
from agentmem.recall.retrieval import RetrievalParams  # noqa: E402


def fit_on(samples: dict[str, tuple[list, list]], convs: list[str]) -> Calibration:
    """The calibration fitted on the pooled samples of ``convs``.

    Example:
        >>> fit_on({"a": ([[1.5, 0.7, 2.5], [0.4, 0.2, 0.0]] * 20, [1, 0] * 20)}, ["a"]).w_rank > 0
        True
    """
    xs = [x for c in convs for x in samples[c][0]]
    ys = [y for c in convs for y in samples[c][1]]
    return Calibration.fit(xs, ys)


def check(questions: list[Any], rows: dict[str, Any], extra: dict[str, Calibration], k: int = 10) -> dict[str, Any]:
    """Leave-one-conversation-out calibration figures under ``RetrievalParams()`` (see the module docstring)."""
    p = RetrievalParams()
    convs = sorted({q.conv for q in questions})
    samples = {c: locomo.calibration_samples([q for q in questions if q.conv == c], rows, p, k) for c in convs}
    fits, quality = [], {n: [] for n in ("refit", "median_nested", "shipped", *extra)}
    for held in convs:
        train = [c for c in convs if c != held]
        fits.append(fit_on(samples, train))
        inner = locomo.median_of([fit_on(samples, [c for c in train if c != g]) for g in train])
        test = [q for q in questions if q.conv == held]
        for name, cal in (("refit", fits[-1]), ("median_nested", inner), ("shipped", Calibration()), *extra.items()):
            quality[name].append(locomo.calibration_quality(test, rows, p, k, cal))
        print(held, {n: round(v[-1]["ece"], 4) for n, v in quality.items()}, file=sys.stderr, flush=True)
    return {"params": "RetrievalParams()", "shipped": asdict(Calibration()), "fits": [asdict(f) for f in fits],
            "median": asdict(locomo.median_of(fits)),
            "heldout": {n: {m: round(statistics.fmean(d[m] for d in v), 4) for m in v[0]} for n, v in quality.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True, type=Path)
    ap.add_argument("--also", nargs="*", default=[], help="name=w_rank,w_dense,w_lexical,bias to measure as well")
    args = ap.parse_args()
    extra = {s.split("=")[0]: Calibration(*map(float, s.split("=")[1].split(","))) for s in args.also}
    cache = learned_ablation.load_cache(args.cache)
    print(json.dumps(check(cache["questions"], cache["rows"], extra)), flush=True)


if __name__ == "__main__":
    main()
