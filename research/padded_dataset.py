"""A dev set with each conversation grown to a long history, written as a dataset file (the dev set's own format),
so the tools that read one (``research/_locomo_cache.py``, then ``research/ranking_crossfit.py``) can measure recall's
ranking on ~1,400-turn conversations.

Each conversation keeps its sessions and questions and gets ``research/recall_by_history_size.py``'s padding after
them: the next conversations' sessions, dates shifted to follow, told by their own speakers (``others``) or renamed to
the conversation's own pair (``own``, the closer proxy of one pair's long history).

    python research/padded_dataset.py --dataset realtalk --pad-to 1400 --speakers own --out /tmp/R-own.json
    python research/_locomo_cache.py --data /tmp/R-own.json --store /tmp/R-own-store --out /tmp/R-own.pkl

Last line: {"dataset": ..., "pad_to": ..., "speakers": ..., "turns": [per conversation], "out": ...}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # research/
import recall_by_history_size as rh  # noqa: E402


def padded(conversations: list[dict], pad_to: int, speakers: str) -> list[dict]:
    """Every conversation followed by its padding (:func:`recall_by_history_size.padding`), questions kept.

    Example:
        >>> convs = [{"conversation_id": c, "speaker_a": a, "speaker_b": b, "qa": [],
        ...           "sessions": [{"session": 1, "date_time": "01.01.2023, 10:00:00",
        ...                         "turns": [{"dia_id": "D1:1", "speaker": a, "text": f"hi {b}"}]}]}
        ...          for c, a, b in (("x", "Ann", "Bo"), ("y", "Cy", "Di"))]
        >>> [t["text"] for s in padded(convs, 2, "own")[0]["sessions"] for t in s["turns"]]
        ['hi Bo', 'hi Bo']
    """
    return [{**conv, "sessions": conv["sessions"] + rh.padding(conversations, i, pad_to, speakers)["sessions"]}
            for i, conv in enumerate(conversations)]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", choices=list(rh.DATA), required=True)
    ap.add_argument("--pad-to", type=int, default=1400)
    ap.add_argument("--speakers", choices=["others", "own"], default="own")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    grown = padded(json.loads(rh.DATA[args.dataset].read_text()), args.pad_to, args.speakers)
    args.out.write_text(json.dumps(grown))
    result = {"dataset": args.dataset, "pad_to": args.pad_to, "speakers": args.speakers,
              "turns": [sum(len(s["turns"]) for s in c["sessions"]) for c in grown], "out": str(args.out)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
