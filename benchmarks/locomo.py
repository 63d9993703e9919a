"""Retrieval recall@k on LoCoMo-shaped data, through the public API only.

Every turn of each conversation is remembered as a memory of that conversation's user (speaker and
session date kept in the memory line); for each question of categories 1-4 we report the share of its
evidence turns among the top k recalled.

    python benchmarks/locomo.py --data ../shared/data/locomo/locomo_dev5.json --k 5 10

Last line: {"recall@5": ..., "recall@10": ..., "questions": N, ...}
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from tqdm import tqdm

from agentmem import AgentMemory


def turn_text(turn: dict) -> str:
    text = turn["text"]
    if turn.get("image_caption"):
        text += f" [shares a photo: {turn['image_caption']}]"
    return text


def load_conversations(mem: AgentMemory, conversations: list[dict]) -> dict[str, dict[str, str]]:
    """Remember every turn (one batch per session); return {conversation_id: {dia_id: entry_id}}."""
    id_maps: dict[str, dict[str, str]] = {}
    for conv in tqdm(conversations, desc="remembering", unit="conv", disable=None):
        cid = str(conv["conversation_id"])
        id_maps[cid] = {}
        for session in conv["sessions"]:
            records = mem.remember_many([
                dict(text=turn_text(turn), user_id=f"locomo-{cid}", session_id=f"{cid}-s{session['session']}",
                     kind="turn", speaker=turn["speaker"], timestamp=session["date_time"],
                     metadata={"dia_id": turn["dia_id"]})
                for turn in session["turns"]
            ])
            for turn, rec in zip(session["turns"], records):
                id_maps[cid][turn["dia_id"]] = rec.id
    return id_maps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--k", type=int, nargs="+", default=[5, 10])
    ap.add_argument("--store", type=Path, default=None, help="store directory (default: a temp dir)")
    args = ap.parse_args()

    conversations = json.loads(args.data.read_text())
    kmax = max(args.k)
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or Path(tmp) / "locomo"
        with AgentMemory(store) as mem:
            t0 = time.time()
            id_maps = load_conversations(mem, conversations)
            ingest_s = time.time() - t0
            per_k: dict[int, list[float]] = defaultdict(list)
            per_cat: dict[int, list[float]] = defaultdict(list)
            questions = [(c, q) for c in conversations for q in c["qa"]
                         if q.get("category") in (1, 2, 3, 4) and q.get("evidence")]
            t0 = time.time()
            for conv, qa in tqdm(questions, desc="recalling", unit="q", disable=None):
                cid = str(conv["conversation_id"])
                gold = {id_maps[cid][d] for d in qa["evidence"] if d in id_maps[cid]}
                if not gold:
                    continue
                hits = mem.recall(qa["question"], user_id=f"locomo-{cid}", k=kmax)
                ranked = [h.id for h in hits]
                for k in args.k:
                    per_k[k].append(len(gold & set(ranked[:k])) / len(gold))
                per_cat[qa["category"]].append(len(gold & set(ranked[:kmax])) / len(gold))
            recall_s = time.time() - t0
    result = {f"recall@{k}": round(sum(v) / len(v), 4) for k, v in sorted(per_k.items())}
    result["questions"] = len(per_k[kmax])
    result[f"recall@{kmax}_by_category"] = {str(c): round(sum(v) / len(v), 4) for c, v in sorted(per_cat.items())}
    result["ingest_s"] = round(ingest_s, 1)
    result["recall_ms_mean"] = round(1000 * recall_s / max(1, len(questions)), 2)
    print(json.dumps(result), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
