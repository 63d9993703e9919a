"""Retrieval recall@k on LoCoMo-shaped data, end to end through the public API.

Every turn of each conversation is remembered as a memory of that conversation's user (speaker and
session date kept in the memory line); for each question of categories 1-4 we report the share of its
evidence turns among the top k recalled (``AgentMemory.recall`` with the store's defaults).

    python benchmarks/locomo.py --data ../shared/data/locomo/locomo_dev5.json --k 5 10
        [--backend embedded|postgres|chroma-server] [--consolidation off|local|llm] [--min-score 0.5]

Consolidation is the library's default (``MemoryConfig().consolidation``, "local") unless ``--consolidation`` says
otherwise, so the figure is what a user of the defaults gets; what it costs against "off" is measured by the
lifecycle benchmark (docs/lifecycle.md).

``--min-score T [T ...]`` adds, for each threshold, recall@k of ``recall(..., min_score=T)`` and ``kept@k``, its share
of the unthresholded recall@k: what a ``min_score`` (or ``MemoryConfig.mount_min_score``) of T costs in evidence.

``--query-tower`` sets ``MemoryConfig.query_tower`` (``none``: the plain MiniLM query). The research modes that
re-rank the store's own candidates (``--folds N``: ranking constants cross-validated over conversations) or swap
the query tower per conversation (``--held-out-towers DIR``) are ``research/locomo_cv.py``, which takes these
flags too and prints this line with its own keys added.

Last line: {"backend": ..., "consolidation": ..., "recall@5": ..., "recall@10": ..., "questions": N, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from _backends import BACKENDS, backend_urls

from agentmem import AgentMemory, MemoryConfig

# what a manifest written before a field existed was made with
DEFAULT_MADE_BY = {"backend": "embedded", "consolidation": "local"}


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


@dataclass
class Question:
    conv: str
    text: str
    category: int
    gold: set[str]
    cands: Any = None  # research/locomo_cv.py: the store's own candidates, asked of its own conversation


def ingest_once(mem: AgentMemory, conversations: list[dict], manifest: Path,
                made_by: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The conversations' id maps: read from ``manifest`` when it records a store made the same way (``made_by``),
    else ingested now and recorded there, so a kept ``--store`` is ingested once for this and the ablation scripts.

    Example:
        >>> ingest_once(mem, conversations, store / "locomo-ids.json", {"backend": "embedded"})   # doctest: +SKIP
        {'conv-26': {'D1:1': '...', ...}, ...}
    """
    if manifest.exists():
        recorded = json.loads(manifest.read_text())
        if all(recorded.get(k, DEFAULT_MADE_BY.get(k)) == v for k, v in made_by.items()):
            return recorded["ids"]
    id_maps = load_conversations(mem, conversations)
    manifest.write_text(json.dumps({**made_by, "ids": id_maps}))
    return id_maps


def questions_of(conversations: list[dict], id_maps: dict[str, dict[str, str]]) -> list[Question]:
    out = []
    for conv in conversations:
        cid = str(conv["conversation_id"])
        for qa in conv["qa"]:
            if qa.get("category") not in (1, 2, 3, 4) or not qa.get("evidence"):
                continue
            gold = {id_maps[cid][d] for d in qa["evidence"] if d in id_maps[cid]}
            if gold:
                out.append(Question(cid, qa["question"], qa["category"], gold))
    return out


def end_to_end(mem: AgentMemory, questions: list[Question], ks: list[int]) -> dict[str, Any]:
    """recall() through the public API with the library's defaults."""
    t0 = time.time()
    ranked = recalled(mem, questions, max(ks))
    result = recall_summary(questions, ranked, ks)
    result["recall_ms_mean"] = round(1000 * (time.time() - t0) / max(1, len(questions)), 2)
    return result


def recalled(mem: AgentMemory, questions: list[Question], k: int, min_score: float | None = None) -> list[list[str]]:
    """Every question's top-``k`` ids from ``recall()`` (those scoring at least ``min_score``, if given)."""
    return [[h.id for h in mem.recall(q.text, user_id=f"locomo-{q.conv}", k=k, min_score=min_score)]
            for q in tqdm(questions, desc="recalling", unit="q", disable=None)]


def thresholded(mem: AgentMemory, questions: list[Question], ks: list[int], cuts: list[float],
                unthresholded: dict[str, Any]) -> dict[str, Any]:
    """recall@k of ``recall(min_score=T)`` for each T of ``cuts``, and ``kept@k``: its share of ``unthresholded``'s."""
    out: dict[str, Any] = {}
    for cut in cuts:
        summary = recall_summary(questions, recalled(mem, questions, max(ks), cut), ks)
        kept = {f"kept@{k}": round(summary[f"recall@{k}"] / unthresholded[f"recall@{k}"], 4) for k in ks
                if unthresholded[f"recall@{k}"]}
        out[str(cut)] = {**summary, **kept}
    return out


def recall_summary(questions: list[Question], ranked: list[list[str]], ks: list[int]) -> dict[str, Any]:
    """recall@k (the share of a question's evidence turns in its top k) pooled over questions, and by category at
    the largest k."""
    kmax = max(ks)
    per_k = {k: [len(q.gold & set(r[:k])) / len(q.gold) for q, r in zip(questions, ranked)] for k in ks}
    per_cat: dict[int, list[float]] = defaultdict(list)
    for q, r in zip(questions, ranked):
        per_cat[q.category].append(len(q.gold & set(r[:kmax])) / len(q.gold))
    result: dict[str, Any] = {f"recall@{k}": round(statistics.fmean(v), 4) for k, v in sorted(per_k.items())}
    result["questions"] = len(questions)
    result[f"recall@{kmax}_by_category"] = {str(c): round(statistics.fmean(v), 4) for c, v in sorted(per_cat.items())}
    return result


def arg_parser() -> argparse.ArgumentParser:
    """The benchmark's flags (``research/locomo_cv.py`` adds its own to them).

    Example:
        >>> arg_parser().parse_args(["--data", "d.json", "--min-score", "0.5"]).min_score
        [0.5]
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--k", type=int, nargs="+", default=[5, 10])
    ap.add_argument("--store", type=Path, default=None,
                    help="store directory (default: a temp dir); reused when it holds this data's ingest")
    ap.add_argument("--min-score", type=float, nargs="*", default=[],
                    help="also: recall@k with recall(min_score=T) for each T, and its share of the plain recall@k")
    ap.add_argument("--conversations", type=int, default=None, help="only the first N conversations (a quicker run)")
    ap.add_argument("--backend", choices=BACKENDS, default="embedded",
                    help="where the catalog / vectors live (servers started for the run, see benchmarks/_backends.py)")
    ap.add_argument("--consolidation", choices=["off", "local", "llm"], default=MemoryConfig().consolidation,
                    help="remember()'s consolidation (default: the library's; what 'local' costs against 'off' on "
                    "LoCoMo is measured in docs/lifecycle.md)")
    ap.add_argument("--query-tower", default="auto",
                    help="MemoryConfig.query_tower for recall: auto (the bundled tower), none (off) or a tower file")
    return ap


# what research/locomo_cv.py adds to the result: (mem, questions, result) -> None, run with the store still open
MoreModes = Callable[[AgentMemory, list[Question], dict[str, Any]], None]


def measure(args: argparse.Namespace, more: MoreModes | None = None) -> dict[str, Any]:
    """Ingest (or reuse ``args.store``'s ingest), recall every question, and return the result line's dict.

    Example:
        >>> measure(arg_parser().parse_args(["--data", "locomo_dev5.json"]))["recall@10"]   # doctest: +SKIP
        0.8446
    """
    conversations = json.loads(args.data.read_text())[: args.conversations]
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # a PostgreSQL server user must reach its data dir under it
        store = args.store or Path(tmp) / "locomo"
        made_by = {"data": str(args.data.resolve()), "backend": args.backend, "consolidation": args.consolidation,
                   "conversations": args.conversations}
        with backend_urls(args.backend, store.parent / f"{store.name}-servers", keep=args.store is not None) as urls, \
                AgentMemory(store, kv_encoding="off", consolidation=args.consolidation,
                            query_tower=None if args.query_tower == "none" else args.query_tower, **urls) as mem:
            t0 = time.time()
            id_maps = ingest_once(mem, conversations, store / "locomo-ids.json", made_by)
            ingest_s = time.time() - t0
            questions = questions_of(conversations, id_maps)
            result = {"backend": args.backend, "consolidation": args.consolidation,
                      **end_to_end(mem, questions, args.k)}
            result["ingest_s"] = round(ingest_s, 1)
            if args.min_score:
                result["min_score"] = thresholded(mem, questions, args.k, args.min_score, result)
            if more is not None:
                more(mem, questions, result)
    return result


def main() -> None:
    print(json.dumps(measure(arg_parser().parse_args())), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
