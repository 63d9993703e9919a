"""Retrieval recall@k on LoCoMo-shaped data, end to end and cross-validated over conversations.

Every turn of each conversation is remembered as a memory of that conversation's user (speaker and
session date kept in the memory line); for each question of categories 1-4 we report the share of its
evidence turns among the top k recalled (public API: ``recall``).

    python benchmarks/locomo.py --data ../shared/data/locomo/locomo_dev5.json --k 5 10 [--folds 5]
        [--backend embedded|postgres|chroma-server] [--consolidation off|local|llm] [--min-score 0.5]

Consolidation is the library's default (``MemoryConfig().consolidation``, "local") unless ``--consolidation`` says
otherwise, so the figure is what a user of the defaults gets; what it costs against "off" is measured by the
lifecycle benchmark (docs/lifecycle.md).

``--folds N`` adds the cross-validated figure: the conversations are split into N folds; for each fold the
ranking constants (a small grid around the defaults) are chosen on the other folds and scored on it. The grid runs on
the store's own candidates (``EntryStore.candidates``, retrieved once per question) with the library's ranking
functions, so a setting costs no new retrieval. (``Hit.score`` is fitted and cross-checked across datasets by
``research/fit_scores.py``.)

``--min-score T [T ...]`` adds, for each threshold, recall@k of ``recall(..., min_score=T)`` and ``kept@k``, its share
of the unthresholded recall@k: what a ``min_score`` (or ``MemoryConfig.mount_min_score``) of T costs in evidence.

``--query-tower`` sets ``MemoryConfig.query_tower`` (``none``: the plain MiniLM query); ``--held-out-towers DIR`` adds
the figure with each conversation's questions asked through a tower trained without that conversation
(``research/train_query_tower.py --hold-out DIR``), the held-out figure of the shipped tower's path; with it, the
``--folds`` grid and calibration read those held-out towers' candidates too.

Last line: {"backend": ..., "consolidation": ..., "recall@5": ..., "recall@10": ..., "questions": N, ..., "cv": {...}}
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from _backends import BACKENDS, backend_urls

from agentmem.ports.catalog import CatalogScope
from agentmem import AgentMemory, MemoryConfig
from agentmem.entries.store import Scope
from agentmem.recall.head import HeadLoader, Ranked, rank_candidates
from agentmem.recall.learned_rank import HeadModel
from agentmem.recall.rerank import HeadEntry
from agentmem.recall.retrieval import Candidates, RetrievalParams

# the grid searched on the training folds: the ranking constants that moved recall when tried one by one
GRID = {"dense_weight": [0.35, 0.5], "session_weight": [0.5, 1.0], "speaker_boost": [0.0, 0.5, 1.0],
        "temporal_boost": [0.0, 0.2], "context_vector_weight": [0.0, 0.2, 0.35],
        "list_session_weight": [0.25, 0.5]}  # 0.5 = the default session weight: list questions ranked as others


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
    cands: Candidates | None = None  # asked of its own conversation


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


def held_out_towers(mem: AgentMemory, questions: list[Question], ks: list[int], towers: Path) -> dict[str, Any]:
    """``end_to_end`` with each conversation's questions asked through the query tower trained without that
    conversation (:func:`conversation_tower`): the held-out figure of the shipped path (ONNX int8 tower, Chroma's
    HNSW, the shipped head and calibration)."""
    ranked: list[list[str]] = [[] for _ in questions]
    for conv in sorted({q.conv for q in questions}):
        idx = [j for j, q in enumerate(questions) if q.conv == conv]
        with conversation_tower(mem, towers, conv):
            for j, r in zip(idx, recalled(mem, [questions[j] for j in idx], max(ks))):
                ranked[j] = r
    return {**recall_summary(questions, ranked, ks), "by_conversation": by_conversation(questions, ranked, ks)}


def by_conversation(questions: list[Question], ranked: list[list[str]], ks: list[int]) -> dict[str, Any]:
    """:func:`recall_summary` of each conversation's questions alone: how far the figure moves from one conversation
    to the next is what a held-out conversation may see (a category's recall@10 has ~10-70 questions behind it in one
    conversation)."""
    result: dict[str, Any] = {}
    for conv in sorted({q.conv for q in questions}):
        idx = [j for j, q in enumerate(questions) if q.conv == conv]
        result[conv] = recall_summary([questions[j] for j in idx], [ranked[j] for j in idx], ks)
    return result


@contextlib.contextmanager
def conversation_tower(mem: AgentMemory, towers: Path | None, conv: str) -> Iterator[None]:
    """Inside the block the store's embedder asks through ``towers/<conv>.safetensors`` (a query tower trained
    without conversation ``conv``: ``research/train_query_tower.py --hold-out``); nothing changes when ``towers``
    is None. The benchmark swaps the tower in place, as it reaches into the store for candidates."""
    if towers is None:
        yield
        return
    from agentmem.embed.query_tower import QueryTower

    embedder = mem._store.embedder
    before, embedder.query_tower = embedder.query_tower, QueryTower.load(towers / f"{conv}.safetensors")
    try:
        yield
    finally:
        embedder.query_tower = before


def row_loader(rows: dict[str, Any]) -> HeadLoader:
    """The head loader of cached rows, every row admitted (no scope filters, no versions followed).

    Example:
        >>> from types import SimpleNamespace as Row
        >>> head, tail = row_loader({"a": Row(speaker="Ann", memory_text="Ann: hi")})([("a", 1.0), ("b", 0.5)], 1)
        >>> [h.id for h in head], tail
        (['a'], [('b', 0.5)])
    """
    def load(ranked: Ranked, depth: int) -> tuple[list[HeadEntry], Ranked]:
        return [HeadEntry(i, s, rows[i].speaker, rows[i].memory_text, getattr(rows[i], "text", None),
                          getattr(rows[i], "occurred_at", None)) for i, s in ranked[:depth]], ranked[depth:]

    return load


def ranking(q: Question, cands: Candidates, rows: dict[str, Any], p: RetrievalParams, k: int,
            model: HeadModel = HeadModel()) -> list[tuple[str, float]]:
    """The store's ranking (``agentmem.recall.head.rank_candidates``, what recall orders by) for one setting, every
    row admitted, the head's learned order with ``model``'s weights (default the shipped ones)."""
    return rank_candidates(q.text, cands, p, k, row_loader(rows), model)


def cross_validate(questions: list[Question], rows: dict[str, Any], ks: list[int], folds: int) -> dict[str, Any]:
    kmax = max(ks)
    convs = sorted({q.conv for q in questions})
    fold_of = {c: i % folds for i, c in enumerate(convs)}
    settings = [replace(RetrievalParams(), **dict(zip(GRID, values))) for values in itertools.product(*GRID.values())]
    # recall of every question under every setting (pure ranking over cached candidates)
    recall: dict[int, list[dict[int, float]]] = {}
    for si, p in enumerate(tqdm(settings, desc="grid", disable=None)):
        recall[si] = []
        for q in questions:
            top = [i for i, _ in ranking(q, q.cands, rows, p, kmax)]
            recall[si].append({k: len(q.gold & set(top[:k])) / len(q.gold) for k in ks})

    def mean_recall(si: int, members: list[int]) -> float:
        return sum(recall[si][j][k] for j in members for k in ks) / (len(members) * len(ks))

    held: list[dict[int, float]] = [{} for _ in questions]
    chosen = []
    for f in range(folds):
        train = [j for j, q in enumerate(questions) if fold_of[q.conv] != f]
        test = [j for j, q in enumerate(questions) if fold_of[q.conv] == f]
        if not test:
            continue
        best = max(range(len(settings)), key=lambda si: mean_recall(si, train))
        chosen.append({name: getattr(settings[best], name) for name in GRID})
        for j in test:
            held[j] = recall[best][j]
    per_cat: dict[int, list[float]] = defaultdict(list)
    for q, r in zip(questions, held):
        per_cat[q.category].append(r[kmax])
    out: dict[str, Any] = {f"recall@{k}": round(statistics.fmean(r[k] for r in held), 4) for k in ks}
    out[f"recall@{kmax}_by_category"] = {str(c): round(statistics.fmean(v), 4) for c, v in sorted(per_cat.items())}
    out["fold_mean"] = {f"recall@{k}": round(statistics.fmean(
        statistics.fmean(held[j][k] for j, q in enumerate(questions) if fold_of[q.conv] == f)
        for f in range(folds)), 4) for k in ks}
    out["chosen"] = chosen
    return out


def gather_candidates(mem: AgentMemory, questions: list[Question], pool: int,
                      towers: Path | None = None) -> dict[str, Any]:
    """Retrieve every question's candidates once (with ``towers``, each conversation's through its held-out tower);
    return every turn's row."""
    store = mem._store  # the benchmark re-ranks the store's own candidates: see the module docstring
    convs = sorted({q.conv for q in questions})
    bar = tqdm(total=len(questions), desc="candidates", unit="q", disable=None)
    for conv in convs:
        with conversation_tower(mem, towers, conv):
            for q in (q for q in questions if q.conv == conv):
                q.cands, _ = store.candidates(q.text, Scope(f"locomo-{q.conv}"), pool=pool)
                bar.update()
    bar.close()
    rows: dict[str, Any] = {}
    for c in convs:
        ids = [i for page in store.catalog.iter_ids(CatalogScope(user_id=f"locomo-{c}")) for i in page]
        rows.update({r.id: r for r in store.catalog.get(ids)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--k", type=int, nargs="+", default=[5, 10])
    ap.add_argument("--store", type=Path, default=None,
                    help="store directory (default: a temp dir); reused when it holds this data's ingest")
    ap.add_argument("--folds", type=int, default=0, help="cross-validate over conversations in this many folds")
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
    ap.add_argument("--held-out-towers", type=Path, default=None,
                    help="also: each conversation's questions through DIR/<conversation>.safetensors, a tower trained "
                    "without it (research/train_query_tower.py --hold-out)")
    args = ap.parse_args()

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
            if args.held_out_towers:
                result["held_out_towers"] = held_out_towers(mem, questions, args.k, args.held_out_towers)
            if args.folds:
                rows = gather_candidates(mem, questions, max(mem.config.candidate_pool, 4 * max(args.k)),
                                         args.held_out_towers)
                result["cv"] = cross_validate(questions, rows, args.k, args.folds)
    print(json.dumps(result), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
