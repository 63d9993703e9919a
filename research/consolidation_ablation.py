"""Which of ``consolidation="local"``'s steps costs recall on a LoCoMo-shaped dev set (issue #37, REALTALK)?

On a store ingested with consolidation "local" (``benchmarks/locomo.py --store DIR``, reused), recall@5/@10 is
measured with each step switched off in turn, through the public config where one exists:

* ``shipped``: the defaults (superseded entries hand their place to their successor, conflict demotion on);
* ``no_demotion``: ``recall_conflict_demotion=False`` (both demotion rules off);
* ``demotion_pairwise_only`` / ``demotion_swapped_only``: one of the two demotion rules (the pairwise model's
  ``conflict`` threshold; a value-swapped restatement, ``swapped_values``) switched off inside the consolidator;
* ``no_version_following``: ``recall_follows_versions=False`` (superseded entries simply left out);
* ``superseded_shown`` / ``superseded_shown_no_demotion``: ``include_superseded=True`` (as if nothing had been
  superseded on write; merges of equal restatements stay, they cannot be undone on a reopened store).

Also counted: turns superseded and merged on write, and how many questions' evidence turns are among them.

    python research/consolidation_ablation.py --data ../shared/data/realtalk/realtalk_dev5.json \
        --store /tmp/rt-local

Last line: {"data": ..., "superseded_turns": N, "merged_turns": N, "evidence_superseded": N, ...,
"variants": {"shipped": {"recall@5": ..., "recall@10": ...}, ...}}
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]

import locomo  # noqa: E402

from agentmem import AgentMemory  # noqa: E402
from agentmem.consolidate import local  # noqa: E402

# variant -> (MemoryConfig overrides, include_superseded, the demotion rule switched off: None / pairwise / swapped)
VARIANTS: dict[str, tuple[dict[str, Any], bool, str | None]] = {
    "shipped": ({}, False, None),
    "no_demotion": ({"recall_conflict_demotion": False}, False, None),
    "demotion_pairwise_only": ({}, False, "swapped"),
    "demotion_swapped_only": ({}, False, "pairwise"),
    "no_version_following": ({"recall_follows_versions": False}, False, None),
    "superseded_shown": ({}, True, None),
    "superseded_shown_no_demotion": ({"recall_conflict_demotion": False}, True, None),
}


@contextlib.contextmanager
def rule_off(mem: AgentMemory, rule: str | None) -> Iterator[None]:
    """Inside the block one of recall's two demotion rules is off (research only: it reaches into the facade's
    consolidator, which has no switch per rule)."""
    if rule is None:
        yield
        return
    consolidator = mem._consolidator
    before_pairs, before_swapped = consolidator.pairs, local.swapped_values
    if rule == "pairwise":
        consolidator.pairs = dataclasses.replace(before_pairs, conflict=math.inf)
    else:
        local.swapped_values = lambda *a, **k: set()
    try:
        yield
    finally:
        consolidator.pairs, local.swapped_values = before_pairs, before_swapped


def recall_under(mem: AgentMemory, questions: list[locomo.Question], ks: list[int], include_superseded: bool,
                 ) -> list[list[str]]:
    return [[h.id for h in mem.recall(q.text, user_id=f"locomo-{q.conv}", k=max(ks),
                                      include_superseded=include_superseded)] for q in questions]


def write_effects(mem: AgentMemory, conversations: list[dict], id_maps: dict[str, dict[str, str]],
                  questions: list[locomo.Question]) -> dict[str, Any]:
    """Turns superseded / merged on write, and the questions whose evidence is among them."""
    superseded: set[str] = set()
    for cid in id_maps:
        superseded |= {r.id for r in mem.list(user_id=f"locomo-{cid}") if r.status != "active"}
    merged = sum(len(ids) - len(set(ids.values())) for ids in id_maps.values())
    gold = [q.gold for q in questions]
    return {"turns": sum(len(ids) for ids in id_maps.values()), "superseded_turns": len(superseded),
            "merged_turns": merged, "evidence_superseded": sum(len(g & superseded) for g in gold),
            "questions_with_superseded_evidence": sum(bool(g & superseded) for g in gold)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--store", required=True, type=Path, help="a store benchmarks/locomo.py ingested (local)")
    ap.add_argument("--k", type=int, nargs="+", default=[5, 10])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = ap.parse_args()

    conversations = json.loads(args.data.read_text())
    manifest = json.loads((args.store / "locomo-ids.json").read_text())
    assert manifest.get("consolidation", "local") == "local", "the store must be a consolidation='local' ingest"
    id_maps = manifest["ids"]
    questions = locomo.questions_of(conversations, id_maps)
    result: dict[str, Any] = {"data": args.data.name, "questions": len(questions), "variants": {}}
    for name in args.variants:
        overrides, shown, rule = VARIANTS[name]
        with AgentMemory(args.store, kv_encoding="off", consolidation="local", **overrides) as mem:
            if "turns" not in result:
                result.update(write_effects(mem, conversations, id_maps, questions))
            with rule_off(mem, rule):
                ranked = recall_under(mem, questions, args.k, shown)
        summary = locomo.recall_summary(questions, ranked, args.k)
        result["variants"][name] = summary
        print(name, json.dumps(summary), file=sys.stderr, flush=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
