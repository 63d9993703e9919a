"""What the query parsing (agentmem.recall.query) and the entry-field signals (agentmem.recall.temporal) are worth on
two datasets: every variant ranks the store's own candidates, retrieved once per question, with the library's
ranking (``rank_candidates``, every row admitted), and reports recall@5/@10 per dataset and category.

    python research/query_ablation.py --data ../shared/data/locomo/locomo_dev5.json --store DIR --cache L.pkl
    python research/query_ablation.py --data ../shared/data/realtalk/realtalk_dev5.json --store DIR2 --cache R.pkl
    python research/query_ablation.py --eval L.pkl R.pkl [--fit-anchor 0,0.25,0.5,1]

``--store`` is a ``benchmarks/locomo.py --store`` directory (its ingest reused); the cache holds each question's
candidates and every turn's row fields the ranking reads. ``--fit-anchor v1,v2,...`` cross-dataset validates a
boost of the head entries dated on a day the question names (``--anchor-days``: or that many days either side):
chosen on one dataset (recall@10, ties to the smaller value), scored on the other, both directions, beside the
in-sample figures. Last line: JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pickle
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]  # research/, benchmarks/
import locomo  # noqa: E402
import locomo_cv  # noqa: E402

from agentmem.ports.catalog import CatalogScope
from agentmem import AgentMemory  # noqa: E402
from agentmem.entries.store import Scope  # noqa: E402
from agentmem.recall import query as query_mod  # noqa: E402
from agentmem.recall import temporal  # noqa: E402
from agentmem.recall.head import rank_candidates  # noqa: E402
from agentmem.recall.query import QueryInfo, parse_query  # noqa: E402
from agentmem.recall.rerank import HeadEntry  # noqa: E402
from agentmem.recall.retrieval import Candidates, RetrievalParams  # noqa: E402
from agentmem.recall.temporal import happened_within  # noqa: E402


@dataclass(frozen=True)
class Row:
    """The row fields the ranking reads."""

    session_id: str | None
    speaker: str | None
    memory_text: str
    text: str
    occurred_at: str | None


@dataclass
class Asked:
    """One question with its candidates."""

    conv: str
    text: str
    category: int
    gold: frozenset[str]
    cands: Candidates


def build(data: Path, store: Path) -> dict[str, Any]:
    """Every question's candidates from the kept ingest in ``store`` (ingested now when it holds none)."""
    conversations = json.loads(data.read_text())
    made_by = {"data": str(data.resolve()), "backend": "embedded", "consolidation": "local", "conversations": None}
    with AgentMemory(store, kv_encoding="off", consolidation="local") as mem:
        ids = locomo.ingest_once(mem, conversations, store / "locomo-ids.json", made_by)
        questions = locomo.questions_of(conversations, ids)
        es = mem._store  # the benchmark re-ranks the store's own candidates, as research/locomo_cv.py --folds does
        pool = max(mem.config.candidate_pool, 40)
        asked = [Asked(q.conv, q.text, q.category, frozenset(q.gold),
                       es.candidates(q.text, Scope(f"locomo-{q.conv}"), pool=pool)[0]) for q in questions]
        rows: dict[str, Row] = {}
        for conv in sorted({q.conv for q in questions}):
            got = [i for page in es.catalog.iter_ids(CatalogScope(user_id=f"locomo-{conv}")) for i in page]
            for r in es.catalog.get(got):
                rows[r.id] = Row(r.session_id, r.speaker, r.memory_text, r.text, r.occurred_at)
    return {"data": str(data), "questions": asked, "rows": rows}


def evaluate(cache: dict[str, Any], params: RetrievalParams, info_of: Callable[[str], QueryInfo] = parse_query,
             rows_of: Callable[[dict[str, Row]], dict[str, Row]] = lambda rows: rows,
             wrap: Callable[[Any, QueryInfo], Any] = lambda load, info: load) -> dict[str, Any]:
    """recall@5 / @10 overall and recall@10 by category under ``params``, the query parse ``info_of``, the rows
    as ``rows_of`` gives them and the head loader as ``wrap`` makes it for each question."""
    load = locomo_cv.row_loader(rows_of(cache["rows"]))
    at5, at10, cat = [], [], defaultdict(list)
    for q in cache["questions"]:
        info = info_of(q.text)
        top = [i for i, _ in rank_candidates(info, q.cands, params, 10, wrap(load, info))]
        at5.append(len(q.gold & set(top[:5])) / len(q.gold))
        at10.append(len(q.gold & set(top)) / len(q.gold))
        cat[q.category].append(at10[-1])
    return {"recall@5": round(statistics.fmean(at5), 4), "recall@10": round(statistics.fmean(at10), 4),
            "by_category": {str(c): round(statistics.fmean(v), 4) for c, v in sorted(cat.items())}}


def exact_names(text: str) -> QueryInfo:
    """The parse without close spellings of names (speakers named by their exact first name only): no query word
    is capitalised, and only a capitalised one is matched by spelling."""
    info = parse_query(text)
    return replace(info, words=tuple(w.lower() for w in info.words))


def line_bodies(rows: dict[str, Row]) -> dict[str, Row]:
    """The rows as the ranking read them before QueryInfo: the text is the memory line after its "[date] " stamp
    (speaker prefix included)."""
    def body(line: str) -> str:
        return line.split("] ", 1)[1] if line.startswith("[") and "] " in line else line
    return {i: replace(r, text=body(r.memory_text)) for i, r in rows.items()}


# wider forms, tried as variants before they reach the library (each is a regular expression of one module)
WIDE_TIME_TEXT = re.compile(
    r"\b(yesterday|today|tonight|tomorrow|ago|recently|earlier|later|soon|the other day|weekend"
    r"|monday|tuesday|wednesday|thursday|friday|saturday|sunday"
    r"|last (week|weekend|month|year|night|time)|next (week|weekend|month|year)"
    r"|this (morning|afternoon|evening|week|weekend|month|year)|(19|20)\d\d|\d{1,2}[./]\d{1,2}\b"
    r"|january|february|march|april|may|june|july|august|september|october|november|december)\b",
    re.IGNORECASE)
WIDE_TIME_QUESTION = re.compile(
    r"^\s*(when|how long|(in )?(what|which) (year|month|week|day|date|time|season)s?\b)"
    r"|\b(before|after|last (year|month|week)|ago|since)\b", re.IGNORECASE)
WIDE_LIST = re.compile(
    r"^\s*(?:(?:in|with|for|from|of|at)\s+)?(?:what|which)\s+(?:(?:are|were)\s+(?:\w+(?:'s)?\s+)?)?"
    r"(?:(?:kinds?|types?|sorts?)\s+of\s+)?(?:\w+\s+){0,2}\w+s\b(?<!ss)(?<!\bis)(?<!\bdoes)(?<!\bwas)(?<!\bhas)"
    r"(?<!\bhappens)(?<!\bmakes)(?<!\bmeans)(?<!\bseems)(?<!\bgoes)"
    r"|^\s*how many\b|^\s*in what ways\b|^\s*what are some\b", re.IGNORECASE)


@contextlib.contextmanager
def patched(module: Any, name: str, value: Any) -> Iterator[None]:
    """``module.name`` set to ``value`` inside the block (a wider form, tried before it reaches the library)."""
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def fresh(text: str) -> QueryInfo:
    """The parse under the module's current forms (not a cached one)."""
    return parse_query.__wrapped__(text)


Patch = Callable[[], contextlib.AbstractContextManager[None]]
Variant = tuple[Callable[[RetrievalParams], RetrievalParams], Callable[[str], QueryInfo],
                Callable[[dict[str, Row]], dict[str, Row]], Patch]
SAME: Patch = contextlib.nullcontext
VARIANTS: dict[str, Variant] = {
    "shipped": (lambda p: p, parse_query, lambda rows: rows, SAME),
    "exact_names": (lambda p: p, exact_names, lambda rows: rows, SAME),
    "line_body": (lambda p: p, parse_query, line_bodies, SAME),
    "before": (lambda p: p, exact_names, line_bodies, SAME),
    "wide_time_text": (lambda p: p, parse_query, lambda rows: rows,
                       lambda: patched(temporal, "_TIME_EXPRESSION", WIDE_TIME_TEXT)),
    "wide_time_question": (lambda p: p, fresh, lambda rows: rows,
                           lambda: patched(temporal, "_TIME_QUESTION", WIDE_TIME_QUESTION)),
    "wide_list": (lambda p: p, fresh, lambda rows: rows, lambda: patched(query_mod, "_LIST", WIDE_LIST)),
}


def anchor_rows(boost: float, days: int) -> Callable[[Any, QueryInfo], Callable[..., Any]]:
    """A head loader that multiplies by ``1 + boost`` the head scores of the entries whose ``occurred_at`` falls
    within ``days`` of a date the question names (:func:`agentmem.recall.temporal.happened_within`): the re-ranking's
    boosts are multiplicative, so this is the boost a re-ranking step would give. Not shipped: no held-out gain."""
    def loader(load: Callable[..., Any], info: QueryInfo) -> Callable[..., Any]:
        def boosted(ranked: list[tuple[str, float]], depth: int) -> tuple[list[HeadEntry], list[tuple[str, float]]]:
            head, tail = load(ranked, depth)
            if not info.anchors:
                return head, tail
            return [h._replace(score=h.score * (1 + boost)) if happened_within(h.occurred_at, info.anchors, days)
                    else h for h in head], tail
        return boosted
    return loader


def cross_dataset(caches: list[dict[str, Any]], values: list[float], days: int) -> dict[str, Any]:
    """The anchor boost chosen on each dataset (recall@10, ties to the smaller value), scored on the other."""
    grid = {v: [evaluate(c, RetrievalParams(), wrap=anchor_rows(v, days)) for c in caches] for v in values}
    out: dict[str, Any] = {"days": days, "grid": {str(v): [r["recall@10"] for r in rs] for v, rs in grid.items()}}
    for fit, other in ((0, 1), (1, 0)):
        chosen = max(values, key=lambda v: (grid[v][fit]["recall@10"], -v))
        out[f"fit_on_{Path(caches[fit]['data']).stem}"] = {
            "chosen": chosen, "in_sample": grid[chosen][fit], "held_out": grid[chosen][other],
            "held_out_off": grid[0.0][other] if 0.0 in grid else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path)
    ap.add_argument("--store", type=Path)
    ap.add_argument("--cache", type=Path)
    ap.add_argument("--eval", type=Path, nargs="+", default=None)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--fit-anchor", default=None, help="v1,v2,...: cross-dataset validate a date-anchor boost")
    ap.add_argument("--anchor-days", type=int, default=0)
    args = ap.parse_args()
    if args.eval is None:
        args.cache.write_bytes(pickle.dumps(build(args.data, args.store)))
        print(json.dumps({"cache": str(args.cache)}))
        return
    caches = [pickle.loads(p.read_bytes()) for p in args.eval]
    result: dict[str, Any] = {}
    for name in args.variants:
        change, info_of, rows_of, patch = VARIANTS[name]
        with patch():
            result[name] = {Path(c["data"]).stem: evaluate(c, change(RetrievalParams()), info_of, rows_of)
                            for c in caches}
        print(name, json.dumps(result[name]), flush=True)
    if args.fit_anchor:
        result["anchor_boost"] = cross_dataset(caches, [float(v) for v in args.fit_anchor.split(",")],
                                               args.anchor_days)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
