"""Why recall falls as the history grows: is the evidence still among the candidates? (issue #38, "recall must not
fall off with history length").

``research/recall_by_history_size.py`` found that the same questions lose recall@10 as the history grows (REALTALK
0.790 at its own length, 0.731 padded to 1,400 turns). Recall ranks a fixed-size candidate pool
(``MemoryConfig.candidate_pool``: 100 dense and 100 lexical candidates, plus the turn-context search's 100): 100
candidates are a fifth of a 500-turn history but a fourteenth of a 1,400-turn one. This script separates the two
possible losses. For each dev conversation one store (defaults, embedded models, ``benchmarks/locomo.py``'s ingest)
holds the conversation (checkpoint "100%"), then the same padding as ``recall_by_history_size.py`` up to
``--pad-to`` turns (checkpoint "padded"). At each checkpoint, for every question (categories 1-4) and each
``--pools`` value:

- ``recall@5`` / ``recall@10`` of ``recall()`` with ``candidate_pool`` set to that value (the store's own setting,
  changed in place between runs: the same store, only the pool differs);
- ``in_pool``: the share of evidence turns that are among the candidates (dense, lexical or turn context) the
  pool-100 search gathers, before any ranking;
- ``padding_in_top10``: at the padded checkpoint, how many of the top 10 are padding turns (other people's chats).

    nice -n 15 python research/pool_by_history_size.py --datasets realtalk locomo \
        --out research/notes/pool_by_history_size.json

Last line: {"realtalk": {"100%": {"history_turns": ..., "in_pool": ..., "pools": {"100": {"recall@5": ...}}}, ...}}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "research")]
import locomo  # noqa: E402
import recall_by_history_size as growth  # noqa: E402

from agentmem import AgentMemory  # noqa: E402
from agentmem.entries.store import Scope  # noqa: E402

KS = [5, 10]


def ranked_with_pool(mem: AgentMemory, questions: list, pool: int) -> list[list[str]]:
    """Every question's top-10 ids from ``recall()`` with the store's candidate pool set to ``pool``."""
    store = mem._store  # research: the one setting changed in place, so the same store is ranked each time
    store.config = store.config.model_copy(update={"candidate_pool": pool})
    return locomo.recalled(mem, questions, max(KS))


def in_pool(mem: AgentMemory, questions: list, pool: int) -> float:
    """The share of evidence turns among the candidates of a ``pool``-sized search (dense, lexical, turn context)."""
    shares = []
    for q in questions:
        cands, _ = mem._store.candidates(q.text, Scope(f"locomo-{q.conv}"), pool=pool)
        found = cands.dense.keys() | cands.lexical.keys() | cands.turn_context.keys()
        shares.append(len(q.gold & found) / len(q.gold))
    return round(statistics.fmean(shares), 4)


def checkpoint(mem: AgentMemory, questions: list, pools: list[int], padding_ids: set[str]) -> dict[str, Any]:
    """Recall of ``questions`` at each pool size, the pool-100 candidates' coverage and the padding in the top 10."""
    out: dict[str, Any] = {"in_pool": in_pool(mem, questions, 100), "pools": {}}
    for pool in pools:
        ranked = ranked_with_pool(mem, questions, pool)
        summary = locomo.recall_summary(questions, ranked, KS)
        out["pools"][str(pool)] = {k: summary[k] for k in ("recall@5", "recall@10")}
        if pool == 100:
            out["padding_in_top10"] = round(statistics.fmean(len(padding_ids & set(r)) for r in ranked), 3)
    return out


def measure(name: str, work: Path, pad_to: int, pools: list[int], conversations: int | None) -> dict[str, Any]:
    """One grown store per conversation of dataset ``name``; both checkpoints pooled over its conversations."""
    convs = json.loads(growth.DATA[name].read_text())
    chosen = range(len(convs))[:conversations]
    rows: dict[str, list[tuple[int, list, dict]]] = {"100%": [], "padded": []}
    for i in tqdm(chosen, desc=f"{name}: conversations", unit="conv"):
        conv, pad = convs[i], growth.padding(convs, i, pad_to)
        with tempfile.TemporaryDirectory(dir=work) as tmp, AgentMemory(Path(tmp) / "s", kv_encoding="off") as mem:
            cid = str(conv["conversation_id"])
            id_map = locomo.load_conversations(mem, [conv])[cid]
            questions = locomo.questions_of([conv], {cid: id_map})
            own = sum(len(s["turns"]) for s in conv["sessions"])
            rows["100%"].append((own, questions, checkpoint(mem, questions, pools, set())))
            padding_ids = set(locomo.load_conversations(mem, [pad])[cid].values())
            turns = own + sum(len(s["turns"]) for s in pad["sessions"])
            rows["padded"].append((turns, questions, checkpoint(mem, questions, pools, padding_ids)))
    return {label: pooled(found) for label, found in rows.items()}


def pooled(found: list[tuple[int, list, dict]]) -> dict[str, Any]:
    """Question-weighted means over conversations of one checkpoint's figures."""
    weights = [len(qs) for _, qs, _ in found]

    def mean(values: list[float]) -> float:
        return round(sum(w * v for w, v in zip(weights, values)) / sum(weights), 4)

    pools = found[0][2]["pools"]
    out: dict[str, Any] = {"history_turns": round(statistics.fmean(t for t, _, _ in found), 1),
                           "questions": sum(weights), "in_pool": mean([f["in_pool"] for _, _, f in found])}
    if "padding_in_top10" in found[0][2]:
        out["padding_in_top10"] = mean([f["padding_in_top10"] for _, _, f in found])
    out["pools"] = {p: {k: mean([f["pools"][p][k] for _, _, f in found]) for k in ("recall@5", "recall@10")}
                    for p in pools}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", nargs="+", choices=list(growth.DATA), default=list(growth.DATA))
    ap.add_argument("--pad-to", type=int, default=1400)
    ap.add_argument("--pools", type=int, nargs="+", default=[100, 200, 400])
    ap.add_argument("--conversations", type=int, default=None, help="only the first N conversations (a smoke run)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--out", type=Path, default=None, help="also write the result (JSON) here")
    args = ap.parse_args()
    result: dict[str, Any] = {name: measure(name, args.work, args.pad_to, args.pools, args.conversations)
                              for name in args.datasets}
    result["config"] = {"pad_to": args.pad_to, "pools": args.pools, "conversations": args.conversations}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
