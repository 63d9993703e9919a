"""Recall's conflict check by sentence against the check it replaced, on one ingested store (round 3, session 18).

Fresh ingests differ from each other (near-tied hits order differently), so the end-to-end figures of two code
versions mix the rule's effect with the ingests'. This script opens one store made by ``benchmarks/locomo.py
--store DIR`` and ranks every question twice in the same process: with the shipped check and with the previous one
(each memory of several sentences taken whole: an older one at the pairwise model's ``supersede`` whatever the
query asks, a newer one never by its sentences),
and prints both recall summaries, their mean recall time, and each question whose evidence count differs.

    python benchmarks/locomo.py --data ../shared/data/realtalk/realtalk_dev5.json --k 5 10 --store /tmp/rt
    python research/sentence_conflicts_same_store.py --data ../shared/data/realtalk/realtalk_dev5.json --store /tmp/rt

Last line: {"shipped": {...}, "previous": {...}, "shipped_ms": ..., "previous_ms": ..., "ranked_differently": N}
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from locomo import questions_of, recall_summary, recalled  # noqa: E402

from agentmem import AgentMemory  # noqa: E402
from agentmem.consolidate.local import LocalConsolidator  # noqa: E402


def previous_check(self: LocalConsolidator, b: int, multi: dict[int, float], *args: object) -> list[int]:
    """The check before session 18: an older memory of several sentences conflicts when taken whole it reaches
    ``supersede``; the newer memory is taken whole (its one-sentence pairs at ``conflict``, by the caller)."""
    assert self.pairs is not None
    return [a for a, whole in multi.items() if whole >= self.pairs.supersede]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--store", type=Path, required=True, help="a store made by benchmarks/locomo.py --store")
    args = ap.parse_args()
    questions = questions_of(json.loads(args.data.read_text()),
                             json.loads((args.store / "locomo-ids.json").read_text())["ids"])
    shipped_check = LocalConsolidator._sentence_conflicts
    out: dict[str, object] = {}
    ranked = {}
    with AgentMemory(args.store) as mem:
        recalled(mem, questions[:20], 10)  # warm up: models, caches
        for name, check in (("shipped", shipped_check), ("previous", previous_check)):
            LocalConsolidator._sentence_conflicts = check  # type: ignore[method-assign]
            t0 = time.perf_counter()
            ranked[name] = recalled(mem, questions, 10)
            out[f"{name}_ms"] = round(1000 * (time.perf_counter() - t0) / len(questions), 2)
            out[name] = recall_summary(questions, ranked[name], [5, 10])
        LocalConsolidator._sentence_conflicts = shipped_check  # type: ignore[method-assign]
    for q, new, old in zip(questions, ranked["shipped"], ranked["previous"]):
        if len(set(new) & q.gold) != len(set(old) & q.gold):
            print(f"evidence {len(set(old) & q.gold)} -> {len(set(new) & q.gold)}: {q.text}", file=sys.stderr)
    out["ranked_differently"] = sum(a != b for a, b in zip(ranked["shipped"], ranked["previous"]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
