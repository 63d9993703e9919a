"""What a stricter supersession rule would have kept, simulated on a kept ``benchmarks/locomo.py`` store (issue #37).

Restores (``AgentMemory.restore``, the documented undo) every superseded turn that the rule would not supersede
today: with ``--rule sentences``, an older turn of more than one sentence
(``agentmem.consolidate.statements.sentence_count``); with ``--rule session``, one superseded by a turn of its own
conversation session. Run it on a COPY of the store, then ``benchmarks/locomo.py --store COPY`` for the recall the
rule gives. A simulation, not a fresh ingest: a turn kept active would also have been a neighbour (part of the
speaker's background) for later writes, which the restored store never saw.

    cp -r STORE COPY && python research/restore_by_rule.py --data realtalk_dev5.json --store COPY --rule sentences

Last line: {"superseded": N, "restored": n, "evidence_restored": e, "left": [...]}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from locomo import turn_text  # noqa: E402

from agentmem import AgentMemory  # noqa: E402
from agentmem.consolidate.statements import sentence_count  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--store", type=Path, required=True, help="a copy of a locomo.py store (it is changed)")
    ap.add_argument("--rule", choices=["sentences", "session"], required=True)
    args = ap.parse_args()
    conversations = {str(c["conversation_id"]): c for c in json.loads(args.data.read_text())}
    ids = json.loads((args.store / "locomo-ids.json").read_text())["ids"]
    out = {"superseded": 0, "restored": 0, "evidence_restored": 0, "left": []}
    with AgentMemory(args.store, kv_encoding="off", consolidation="local") as mem:
        for cid, by_dia in ids.items():
            conv = conversations[cid]
            evidence = {e for q in conv["qa"] if int(q.get("category", 0)) in (1, 2, 3, 4) for e in q["evidence"]}
            texts = {t["dia_id"]: turn_text(t) for s in conv["sessions"] for t in s["turns"]}
            for dia, entry_id in by_dia.items():
                rec = mem.get(entry_id)
                if rec.status != "superseded":
                    continue
                out["superseded"] += 1
                newer = mem.get(rec.superseded_by)
                kept = (sentence_count(texts[dia]) > 1 if args.rule == "sentences"
                        else rec.session_id == newer.session_id)
                if kept:
                    mem.restore(entry_id)
                    out["restored"] += 1
                    out["evidence_restored"] += dia in evidence
                else:
                    out["left"].append({"older": texts[dia][:80], "newer": newer.text[:80], "evidence": dia in evidence})
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
