"""Would a floor under the pairwise model's background spare look-alikes on a small store? Runs
``benchmarks/knowledge_update.py`` (its own flags) with the background (the median cosine of the newer memory to
the speaker's nearest older ones) taken as ``max(median, BG_FLOOR)``: on a store of a few unrelated memories the
median is low, so any statement alike to an older one stands out ("On weekends I get around by ferry." demoted "I
commute by bus." in the mount for "How do I commute?").

    BG_FLOOR=0.463 python research/background_floor.py --no-scenarios --llm-n 0 --distinct-n 0 --roles-n 0 \\
        --asked-n 0 --latency-n 0 --natural

Last line: the benchmark's. Figures in research/notes/consolidation-crossdataset.md (round 3 session 22).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import agentmem.consolidate.pairs as pairs

ROOT = Path(__file__).resolve().parents[1]


def floored(median: float, floor: float) -> float:
    """The background with a floor.

    >>> floored(0.12, 0.463), floored(0.6, 0.463)
    (0.463, 0.6)
    """
    return max(median, floor)


def main() -> None:
    floor = float(os.environ.get("BG_FLOOR", "0"))
    median = pairs._sorted_median
    pairs._sorted_median = lambda top: floored(median(top), floor)  # pair_features' background (one-sentence pairs)
    sys.argv = ["knowledge_update.py", *sys.argv[1:]]
    runpy.run_path(str(ROOT / "benchmarks" / "knowledge_update.py"), run_name="__main__")


if __name__ == "__main__":
    main()
