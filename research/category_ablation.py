"""The weak LoCoMo categories (issue #16: multi-hop, open-domain): more features and wider heads for the learned
head order, measured by the nested CV of ``research/learned_ablation.py`` (fitted on 4 conversations, L2 and blend
chosen by leave-one-conversation-out inside them, scored on the 5th; the shipped head: 20 widened by the pools' best
20, the 4 question cues, dense weights held >= 0).

- ``coh``: coherence / centrality of each head entry among the head: its mean and max cosine to the other head
  entries and its mean cosine to the first 3 of the hand-set order (multi-hop evidence turns resemble each other).
- ``sess``: session-level scoring: the entry's session ranked by its candidates' best and by their summed cosine
  (1 / (1 + rank)), and that session's best cosine scaled over the pool's sessions.
- ``rescue``: the head also holds the dense pool's ranks 21-``--rescue-depth`` that repeat a question word (a
  rescue criterion instead of the fused rank: the lexical side sinks multi-hop evidence).
- ``sessdraw``: the head also holds the best 2 dense turns of each of the top ``--draw-sessions`` sessions (by their
  candidates' best cosine), beyond the session boost.

    python research/category_ablation.py --cache /tmp/q-cache.pkl --variants base coh sess rescue sessdraw

Last line: {"<variant>": {"cv": {...}, "chosen": [...]}, ...}
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]  # research/, benchmarks/
import learned_ablation as la  # noqa: E402
import locomo  # noqa: E402
import locomo_cv  # noqa: E402

from agentmem.recall.head import Ranked  # noqa: E402
from agentmem.recall.head_cues import _stems, move_up, question_words  # noqa: E402
from agentmem.recall.learned_rank import FEATURES  # noqa: E402
from agentmem.recall.retrieval import Candidates, RetrievalParams, best_first  # noqa: E402


def _body(line: str) -> str:
    """A cached memory line after its "[date] " stamp: the research cache (research/_locomo_cache.py) keeps the
    line, not the entry's text, which the library's head reads (HeadEntry.text)."""
    return line.split("] ", 1)[1] if line.startswith("[") and "] " in line else line


SHIPPED_CUES = "overlap,rare_overlap,session_mass,list_first"


def unit_vectors(data: la.Data) -> dict[str, np.ndarray]:
    """Every turn's stored vector, unit length, by entry id."""
    out: dict[str, np.ndarray] = {}
    for cid, ts in data.turns.items():
        V = data.vecs[cid] / np.linalg.norm(data.vecs[cid], axis=1, keepdims=True)
        for n, t in enumerate(ts):
            out.setdefault(t["id"], V[n].astype(np.float16).astype(np.float32))  # as the rows' float16 text_vector
    return out


def session_of(cands: Candidates, i: str) -> str | None:
    """The session of candidate ``i`` (None: no placement)."""
    return getattr(cands.places.get(i), "session_id", None)


def session_table(cands: Candidates) -> dict[str | None, tuple[float, float, float]]:
    """Per session of the dense pool: (1 / (1 + rank by best cosine), 1 / (1 + rank by summed cosine), best cosine
    min-max scaled over the sessions).

    Example:
        >>> class P:
        ...     def __init__(self, s): self.session_id = s
        >>> c = Candidates({"a": 0.9, "b": 0.5, "c": 0.45}, {}, {"a": P("s1"), "b": P("s2"), "c": P("s2")})
        >>> session_table(c)
        {'s1': (1.0, 0.5, 1.0), 's2': (0.5, 1.0, 0.0)}
    """
    best: dict[str | None, float] = defaultdict(float)
    total: dict[str | None, float] = defaultdict(float)
    for i, c in cands.dense.items():
        s = session_of(cands, i)
        if s is None:
            continue
        best[s] = max(best[s], c)
        total[s] += c
    if not best:
        return {}
    by_best = {s: r for r, s in enumerate(sorted(best, key=lambda s: (-best[s], s)))}
    by_total = {s: r for r, s in enumerate(sorted(total, key=lambda s: (-total[s], s)))}
    lo, hi = min(best.values()), max(best.values())
    return {s: (1 / (1 + by_best[s]), 1 / (1 + by_total[s]), (best[s] - lo) / (hi - lo) if hi > lo else 1.0)
            for s in best}


def rescue(ranked: list[tuple[str, float]], cands: Candidates, depth: int, query: str, rows: dict, lo: int, hi: int,
           pools: str = "dense", cue: bool | str = True) -> tuple[list[tuple[str, float]], int]:
    """The ranks lo..hi of the dense (and / or turn-context) pool that repeat a question word (``cue``) moved up
    behind the head."""
    top = {i for i, _ in ranked[:depth]}
    words = set(question_words(query, {rows[i].speaker for i in top if i in rows}))
    chosen = [cands.dense] if "dense" in pools else []
    chosen += [cands.turn_context] if "context" in pools else []
    moved = {i for pool in chosen for i, _ in best_first(pool)[lo:hi]
             if i not in top and i in rows and (not cue or (i in cands.lexical if cue == "lexical"
                                                              else words & _stems(_body(rows[i].memory_text))))}
    return move_up(ranked, depth, moved)


def sessdraw(ranked: list[tuple[str, float]], cands: Candidates, depth: int, n_sessions: int, per: int
             ) -> tuple[list[tuple[str, float]], int]:
    """The best ``per`` dense turns of each of the top ``n_sessions`` sessions moved up behind the head."""
    table = session_table(cands)
    tops = {s for s, v in table.items() if v[0] >= 1 / n_sessions}
    top = {i for i, _ in ranked[:depth]}
    taken: dict[str | None, int] = defaultdict(int)
    moved = set()
    for i, _ in best_first(cands.dense):
        s = session_of(cands, i)
        if s in tops and taken[s] < per:
            taken[s] += 1
            if i not in top:
                moved.add(i)
    return move_up(ranked, depth, moved)


def widened(ranked: Ranked, depth: int, q: Any, rows: dict, args: argparse.Namespace, widening: str
            ) -> tuple[Ranked, int]:
    """The head of ``depth`` in ``ranked`` with ``widening``'s steps ("rescue[:hi[:pools[:any|lex]]]", "sessdraw",
    joined by "+") moving further entries up behind it."""
    for step in widening.split("+"):
        if step.startswith("rescue"):  # rescue[:hi[:pools[:any]]]
            bits = step.split(":")
            hi = int(bits[1]) if len(bits) > 1 else args.rescue_depth
            pools = bits[2] if len(bits) > 2 else "dense"
            cue = True if len(bits) < 4 else "lexical" if bits[3] == "lex" else False
            ranked, depth = rescue(ranked, q.cands, depth, q.text, rows, 20, hi, pools, cue=cue)
        elif step == "sessdraw":
            ranked, depth = sessdraw(ranked, q.cands, depth, args.draw_sessions, 2)
    return ranked, depth


def head(q: Any, rows: dict, p: RetrievalParams, vecs: dict[str, np.ndarray], args: argparse.Namespace,
         widening: str) -> tuple[list[str], np.ndarray]:
    """The shipped head (20 widened by the pools' best 20, plus ``widening``'s extra entries): ids in the hand-set
    order, the 20 features + 5 cues + the extra columns (coherence 3, session 3)."""
    cands, load = q.cands, locomo_cv.row_loader(rows)
    ids, XC = la.head_features(q, cands, rows, p, 20, 20,
                               lambda ranked, depth: load(*widened(ranked, depth, q, rows, args, widening)))
    U = np.stack([vecs[i] for i in ids])
    S = U @ U.T
    n = len(ids)
    np.fill_diagonal(S, np.nan)
    with np.errstate(all="ignore"):
        mean_o = np.nan_to_num(np.nanmean(S, 1)) if n > 1 else np.zeros(n)
        max_o = np.nan_to_num(np.nanmax(S, 1)) if n > 1 else np.zeros(n)
        top3 = np.nan_to_num(np.nanmean(S[:, :3], 1)) if n > 1 else np.zeros(n)
    table = session_table(cands)
    sess = np.asarray([table.get(session_of(cands, i), (0.0, 0.0, 0.0)) for i in ids]).reshape(n, 3)
    return ids, np.hstack([XC, np.c_[mean_o, max_o, top3], sess])


def columns(extra: str) -> list[int]:
    """The shipped 20 + 4 cue columns, and the extra ones of ``extra`` (coh / sess / none)."""
    cols = la.columns_of(SHIPPED_CUES)
    base = len(FEATURES) + 5
    if "coh" in extra:
        cols += [base, base + 1, base + 2]
    if "sess" in extra:
        cols += [base + 3, base + 4, base + 5]
    return cols


VARIANTS = {  # name: (widening, extra columns)
    "base": ("", ""), "coh": ("", "coh"), "coh_mean": ("", "coh_mean"), "sess": ("", "sess"),
    "coh+sess": ("", "coh,sess"), "rescue": ("rescue", ""), "rescue+coh": ("rescue", "coh"),
    "sessdraw": ("sessdraw", ""), "sessdraw+sess": ("sessdraw", "sess"),
    "rescue30": ("rescue:30", ""), "rescue40": ("rescue:40", ""), "rescue70": ("rescue:70", ""),
    "rescue100": ("rescue:100", ""), "rescue_any50": ("rescue:50:dense:any", ""),
    "rescue_ctx50": ("rescue:50:context", ""), "rescue_both50": ("rescue:50:dense,context", ""),
    "rescue+sessdraw": ("rescue+sessdraw", ""), "rescue_lex50": ("rescue:50:dense:lex", ""),
    "sess+coh_mean": ("", "sess,coh_mean"), "rescue_any100": ("rescue:100:dense:any", ""),
    "rescue_any100+coh": ("rescue:100:dense:any", "coh"), "rescue_any100+sess": ("rescue:100:dense:any", "sess"),
    "rescue_lex70": ("rescue:70:dense:lex", ""), "rescue_lex100": ("rescue:100:dense:lex", ""),
    "rescue+coh_mean": ("rescue", "coh_mean"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True, type=Path)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--rescue-depth", type=int, default=50)
    ap.add_argument("--draw-sessions", type=int, default=3)
    ap.add_argument("--choose", action="store_true", help="also: the variant chosen inside the 4 (nested)")
    args = ap.parse_args()
    data = la.Data(**la.load_cache(args.cache))
    vecs = unit_vectors(data)
    p = RetrievalParams(learned_head=False)
    nonneg = [FEATURES.index(f) for f in la.MONOTONE["dense"]]
    made: dict[str, list] = {}
    result: dict[str, Any] = {}
    every: dict[str, list] = {}
    for name in args.variants:
        widening, extra = VARIANTS[name]
        t0 = time.time()
        if widening not in made:
            made[widening] = [head(q, data.rows, p, vecs, args, widening) for q in data.questions]
        cols = columns(extra)
        if "coh_mean" in extra:  # the mean cosine to the rest of the head only (+ the session columns if asked)
            base = len(FEATURES) + 5
            cols = la.columns_of(SHIPPED_CUES) + [base] + ([base + 3, base + 4, base + 5] if "sess" in extra else [])
        feats = [(ids, X[:, cols]) for ids, X in made[widening]]
        every[name] = feats
        r = la.ltr_nested(data, {name: feats}, nonneg=nonneg)
        result[name] = {k: v for k, v in r.items() if k not in ("weights", "shipped_same_head")}
        result[name]["head_mean"] = round(float(np.mean([len(ids) for ids, _ in feats])), 1)
        print(name, json.dumps(result[name]), round(time.time() - t0, 1), flush=True)
    if args.choose:
        r = la.ltr_nested(data, every, nonneg=nonneg)
        result["choose"] = {k: v for k, v in r.items() if k not in ("weights", "shipped_same_head", "median_weights")}
        print("choose", json.dumps(result["choose"]), flush=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
