"""How much benchmark evidence is a turn that only asks? The bound on what leaving a user's earlier questions out
of a mount (``MemoryConfig.mount_questions=False``, :func:`agentmem.consolidate.statements.only_asks`) can cost.

Over a dataset in LoCoMo's shape (``sessions[].turns[]`` with ``dia_id``, ``qa[].evidence``): the share of all turns
that only ask, and the share of the evidence turns the questions name that only ask.

    python research/question_evidence.py ../shared/data/locomo/locomo_dev5.json ../shared/data/realtalk/realtalk_dev5.json

Last line: {"<file stem>": {"turns": n, "asking_turns": share, "evidence": n, "asking_evidence": share}, ...}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from agentmem.consolidate.statements import only_asks


def question_evidence(conversations: list[dict[str, Any]]) -> dict[str, float]:
    """Turn and evidence counts, and the shares of each that only ask.

    Example:
        >>> conv = {"conversation_id": "c", "sessions": [{"turns": [{"dia_id": "D1:1", "text": "Where is it?"},
        ...                                                        {"dia_id": "D1:2", "text": "In Lyon."}]}],
        ...         "qa": [{"evidence": ["D1:2"]}]}
        >>> question_evidence([conv])
        {'turns': 2, 'asking_turns': 0.5, 'evidence': 1, 'asking_evidence': 0.0}
    """
    turns: dict[tuple[str, str], str] = {}
    evidence: set[tuple[str, str]] = set()
    for conv in conversations:
        cid = conv["conversation_id"]
        for session in conv["sessions"]:
            for turn in session["turns"]:
                turns[(cid, turn["dia_id"])] = turn["text"]
        evidence.update((cid, e) for q in conv["qa"] for e in q.get("evidence", []))
    found = [key for key in evidence if key in turns]
    return {"turns": len(turns), "asking_turns": round(sum(only_asks(t) for t in turns.values()) / len(turns), 4),
            "evidence": len(found), "asking_evidence": round(sum(only_asks(turns[k]) for k in found) / len(found), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", type=Path, nargs="+")
    args = ap.parse_args()
    print(json.dumps({path.stem: question_evidence(json.loads(path.read_text())) for path in args.data}))


if __name__ == "__main__":
    main()
