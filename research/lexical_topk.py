"""Early-terminated lexical top-k against exhaustive BM25 on LoCoMo's real conversations, side by side, per catalog.

    python research/lexical_topk.py --data ../shared/data/locomo/locomo_dev5.json --backend embedded|postgres
        [--limit 100] [--merged]

Every turn goes into the catalog as the library indexes it (``memory_line``: speaker, date, text) under its
conversation's user, as ``benchmarks/locomo.py`` stores them, without embeddings or consolidation (lexical search
reads neither). Each question of categories 1-4 is searched twice on the same catalog: with the early termination
forced at every table size (``prune_min_docs = 0``: LoCoMo's conversations are far below the default threshold)
and scoring every match. ``--merged`` puts all conversations under one user (~3,000 documents). Counts: identical
result lists, lists equal except the order of scores tied at the cut, the share where the shortcut was taken, and
lexical recall@10 of the evidence turns for both.

Last line: {"backend", "questions", "identical", "equal_but_ties", "different", "shortcut_share",
"lexical_recall@10": [forced, exhaustive], "ms_p50": [forced, exhaustive]}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' helpers
from _backends import BACKENDS, backend_urls  # noqa: E402
from locomo import turn_text  # noqa: E402

from agentmem.ports.catalog import EntryRecord
from agentmem.entries.records import memory_line


def build(cat: Any, conversations: list[dict], *, merged: bool) -> dict[tuple[str, str], str]:
    """Index every turn; return {(conversation, dia_id): entry id}."""
    ids: dict[tuple[str, str], str] = {}
    for conv in conversations:
        cid = str(conv["conversation_id"])
        user = "locomo" if merged else f"locomo-{cid}"
        rows, lines = [], []
        for session in conv["sessions"]:
            for turn in session["turns"]:
                entry_id = f"{cid}-{turn['dia_id']}"
                line = memory_line(turn_text(turn), kind="turn", speaker=turn["speaker"], role=None,
                                   occurred_at=session["date_time"])
                rows.append(EntryRecord(id=entry_id, user_id=user, kind="turn", text=line, memory_text=line,
                                     created_at=float(len(ids)), metadata_json={}))
                lines.append(line)
                ids[cid, turn["dia_id"]] = entry_id
        cat.insert(rows, index_texts=lines)
    return ids


def compare(cat: Any, conversations: list[dict], ids: dict[tuple[str, str], str], *, limit: int,
            merged: bool) -> dict[str, Any]:
    """Ask every question both ways; count how the results compare."""
    counts = {"identical": 0, "equal_but_ties": 0, "different": 0}
    hit = {"forced": [], "exhaustive": []}
    ms = {"forced": [], "exhaustive": []}
    stops0 = cat.early_stops
    for conv in conversations:
        cid = str(conv["conversation_id"])
        for qa in conv["qa"]:
            gold = {ids[cid, d] for d in qa.get("evidence") or () if (cid, d) in ids}
            if qa.get("category") not in (1, 2, 3, 4) or not gold:
                continue
            got = {}
            for mode, threshold in (("forced", 0), ("exhaustive", 10**12)):
                cat.prune_min_docs = threshold
                t0 = time.perf_counter()
                got[mode] = cat.lexical_search(qa["question"], user_id="locomo" if merged else f"locomo-{cid}",
                                               limit=limit)
                ms[mode].append(1000 * (time.perf_counter() - t0))
                hit[mode].append(len(gold & {i for i, _ in got[mode][:10]}) / len(gold))
            counts[_verdict(got["forced"], got["exhaustive"])] += 1
    n = sum(counts.values())
    return {**counts, "questions": n, "shortcut_share": round((cat.early_stops - stops0) / max(n, 1), 4),
            "lexical_recall@10": [round(statistics.mean(hit[m]), 4) for m in hit],
            "ms_p50": [round(statistics.median(ms[m]), 2) for m in ms]}


def _verdict(fast: list[tuple[str, float]], full: list[tuple[str, float]]) -> str:
    if fast == full:
        return "identical"
    same_scores = len(fast) == len(full) and all(abs(a - b) <= 1e-9 * max(1.0, abs(b))
                                                 for (_, a), (_, b) in zip(fast, full))
    cut = full[-1][1] if full else 0.0
    untied = lambda hits: {i for i, s in hits if s > cut * (1 + 1e-9)}  # noqa: E731
    return "equal_but_ties" if same_scores and untied(fast) == untied(full) else "different"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--backend", choices=[b for b in BACKENDS if b != "chroma-server"], default="embedded")
    ap.add_argument("--limit", type=int, default=100, help="the candidate pool recall asks for (MemoryConfig)")
    ap.add_argument("--merged", action="store_true", help="every conversation under one user")
    args = ap.parse_args()
    conversations = json.loads(args.data.read_text())
    with tempfile.TemporaryDirectory(prefix="agentmem-lexk-") as tmp, \
            backend_urls(args.backend, Path(tmp)) as urls:
        if args.backend == "postgres":
            from agentmem.backends.postgres import PostgresCatalog

            cat = PostgresCatalog(urls["catalog_url"])
        else:
            from agentmem.backends.sqlite.catalog import SqliteCatalog

            cat = SqliteCatalog(str(Path(tmp) / "catalog.db"))
        ids = build(cat, conversations, merged=args.merged)
        out = compare(cat, conversations, ids, limit=args.limit, merged=args.merged)
        cat.close()
    print(json.dumps({"backend": args.backend, "merged": args.merged, "limit": args.limit, **out}))
    sys.exit(0 if out["different"] == 0 else 1)


if __name__ == "__main__":
    main()
