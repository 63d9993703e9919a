"""Does recall fall off with history length? recall@10 on LoCoMo dev and REALTALK dev, by how far back the evidence
is and by the conversation's length (issue #38: "recall must not fall off with history length").

Every question is asked once through the public API (``recall(k=10)``) of a store ingested by
``benchmarks/locomo.py --store DIR``. Each of its evidence turns is then one observation, found or not among the 10
hits, placed by

- ``age``: how many turns of the conversation come after it (the question is asked at the end: a turn 1,000 turns
  back has 1,000 later turns competing with it), bucketed by quantiles over both datasets;
- ``conversation``: the conversation's length in turns (5 per dataset).

    python research/recall_by_length.py --locomo-store DIR --realtalk-store DIR [--plot research/notes/recall_by_length.png]

Last line: {"locomo": {"by_age": [...], "by_conversation": [...]}, "realtalk": {...}, "edges": [...]}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]
import locomo  # noqa: E402

from agentmem import AgentMemory  # noqa: E402

DATA = {"locomo": Path("/work/shared/data/locomo/locomo_dev5.json"),
        "realtalk": Path("/work/shared/data/realtalk/realtalk_dev5.json")}


def turn_positions(conversation: dict) -> dict[str, int]:
    """Each turn's place in its conversation (sessions in order, turns in order), by ``dia_id``.

    Example:
        >>> turn_positions({"sessions": [{"turns": [{"dia_id": "D1:1"}, {"dia_id": "D1:2"}]},
        ...                              {"turns": [{"dia_id": "D2:1"}]}]})
        {'D1:1': 0, 'D1:2': 1, 'D2:1': 2}
    """
    order = [t["dia_id"] for s in conversation["sessions"] for t in s["turns"]]
    return {d: i for i, d in enumerate(order)}


def observations(name: str, store: Path, k: int = 10) -> list[dict[str, Any]]:
    """One row per evidence turn: its conversation, the conversation's length, its age and whether recall found it."""
    conversations = json.loads(DATA[name].read_text())
    made_by = json.loads((store / "locomo-ids.json").read_text())
    ids = made_by["ids"]
    out = []
    with AgentMemory(store, kv_encoding="off", consolidation=made_by.get("consolidation", "local")) as mem:
        for conv in conversations:
            cid = str(conv["conversation_id"])
            place = turn_positions(conv)
            for qa in conv["qa"]:
                evidence = [d for d in qa.get("evidence") or [] if d in ids[cid]]
                if qa.get("category") not in (1, 2, 3, 4) or not evidence:
                    continue
                top = {h.id for h in mem.recall(qa["question"], user_id=f"locomo-{cid}", k=k)}
                for d in evidence:
                    out.append({"conv": cid, "length": len(place), "age": len(place) - 1 - place[d],
                                "found": ids[cid][d] in top})
    return out


def bucketed(rows: list[dict[str, Any]], edges: list[int]) -> list[dict[str, Any]]:
    """recall@10 of the evidence turns whose age falls in each [edges[i], edges[i+1])."""
    out = []
    for lo, hi in zip(edges, edges[1:]):
        inside = [r["found"] for r in rows if lo <= r["age"] < hi]
        if inside:
            out.append({"age": [lo, hi], "turns": len(inside), "recall@10": round(statistics.fmean(inside), 4)})
    return out


def by_conversation(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    convs = sorted({r["conv"] for r in rows}, key=lambda c: next(r["length"] for r in rows if r["conv"] == c))
    return [{"conv": c, "length": next(r["length"] for r in rows if r["conv"] == c),
             "recall@10": round(statistics.fmean(r["found"] for r in rows if r["conv"] == c), 4)} for c in convs]


def trend(rows: list[dict[str, Any]]) -> float:
    """The least-squares slope of found (0/1) on age, per 1,000 turns: < 0 when recall falls with age."""
    age = np.array([r["age"] for r in rows], dtype=float) / 1000
    found = np.array([r["found"] for r in rows], dtype=float)
    return round(float(np.polyfit(age, found, 1)[0]), 4)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name in DATA:
        ages = [statistics.fmean(b["age"]) for b in result[name]["by_age"]]
        left.plot(ages, [b["recall@10"] for b in result[name]["by_age"]], marker="o", label=name)
        right.plot([c["length"] for c in result[name]["by_conversation"]],
                   [c["recall@10"] for c in result[name]["by_conversation"]], marker="s", linestyle="", label=name)
    left.set(xlabel="evidence age (turns after it in the conversation)", ylabel="recall@10 of evidence turns",
             title="by how far back the evidence is", ylim=(0, 1))
    right.set(xlabel="conversation length (turns)", ylabel="recall@10 of evidence turns",
              title="by conversation length", ylim=(0, 1))
    left.legend()
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--locomo-store", type=Path, required=True)
    ap.add_argument("--realtalk-store", type=Path, required=True)
    ap.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args()
    rows = {"locomo": observations("locomo", args.locomo_store), "realtalk": observations("realtalk", args.realtalk_store)}
    every = sorted(r["age"] for rs in rows.values() for r in rs)
    edges = sorted({int(np.quantile(every, q)) for q in np.linspace(0, 1, 7)[:-1]} | {every[-1] + 1})
    result: dict[str, Any] = {name: {"evidence_turns": len(rs), "by_age": bucketed(rs, edges),
                                     "by_conversation": by_conversation(rs), "slope_per_1000_turns": trend(rs)}
                              for name, rs in rows.items()}
    result["edges"] = edges
    if args.plot:
        plot(result, args.plot)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
