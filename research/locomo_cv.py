"""LoCoMo research modes over the store's own candidates, beside ``benchmarks/locomo.py``'s end-to-end figure.

``benchmarks/locomo.py`` is the product's claim: ``AgentMemory.recall`` with the defaults. The modes here reach into
the store, so they live in research/:

* ``--folds N``: the cross-validated figure. The conversations are split into N folds; for each fold the ranking
  constants (``GRID``, a small grid around the defaults) are chosen on the other folds and scored on it. The grid
  runs on the store's own candidates (``EntryStore.candidates``, retrieved once per question) with the library's
  ranking functions, so a setting costs no new retrieval (``Hit.score`` is fitted and cross-checked across datasets
  by ``research/fit_scores.py``).
* ``--held-out-towers DIR``: each conversation's questions asked through the query tower trained without that
  conversation (``research/train_query_tower.py --hold-out DIR``), the held-out figure of the shipped tower's path;
  with it, the ``--folds`` grid reads those held-out towers' candidates too.

The other research scripts take their candidate cache and the library's ranking of it from here
(:func:`gather_candidates`, :func:`ranking`, :func:`row_loader`).

    python research/locomo_cv.py --data ../shared/data/locomo/locomo_dev5.json --k 5 10 --folds 5 [--store DIR]

Takes every flag of ``benchmarks/locomo.py``; last line: that benchmark's line with ``"cv"`` and
``"held_out_towers"`` added.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "benchmarks")]  # benchmarks/locomo.py
import locomo  # noqa: E402

from agentmem import AgentMemory  # noqa: E402
from agentmem.entries.store import Scope  # noqa: E402
from agentmem.ports.catalog import CatalogScope  # noqa: E402
from agentmem.recall.head import HeadLoader, Ranked, rank_candidates  # noqa: E402
from agentmem.recall.learned_rank import HeadModel  # noqa: E402
from agentmem.recall.rerank import HeadEntry  # noqa: E402
from agentmem.recall.retrieval import Candidates, RetrievalParams  # noqa: E402

# the grid searched on the training folds: the ranking constants that moved recall when tried one by one
GRID = {"dense_weight": [0.35, 0.5], "session_weight": [0.5, 1.0], "speaker_boost": [0.0, 0.5, 1.0],
        "temporal_boost": [0.0, 0.2], "context_vector_weight": [0.0, 0.2, 0.35],
        "list_session_weight": [0.25, 0.5]}  # 0.5 = the default session weight: list questions ranked as others


def held_out_towers(mem: AgentMemory, questions: list[locomo.Question], ks: list[int], towers: Path) -> dict[str, Any]:
    """``end_to_end`` with each conversation's questions asked through the query tower trained without that
    conversation (:func:`conversation_tower`): the held-out figure of the shipped path (ONNX int8 tower, Chroma's
    HNSW, the shipped head and calibration)."""
    ranked: list[list[str]] = [[] for _ in questions]
    for conv in sorted({q.conv for q in questions}):
        idx = [j for j, q in enumerate(questions) if q.conv == conv]
        with conversation_tower(mem, towers, conv):
            for j, r in zip(idx, locomo.recalled(mem, [questions[j] for j in idx], max(ks))):
                ranked[j] = r
    return {**locomo.recall_summary(questions, ranked, ks), "by_conversation": by_conversation(questions, ranked, ks)}


def by_conversation(questions: list[locomo.Question], ranked: list[list[str]], ks: list[int]) -> dict[str, Any]:
    """:func:`recall_summary` of each conversation's questions alone: how far the figure moves from one conversation
    to the next is what a held-out conversation may see (a category's recall@10 has ~10-70 questions behind it in one
    conversation)."""
    result: dict[str, Any] = {}
    for conv in sorted({q.conv for q in questions}):
        idx = [j for j, q in enumerate(questions) if q.conv == conv]
        result[conv] = locomo.recall_summary([questions[j] for j in idx], [ranked[j] for j in idx], ks)
    return result


@contextlib.contextmanager
def conversation_tower(mem: AgentMemory, towers: Path | None, conv: str) -> Iterator[None]:
    """Inside the block the store's embedder asks through ``towers/<conv>.safetensors`` (a query tower trained
    without conversation ``conv``: ``research/train_query_tower.py --hold-out``); nothing changes when ``towers``
    is None. Swapped in place: research, reaching into the store as the candidate cache does."""
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


def ranking(q: locomo.Question, cands: Candidates, rows: dict[str, Any], p: RetrievalParams, k: int,
            model: HeadModel = HeadModel()) -> list[tuple[str, float]]:
    """The store's ranking (``agentmem.recall.head.rank_candidates``, what recall orders by) for one setting, every
    row admitted, the head's learned order with ``model``'s weights (default the shipped ones)."""
    return rank_candidates(q.text, cands, p, k, row_loader(rows), model)


def cross_validate(questions: list[locomo.Question], rows: dict[str, Any], ks: list[int], folds: int) -> dict[str, Any]:
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


def gather_candidates(mem: AgentMemory, questions: list[locomo.Question], pool: int,
                      towers: Path | None = None) -> dict[str, Any]:
    """Retrieve every question's candidates once (with ``towers``, each conversation's through its held-out tower);
    return every turn's row."""
    store = mem._store  # research re-ranks the store's own candidates: see the module docstring
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


def research_modes(args: Any) -> locomo.MoreModes:
    """What ``--folds`` and ``--held-out-towers`` add to ``benchmarks/locomo.py``'s result (``held_out_towers``,
    ``cv``), run on its open store."""
    def more(mem: AgentMemory, questions: list[locomo.Question], result: dict[str, Any]) -> None:
        if args.held_out_towers:
            result["held_out_towers"] = held_out_towers(mem, questions, args.k, args.held_out_towers)
        if args.folds:
            rows = gather_candidates(mem, questions, max(mem.config.candidate_pool, 4 * max(args.k)),
                                     args.held_out_towers)
            result["cv"] = cross_validate(questions, rows, args.k, args.folds)

    return more


def main() -> None:
    ap = locomo.arg_parser()
    ap.description = __doc__
    ap.add_argument("--folds", type=int, default=0, help="cross-validate over conversations in this many folds")
    ap.add_argument("--held-out-towers", type=Path, default=None,
                    help="also: each conversation's questions through DIR/<conversation>.safetensors, a tower trained "
                    "without it (research/train_query_tower.py --hold-out)")
    args = ap.parse_args()
    print(json.dumps(locomo.measure(args, research_modes(args))), flush=True)


if __name__ == "__main__":
    main()
