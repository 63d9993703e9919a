"""Multi-hop / open-domain candidates on LoCoMo (issue #16's weak categories), each fused with the shipped ranking
and its weight cross-validated over conversations (chosen on 4, scored on the 5th), like
``research/retrieval_ablation.py`` (whose ingest, candidates and ranking this reuses).

Signals (each a turn-level score added × w to the fused score before spillover, session boost and re-ranking):

- ``clauses``: query decomposition — a question with several clauses (split on "and", "both", ",", ";") is
  retrieved clause by clause (MiniLM + BM25 over all the conversation's turns, fused as in round one) and the
  clauses' lists are merged by reciprocal rank fusion; one-clause questions get nothing;
- ``speakers``: a question naming two or more speakers (the shipped speaker boost acts on one only): each named
  speaker's turns are scored (dense + BM25 over the speaker's turns, scaled within the speaker), so each speaker's
  best turns reach 1.0;
- ``adjacent``: the turns next to the first round's top 3 hits (±1 in their session) get the hit's scaled score;
- ``keywords``: a second dense query made of the question's content words only (the question frame dropped);
- ``listq`` (shipped since: :mod:`agentmem.recall.multihop`; this measures it against the ranking without it):
  questions that ask for a set ("What activities does …", "Which cities has …", "How many times …":
  a plural noun after what/which, or how many / in what ways) get a weaker session boost (weight chosen by CV),
  or at most ``m`` hits per session in their top 10 — diversity only where the answer is a list.

    python research/multihop_ablation.py --data ../shared/data/locomo/locomo_dev5.json --store /tmp/mh-abl

Last line: {"baseline": {...}, "<signal>": {"fused_cv": {...}, "chosen_w": [...], "questions_touched": N, ...}}
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]  # research/, benchmarks/
import locomo  # noqa: E402
import locomo_cv  # noqa: E402
import retrieval_ablation as ra  # noqa: E402

from agentmem import AgentMemory  # noqa: E402
from agentmem.text import content_words  # noqa: E402
from agentmem.recall.multihop import list_question  # noqa: E402
from agentmem.recall.rerank import named_speakers  # noqa: E402
from agentmem.recall.retrieval import RetrievalParams, fuse  # noqa: E402

SPLIT = re.compile(r"\band\b|\bboth\b|,|;", re.IGNORECASE)
RRF_K = 60  # the usual reciprocal-rank-fusion constant (Cormack et al.), not tuned


def capped(ranked: list[str], session_of: dict[str, str], m: int) -> list[str]:
    """At most ``m`` hits per session first, the rest after in their order."""
    seen: dict[str, int] = defaultdict(int)
    head, tail = [], []
    for i in ranked:
        s = session_of.get(i, i)
        (head if seen[s] < m else tail).append(i)
        seen[s] += 1
    return head + tail


def clauses(question: str) -> list[str]:
    """The question's clauses with at least two content words (fewer than two: the whole question only).

    >>> clauses("What pottery have Melanie and her kids made, and where?")
    ['What pottery have Melanie', 'her kids made']
    """
    parts = [p.strip() for p in SPLIT.split(question)]
    return [p for p in parts if len(content_words(p)) >= 2]


def turn_scores(qvec: np.ndarray, query: str, members: list[int], turns: list[dict], vecs: np.ndarray,
                p: RetrievalParams) -> dict[str, float]:
    """Round-one fusion (MiniLM cosine + BM25) of ``query`` over the turns ``members`` of one conversation."""
    docs = [dict(session=turns[k]["id"], text=turns[k]["line"]) for k in members]
    lexical = ra.bm25_sessions(docs, [query])[0]
    cos = vecs[members] @ qvec
    return fuse({turns[k]["id"]: float(c) for k, c in zip(members, cos)}, lexical, dense_weight=p.dense_weight)


def rrf(lists: list[dict[str, float]], pool: int) -> dict[str, float]:
    """Reciprocal rank fusion of the top ``pool`` of each list, scaled to [0, 1]."""
    out: dict[str, float] = defaultdict(float)
    for scores in lists:
        for r, (i, _) in enumerate(sorted(scores.items(), key=lambda kv: -kv[1])[:pool]):
            out[i] += 1.0 / (RRF_K + r + 1)
    return ra.scaled(dict(out))


def main() -> None:
    ap = ra.ablation_parser(__doc__, ["clauses", "speakers", "adjacent", "keywords", "listq"])
    args = ap.parse_args()
    conversations = json.loads(args.data.read_text())
    args.store.mkdir(parents=True, exist_ok=True)
    manifest = args.store / "locomo-ids.json"
    made_by = {"data": str(args.data.resolve()), "backend": "embedded", "consolidation": "off"}
    with AgentMemory(args.store, kv_encoding="off", consolidation="off") as mem:
        if manifest.exists() and json.loads(manifest.read_text()).get("data") == made_by["data"]:
            id_maps = json.loads(manifest.read_text())["ids"]
        else:
            id_maps = locomo.load_conversations(mem, conversations)
            manifest.write_text(json.dumps({**made_by, "ids": id_maps}))
        questions = locomo.questions_of(conversations, id_maps)
        rows = locomo_cv.gather_candidates(mem, questions, args.pool)
        store = mem._store
        places = store.catalog.turn_context(list(rows))
        turns = ra.conv_turns(conversations, id_maps, rows)
        vecs = ra.stored_vectors(store, turns)
        ks, p, kmax = args.k, RetrievalParams(), max(args.k)
        qtexts = [q.text for q in questions]
        qv = ra.query_vectors(store, qtexts)
        first = [ra.rank(q, rows, p, kmax, None, 0.0, places=places) for q in questions]
        result: dict[str, Any] = {"baseline": ra.summary(questions, [ra.recalls(q, f, ks) for q, f in
                                                                     zip(questions, first)], ks)}
        print("baseline", result["baseline"], flush=True)

        def report(name: str, extra: dict[int, dict[str, float]], ms: float) -> None:
            res = ra.evaluate(name, questions, rows, ks, extra.get, places)
            res["questions_touched"] = len(extra)
            res["extra_ms_per_touched_question"] = round(ms / max(1, len(extra)), 2)
            result[name] = res
            print(name, res, flush=True)

        cid_of = [q.conv for q in questions]
        index = {cid: {t["id"]: n for n, t in enumerate(ts)} for cid, ts in turns.items()}
        if "clauses" in args.signals:
            extra, t0 = {}, time.perf_counter()
            for j, q in enumerate(questions):
                parts = clauses(q.text)
                if len(parts) < 2:
                    continue
                pv = ra.query_vectors(store, parts)
                members = list(range(len(turns[q.conv])))
                extra[j] = rrf([turn_scores(v, c, members, turns[q.conv], vecs[q.conv], p)
                                for v, c in zip(pv, parts)], args.pool)
            report("clauses", extra, 1000 * (time.perf_counter() - t0))
        if "speakers" in args.signals:
            extra, t0 = {}, time.perf_counter()
            for j, q in enumerate(questions):
                ts = turns[q.conv]
                named = named_speakers(q.text, {t["speaker"] for t in ts})
                if len(named) < 2:
                    continue
                extra[j] = {}
                for s in named:
                    members = [k for k, t in enumerate(ts) if t["speaker"] == s]
                    extra[j].update(ra.scaled(dict(sorted(turn_scores(qv[j], q.text, members, ts, vecs[q.conv], p)
                                                          .items(), key=lambda kv: -kv[1])[:args.pool // 2])))
            report("speakers", extra, 1000 * (time.perf_counter() - t0))
        if "adjacent" in args.signals:
            extra, t0 = {}, time.perf_counter()
            for j, q in enumerate(questions):
                ts, at = turns[q.conv], index[q.conv]
                extra[j] = {}
                for r, hit in enumerate(first[j][:3]):
                    n = at[hit]
                    for m in (n - 1, n + 1):
                        if 0 <= m < len(ts) and ts[m]["session"] == ts[n]["session"]:
                            extra[j][ts[m]["id"]] = max(extra[j].get(ts[m]["id"], 0.0), 1.0 - r / 3)
            report("adjacent", extra, 1000 * (time.perf_counter() - t0))
        if "keywords" in args.signals:
            extra, t0 = {}, time.perf_counter()
            kw = [" ".join(w for w in re.findall(r"[\w']+", t) if w.lower() in content_words(t)) for t in qtexts]
            kv = ra.query_vectors(store, [k or t for k, t in zip(kw, qtexts)])
            for j, q in enumerate(questions):
                cos = vecs[q.conv] @ kv[j]
                extra[j] = ra.scaled(ra.top(cos, [t["id"] for t in turns[q.conv]], args.pool))
            report("keywords", extra, 1000 * (time.perf_counter() - t0))
        if "listq" in args.signals:
            from dataclasses import replace

            is_list = [list_question(q.text) for q in questions]
            result["listq_questions"] = {str(c): sum(1 for q, f in zip(questions, is_list) if f and q.category == c)
                                         for c in (1, 2, 3, 4)}
            per_w = {w: [ra.recalls(q, ra.rank(q, rows, replace(p, session_weight=w, list_session_weight=w) if f else p, kmax, None, 0.0,
                                               places=places), ks) for q, f in zip(questions, is_list)]
                     for w in (0.0, 0.1, 0.25, 0.5)}
            res, chosen = ra.cv_weight(questions, per_w, ks)
            result["listq_session_weight"] = {"fused_cv": res, "chosen_w": chosen}
            print("listq_session_weight", result["listq_session_weight"], flush=True)
            session_of = {i: r.session_id for i, r in rows.items()}
            deep = [ra.rank(q, rows, p, 30, None, 0.0, places=places) for q in questions]
            per_m = {m: [ra.recalls(q, capped(d, session_of, m) if f and m else d, ks)
                         for q, d, f in zip(questions, deep, is_list)] for m in (0, 1, 2, 3, 4)}
            res, chosen = ra.cv_weight(questions, per_m, ks)
            result["listq_session_cap"] = {"fused_cv": res, "chosen_m": chosen}
            print("listq_session_cap", result["listq_session_cap"], flush=True)
        print(json.dumps(result))


if __name__ == "__main__":
    main()
