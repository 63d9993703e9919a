"""Candidate retrieval signals on LoCoMo, each measured alone and fused with the shipped pipeline, cross-validated
over conversations (choose the signal's weight on 4 conversations, score on the 5th).

Signals (every one an exact cosine or BM25 over all turns of the question's conversation):

- ``smol_L{n}``: SmolLM2-135M's own hidden states (layer n, mean-pooled over the memory line, centred on the
  conversation's mean turn vector): the representation of the model that made the cache;
- ``ctx_prev`` / ``ctx_both``: MiniLM over the turn together with the previous (and next) turn of its session;
- ``sess_dense`` / ``sess_bm25``: a session-level first stage: sessions scored as a whole (mean MiniLM vector,
  BM25 over the session's text), every turn of the best ``top`` sessions lifted by its session's scaled score.

For each signal: alone (its own top-k), and fused (its top ``pool`` scaled to [0, 1] over the pool and added ×w
to the shipped fused score before spillover, session boost and re-ranking); w is chosen by CV on the folds.

    python research/retrieval_ablation.py --data ../shared/data/locomo/locomo_dev5.json --store /tmp/recall-abl

Last line: {"baseline": {...}, "<signal>": {"alone": {...}, "fused_cv": {...}, "chosen_w": [...]}, ...}
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from dataclasses import replace
from typing import Any, Callable

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]  # research/, benchmarks/
import locomo  # noqa: E402  (the benchmark next door: ingest, questions, the store's own ranking)
import locomo_cv  # noqa: E402

from agentmem import AgentMemory  # noqa: E402
from agentmem.backends.sqlite.catalog import fts_query  # noqa: E402
from agentmem.recall.multihop import for_query  # noqa: E402
from agentmem.recall.rerank import HeadEntry, rerank  # noqa: E402
from agentmem.recall.retrieval import RetrievalParams, fuse, session_boost, spill_over  # noqa: E402

WEIGHTS = [0.0, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5]
SMOL_LAYERS = [6, 12, 16, 20, 24, 30]


def conv_turns(conversations: list[dict], id_maps: dict, rows: dict) -> dict[str, list[dict]]:
    """Every conversation's turns in order: id, session, memory line, text."""
    out: dict[str, list[dict]] = {}
    for conv in conversations:
        cid = str(conv["conversation_id"])
        out[cid] = []
        for s in conv["sessions"]:
            for t in s["turns"]:
                eid = id_maps[cid][t["dia_id"]]
                out[cid].append(dict(id=eid, session=rows[eid].session_id, line=rows[eid].memory_text,
                                     text=locomo.turn_text(t), speaker=t["speaker"]))
    return out


def contextual_lines(turns: list[dict], both: bool) -> list[str]:
    """The turn's memory line with the previous (and next) turn of its session, so a reply carries its question."""
    out = []
    for i, t in enumerate(turns):
        parts = []
        if i > 0 and turns[i - 1]["session"] == t["session"]:
            parts.append(f"{turns[i - 1]['speaker']}: {turns[i - 1]['text']}")
        parts.append(t["line"])
        if both and i + 1 < len(turns) and turns[i + 1]["session"] == t["session"]:
            parts.append(f"{turns[i + 1]['speaker']}: {turns[i + 1]['text']}")
        out.append("\n".join(parts))
    return out


def smol_states(texts: list[str], layers: list[int], batch: int = 16) -> dict[int, np.ndarray]:
    """Mean-pooled SmolLM2 hidden states of ``texts`` at ``layers`` (L2-normalised later, after centring)."""
    import torch

    from agentmem.kv.model import load_model

    model, tok = load_model()
    tok.padding_side = "right"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    out: dict[int, list[np.ndarray]] = {layer: [] for layer in layers}
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    with torch.inference_mode():
        for start in range(0, len(order), batch):
            idx = order[start:start + batch]
            enc = tok([texts[i] for i in idx], return_tensors="pt", padding=True, truncation=True, max_length=256)
            hs = model(**enc, output_hidden_states=True).hidden_states
            mask = enc["attention_mask"].unsqueeze(-1).float()
            for layer in layers:
                pooled = (hs[layer] * mask).sum(1) / mask.sum(1)
                out[layer].append(pooled.numpy())
    inv = np.argsort(order)
    return {layer: np.concatenate(v)[inv] for layer, v in out.items()}


def smol_query_latency(texts: list[str], layers: list[int], threads: int = 1) -> dict[str, float]:
    """Per-query SmolLM2 forward time (ms, p50 / p95) when only the first ``layer`` layers run (no LM head)."""
    import torch

    from agentmem.kv.model import load_model

    model, tok = load_model()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    full = model.model.layers
    out: dict[str, float] = {}
    try:
        with torch.inference_mode():
            for layer in layers:
                model.model.layers = full[:layer]
                times = []
                for t in texts:
                    t0 = time.perf_counter()
                    ids = tok(t, return_tensors="pt")
                    h = model.model(**ids).last_hidden_state.mean(1)
                    times.append(1000 * (time.perf_counter() - t0))
                    del h
                times.sort()
                out[f"L{layer}_p50_ms"] = round(times[len(times) // 2], 2)
                out[f"L{layer}_p95_ms"] = round(times[int(0.95 * len(times))], 2)
    finally:
        model.model.layers = full
        torch.set_num_threads(before)
    return out


def bm25_sessions(turns: list[dict], queries: list[str]) -> list[dict[str, float]]:
    """BM25 (FTS5, porter) of each query over the conversation's sessions as documents."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE s USING fts5(sid UNINDEXED, body, tokenize='porter unicode61')")
    text: dict[str, list[str]] = defaultdict(list)
    for t in turns:
        text[t["session"]].append(t["text"])
    db.executemany("INSERT INTO s VALUES (?, ?)", [(k, " ".join(v)) for k, v in text.items()])
    out = []
    for q in queries:
        m = fts_query(q)
        rows = db.execute("SELECT sid, -bm25(s) FROM s WHERE s MATCH ?", (m,)).fetchall() if m else []
        out.append({sid: float(sc) for sid, sc in rows})
    return out


def bm25_context(turns: dict[str, list[dict]], qs_of: dict[str, list[int]], qtexts: list[str], pool: int, *,
                 both: bool) -> dict[int, dict[str, float]]:
    """Per question: BM25 over each turn with its previous (and next) turn, the top ``pool`` scaled by the best."""
    extra: dict[int, dict[str, float]] = {}
    for cid, js in qs_of.items():
        docs = contextual_lines(turns[cid], both)
        pseudo = [dict(session=t["id"], text=d) for t, d in zip(turns[cid], docs)]  # one doc per turn
        for j, sc in zip(js, bm25_sessions(pseudo, [qtexts[j] for j in js])):
            best = max(sc.values(), default=0.0)
            extra[j] = {i: v / best for i, v in sorted(sc.items(), key=lambda kv: -kv[1])[:pool]}
    return extra


def normed(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-9)


def scaled(scores: dict[str, float]) -> dict[str, float]:
    if not scores:
        return {}
    lo, hi = min(scores.values()), max(scores.values())
    return {i: (s - lo) / (hi - lo) if hi > lo else 1.0 for i, s in scores.items()}


def top(scores: np.ndarray, ids: list[str], n: int) -> dict[str, float]:
    idx = np.argsort(-scores)[:n]
    return {ids[i]: float(scores[i]) for i in idx}


def rank(q: locomo.Question, rows: dict, p: RetrievalParams, k: int, extra: dict[str, float] | None,
         w: float, *, places: dict) -> list[str]:
    """The shipped ranking with ``w`` × an extra turn-level score added to the fused score.

    Without an extra score this *is* the library's ranking (``locomo_cv.ranking``: ``rank_scores`` and the head's
    re-ranking, with the list-question rule of ``multihop.for_query``), so the baseline equals what ships. With
    one, the same steps are spelled out here, because the extra score enters before spillover (over ``places``,
    every turn's placement: an extra score may name turns outside the store's candidates)."""
    p = for_query(p, q.text)
    if not (extra and w):
        return [i for i, _ in locomo_cv.ranking(q, q.cands, rows, p, k)]
    fused = fuse(q.cands.dense, q.cands.lexical, dense_weight=p.dense_weight)
    if p.context_vector_weight and q.cands.turn_context:  # the shipped turn context vectors (their own search)
        lo, hi = min(q.cands.turn_context.values()), max(q.cands.turn_context.values())
        for i, c in q.cands.turn_context.items():
            fused[i] = fused.get(i, 0.0) + p.context_vector_weight * ((c - lo) / (hi - lo) if hi > lo else 1.0)
    if extra and w:
        for i, s in extra.items():
            fused[i] = fused.get(i, 0.0) + w * s
    fused = spill_over(fused, places, share=p.spillover)
    sessions = {i: rows[i].session_id for i in fused}
    ranked = sorted(session_boost(fused, sessions, weight=p.session_weight).items(), key=lambda kv: (-kv[1], kv[0]))
    depth = max(2 * k, p.rerank_depth)
    head = [HeadEntry(i, s, rows[i].speaker, rows[i].memory_text) for i, s in ranked[:depth]]
    return [i for i, _ in (rerank(q.text, head, p) + ranked[depth:])[:k]]


def recalls(q: locomo.Question, top_ids: list[str], ks: list[int]) -> dict[int, float]:
    return {k: len(q.gold & set(top_ids[:k])) / len(q.gold) for k in ks}


def summary(questions: list[locomo.Question], rec: list[dict[int, float]], ks: list[int]) -> dict[str, Any]:
    kmax = max(ks)
    out: dict[str, Any] = {f"recall@{k}": round(statistics.fmean(r[k] for r in rec), 4) for k in ks}
    cats: dict[int, list[float]] = defaultdict(list)
    for q, r in zip(questions, rec):
        cats[q.category].append(r[kmax])
    out["by_cat"] = {str(c): round(statistics.fmean(v), 3) for c, v in sorted(cats.items())}
    return out


def cv_weight(questions: list[locomo.Question], per_w: dict[float, list[dict[int, float]]], ks: list[int]):
    """Choose w on 4 conversations, score on the 5th; pooled held-out recall."""
    convs = sorted({q.conv for q in questions})
    held: list[dict[int, float]] = [{} for _ in questions]
    chosen = []
    for c in convs:
        train = [j for j, q in enumerate(questions) if q.conv != c]
        best = max(per_w, key=lambda w: (sum(per_w[w][j][k] for j in train for k in ks), -w))
        chosen.append(best)
        for j, q in enumerate(questions):
            if q.conv == c:
                held[j] = per_w[best][j]
    return summary(questions, held, ks), chosen


def evaluate(name: str, questions, rows, ks, extra_of: Callable[[int], dict[str, float]], places) -> dict[str, Any]:
    p = RetrievalParams()
    kmax = max(ks)
    per_w = {w: [recalls(q, rank(q, rows, p, kmax, extra_of(j), w, places=places), ks)
                 for j, q in enumerate(questions)] for w in WEIGHTS}
    res, chosen = cv_weight(questions, per_w, ks)
    best_all = max(WEIGHTS, key=lambda w: sum(r[k] for r in per_w[w] for k in ks))
    return {"fused_cv": res, "chosen_w": chosen, "all_dev_best_w": best_all,
            "all_dev_at_best": summary(questions, per_w[best_all], ks)}


def query_vectors(store: Any, texts: list[str]) -> np.ndarray:
    """The texts' query vectors as recall embeds them (``EntryStore.embed_query``: int8 feed-forward MiniLM), so a
    signal is scored with the same query vector as the shipped candidates (``store.candidates``) it is fused with.

    Example:
        >>> query_vectors(store, ["where does she live?"]).shape               # doctest: +SKIP
        (1, 384)
    """
    return np.stack([store.embed_query(t) for t in texts])


def stored_vectors(store: Any, turns: dict[str, list[dict]]) -> dict[str, np.ndarray]:
    """Every turn's vector as the index holds it (the embedded memory line), in conversation order."""
    out = {}
    for cid, ts in turns.items():
        # two turns merged by consolidation share one entry id: ask for each id once
        got = store.vectors.get(f"locomo-{cid}", list(dict.fromkeys(t["id"] for t in ts)))
        out[cid] = np.stack([got[t["id"]] for t in ts])
    return out


def second_round(store: Any, questions: list[locomo.Question], rows: dict, turns: dict[str, list[dict]],
                 qs_of: dict[str, list[int]], qtexts: list[str], places: dict, ks: list[int]) -> dict[str, Any]:
    """Multi-hop: a second round seeded by the first round's sessions. Every turn of the sessions of the shipped
    ranking's top 10 (the best ``top`` of them) is scored against the query — dense and BM25 fused as in round one,
    scaled within those sessions — including the turns neither retriever's pool of 100 held; added × w (CV)."""
    p, out = RetrievalParams(), {}
    qv = query_vectors(store, qtexts)
    own = stored_vectors(store, turns)
    lexical: dict[int, dict[str, float]] = {}
    for cid, js in qs_of.items():
        pseudo = [dict(session=t["id"], text=t["line"]) for t in turns[cid]]  # one BM25 doc per turn
        lexical.update(zip(js, bm25_sessions(pseudo, [qtexts[j] for j in js])))
    first = {j: rank(q, rows, p, 10, None, 0.0, places=places) for j, q in enumerate(questions)}
    for top_n in (1, 2, 3):
        extra: dict[int, dict[str, float]] = {}
        for cid, js in qs_of.items():
            ids = [t["id"] for t in turns[cid]]
            for j in js:
                seeds = list(dict.fromkeys(rows[i].session_id for i in first[j]))[:top_n]
                members = [k for k, t in enumerate(turns[cid]) if t["session"] in seeds]
                cos = qv[j] @ own[cid][members].T
                extra[j] = fuse({ids[k]: float(c) for k, c in zip(members, cos)},
                                {ids[k]: lexical[j][ids[k]] for k in members if ids[k] in lexical[j]},
                                dense_weight=p.dense_weight)
        key = f"second_round_sessions_top{top_n}"
        out[key] = evaluate(key, questions, rows, ks, extra.get, places)
        print(key, out[key], flush=True)
    return out


def more_rounds(store: Any, questions: list[locomo.Question], rows: dict, turns: dict[str, list[dict]],
                qs_of: dict[str, list[int]], qtexts: list[str], places: dict, ks: list[int],
                signals: list[str]) -> dict[str, Any]:
    """On top of the shipped ranking (context vectors included), each × w chosen by CV:

    - ``speaker2``: a question naming one speaker gets a second round over *all* of that speaker's turns (dense and
      BM25 fused as in round one, scaled within them), so the speaker's turns outside both pools can enter;
    - ``ctxnext``: the other half of the context, a turn's vector plus its *next* turn's (normalised), fused like
      the shipped previous-turn context vector.
    """
    from agentmem.recall.rerank import named_speakers

    p, out = RetrievalParams(), {}
    qv = query_vectors(store, qtexts)
    own = stored_vectors(store, turns)
    if "speaker2" in signals:
        lexical: dict[int, dict[str, float]] = {}
        for cid, js in qs_of.items():
            pseudo = [dict(session=t["id"], text=t["line"]) for t in turns[cid]]
            lexical.update(zip(js, bm25_sessions(pseudo, [qtexts[j] for j in js])))
        extra: dict[int, dict[str, float]] = {}
        for cid, js in qs_of.items():
            ids = [t["id"] for t in turns[cid]]
            speakers = {t["speaker"] for t in turns[cid]}
            for j in js:
                named = named_speakers(qtexts[j], speakers)
                if len(named) != 1:
                    continue
                members = [k for k, t in enumerate(turns[cid]) if t["speaker"] in named]
                cos = qv[j] @ own[cid][members].T
                extra[j] = fuse({ids[k]: float(c) for k, c in zip(members, cos)},
                                {ids[k]: lexical[j][ids[k]] for k in members if ids[k] in lexical[j]},
                                dense_weight=p.dense_weight)
        out["second_round_speaker"] = evaluate("second_round_speaker", questions, rows, ks, extra.get, places)
        print("second_round_speaker", out["second_round_speaker"], flush=True)
    if "ctxnext" in signals:
        extra = {}
        for cid, js in qs_of.items():
            ts, v = turns[cid], own[cid].copy()
            for i in range(len(ts) - 1):
                if ts[i + 1]["session"] == ts[i]["session"]:
                    v[i] += own[cid][i + 1]
            v = normed(v)
            ids = [t["id"] for t in ts]
            for j in js:
                extra[j] = scaled(top(qv[j] @ v.T, ids, 100))
        out["ctx_next_on_top"] = evaluate("ctx_next_on_top", questions, rows, ks, extra.get, places)
        print("ctx_next_on_top", out["ctx_next_on_top"], flush=True)
    return out


def shipped_options(store: Any, questions: list[locomo.Question], rows: dict, ks: list[int]) -> dict[str, Any]:
    """The library's own opt-in options through its own ranking (``locomo_cv.ranking``): the query-time context
    (``EntryStore._context``) and the session first stage, each weight chosen by CV."""
    from agentmem.entries.store import Scope

    p, kmax, out = RetrievalParams(), max(ks), {}
    vecs = query_vectors(store, [q.text for q in questions])
    for q, vec in zip(questions, vecs):
        q.cands.context = store._context(vec, Scope(f"locomo-{q.conv}"), q.cands, None)
    options = {"store_context": lambda w: replace(p, context_weight=w)}
    for top_n in (1, 2, 3):
        options[f"store_session_first_top{top_n}"] = lambda w, t=top_n: replace(p, session_first=w, session_top=t)
    for name, make in options.items():
        per_w = {w: [recalls(q, [i for i, _ in locomo_cv.ranking(q, q.cands, rows, make(w), kmax)], ks)
                     for q in questions] for w in WEIGHTS}
        res, chosen = cv_weight(questions, per_w, ks)
        out[name] = {"fused_cv": res, "chosen_w": chosen, "at_0": summary(questions, per_w[0.0], ks)}
        print(name, out[name], flush=True)
    return out


def ablation_parser(doc: str | None, signals: list[str], signals_help: str | None = None) -> argparse.ArgumentParser:
    """The arguments every LoCoMo ablation script takes (this one and ``multihop_ablation.py``).

    Example:
        >>> ablation_parser("demo", ["shipped"]).parse_args(["--data", "d.json", "--store", "s"]).pool
        100
    """
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--store", required=True, type=Path)
    ap.add_argument("--k", type=int, nargs="+", default=[5, 10])
    ap.add_argument("--pool", type=int, default=100)
    ap.add_argument("--signals", nargs="+", default=signals, help=signals_help)
    return ap


def main() -> None:
    ap = ablation_parser(__doc__, ["shipped", "ctxmean", "sess", "smol", "ctx"],
                         "shipped ctxmean sess smol ctx bm25ctx sess2 speaker2 ctxnext latency")
    ap.add_argument("--consolidation", choices=["off", "local"], default="off")
    args = ap.parse_args()
    conversations = json.loads(args.data.read_text())
    args.store.mkdir(parents=True, exist_ok=True)
    manifest = args.store / "locomo-ids.json"  # the same manifest as benchmarks/locomo.py: one ingest serves both
    made_by = {"data": str(args.data.resolve()), "backend": "embedded", "consolidation": args.consolidation}
    with AgentMemory(args.store, kv_encoding="off", consolidation=args.consolidation) as mem:
        id_maps = locomo.ingest_once(mem, conversations, manifest, made_by)
        questions = locomo.questions_of(conversations, id_maps)
        for cid in id_maps:  # a store ingested before turn context vectors: give them theirs
            mem._store.contexts.backfill(f"locomo-{cid}")
        rows = locomo_cv.gather_candidates(mem, questions, args.pool)
        store = mem._store
        places = store.catalog.turn_context(list(rows))
        turns = conv_turns(conversations, id_maps, rows)
        qs_of = defaultdict(list)
        for j, q in enumerate(questions):
            qs_of[q.conv].append(j)
        ks = args.k
        p = RetrievalParams()
        base = [recalls(q, rank(q, rows, p, max(ks), None, 0.0, places=places), ks) for q in questions]
        result: dict[str, Any] = {"baseline": summary(questions, base, ks)}
        print("baseline", result["baseline"], flush=True)
        p0 = replace(p, context_vector_weight=0.0)
        result["baseline_no_context_vectors"] = summary(questions, [
            recalls(q, rank(q, rows, p0, max(ks), None, 0.0, places=places), ks) for q in questions], ks)
        print("baseline_no_context_vectors", result["baseline_no_context_vectors"], flush=True)

        def dense_signal(name: str, tvecs: dict[str, np.ndarray], qvecs: np.ndarray) -> None:
            """Alone and fused, for a turn-level vector signal (tvecs per conversation, qvecs per question)."""
            extra: dict[int, dict[str, float]] = {}
            alone = []
            for cid, js in qs_of.items():
                ids = [t["id"] for t in turns[cid]]
                sims = qvecs[js] @ tvecs[cid].T
                for row, j in zip(sims, js):
                    cand = top(row, ids, args.pool)
                    extra[j] = scaled(cand)
                    alone.append((j, list(cand)))
            alone.sort()
            res = {"alone": summary(questions, [recalls(questions[j], ids, ks) for j, ids in alone], ks)}
            res.update(evaluate(name, questions, rows, ks, extra.get, places))
            result[name] = res
            print(name, res, flush=True)

        qtexts = [q.text for q in questions]
        if "shipped" in args.signals:
            result.update(shipped_options(store, questions, rows, ks))
        if "latency" in args.signals:
            result["smol_query_latency"] = smol_query_latency(qtexts[:200], [12, 20, 30])
            print(result["smol_query_latency"], flush=True)
        if "smol" in args.signals:
            cache = args.store / "smol_states.npz"
            lines = [t["line"] for cid in sorted(turns) for t in turns[cid]]
            if cache.exists():
                z = np.load(cache)
                ts_, qs_ = {int(k[2:]): z[k] for k in z if k.startswith("t_")}, {int(k[2:]): z[k] for k in z if k.startswith("q_")}
            else:
                t0 = time.time()
                ts_ = smol_states(lines, SMOL_LAYERS)
                qs_ = smol_states(qtexts, SMOL_LAYERS)
                print("smol states s", round(time.time() - t0, 1), flush=True)
                np.savez(cache, **{f"t_{k}": v for k, v in ts_.items()}, **{f"q_{k}": v for k, v in qs_.items()})
            for layer in SMOL_LAYERS:
                tv, offset = {}, 0
                qv = np.zeros((len(questions), ts_[layer].shape[1]), dtype=np.float32)
                for cid in sorted(turns):
                    n = len(turns[cid])
                    block = ts_[layer][offset:offset + n]
                    offset += n
                    mu = block.mean(0, keepdims=True)  # unsupervised: the user's own mean turn vector
                    tv[cid] = normed(block - mu)
                    qv[qs_of[cid]] = normed(qs_[layer][qs_of[cid]] - mu)
                dense_signal(f"smol_L{layer}", tv, qv)
        if "ctxmean" in args.signals:
            qv = query_vectors(store, qtexts)
            # the same context from the stored per-turn vectors alone (no second embedding): the normalised sum of
            # the turn's vector and its session neighbours' vectors
            own = stored_vectors(store, turns)
            for name, both in (("ctx_mean_prev", False), ("ctx_mean_both", True)):
                tv = {}
                for cid, ts in turns.items():
                    v = own[cid].copy()
                    for i, t in enumerate(ts):
                        if i > 0 and ts[i - 1]["session"] == t["session"]:
                            v[i] += own[cid][i - 1]
                        if both and i + 1 < len(ts) and ts[i + 1]["session"] == t["session"]:
                            v[i] += own[cid][i + 1]
                    tv[cid] = normed(v)
                dense_signal(name, tv, qv)
            # what a store can compute from cosines alone (any vector backend): the mean cosine of the turn and its
            # session neighbours — as a vector signal: mean of the unit vectors (not re-normalised), dotted with q
            tv = {}
            for cid, ts in turns.items():
                v, cnt = own[cid].copy(), np.ones((len(ts), 1), dtype=np.float32)
                for i, t in enumerate(ts):
                    for j in (i - 1, i + 1):
                        if 0 <= j < len(ts) and ts[j]["session"] == t["session"]:
                            v[i] += own[cid][j]
                            cnt[i] += 1
                tv[cid] = v / cnt
            dense_signal("ctx_cosmean_both", tv, qv)
        if "sess" in args.signals:
            qv = query_vectors(store, qtexts)
            sess_vec: dict[str, tuple[list[str], np.ndarray]] = {}
            turn_vecs = stored_vectors(store, turns)
            for cid, ts in turns.items():
                sids = sorted({t["session"] for t in ts})
                m = np.stack([normed(turn_vecs[cid][[i for i, t in enumerate(ts) if t["session"] == s]].mean(0,
                              keepdims=True))[0] for s in sids])
                sess_vec[cid] = (sids, m)
            for name in ("sess_dense", "sess_bm25", "sess_both"):
                for topn in (1, 2, 3):
                    extra: dict[int, dict[str, float]] = {}
                    for cid, js in qs_of.items():
                        sids, m = sess_vec[cid]
                        bm = bm25_sessions(turns[cid], [qtexts[j] for j in js])
                        for jj, j in enumerate(js):
                            d = scaled(dict(zip(sids, (qv[j] @ m.T).tolist())))
                            b = {s: v / max(bm[jj].values()) for s, v in bm[jj].items()} if bm[jj] else {}
                            sc = {"sess_dense": d, "sess_bm25": b,
                                  "sess_both": {s: 0.5 * d.get(s, 0) + 0.5 * b.get(s, 0) for s in sids}}[name]
                            best = sorted(sc, key=lambda s: -sc[s])[:topn]
                            extra[j] = {t["id"]: sc[t["session"]] for t in turns[cid] if t["session"] in best}
                    key = f"{name}_top{topn}"
                    result[key] = evaluate(key, questions, rows, ks, extra.get, places)
                    print(key, result[key], flush=True)
            # the same first stage from the pool alone (no session index): a session's score = the sum of its
            # candidates' fused scores (the session boost uses their max)
            for topn in (1, 2, 3):
                extra = {}
                for cid, js in qs_of.items():
                    for j in js:
                        fz = fuse(questions[j].cands.dense, questions[j].cands.lexical, dense_weight=p.dense_weight)
                        agg: dict[str, float] = defaultdict(float)
                        for i, v in fz.items():
                            agg[rows[i].session_id] += v
                        sc = scaled(dict(agg))
                        best = sorted(sc, key=lambda s: -sc[s])[:topn]
                        extra[j] = {t["id"]: sc[t["session"]] for t in turns[cid] if t["session"] in best}
                key = f"sess_poolsum_top{topn}"
                result[key] = evaluate(key, questions, rows, ks, extra.get, places)
                print(key, result[key], flush=True)
                # only the pool's own turns lifted (what a store can do without listing a session's turns)
                inpool = {j: {i: v for i, v in e.items() if i in questions[j].cands.dense or i in
                              questions[j].cands.lexical} for j, e in extra.items()}
                key = f"sess_poolsum_inpool_top{topn}"
                result[key] = evaluate(key, questions, rows, ks, inpool.get, places)
                print(key, result[key], flush=True)
        if "speaker2" in args.signals or "ctxnext" in args.signals:
            result.update(more_rounds(store, questions, rows, turns, qs_of, qtexts, places, ks, args.signals))
        if "sess2" in args.signals:
            result.update(second_round(store, questions, rows, turns, qs_of, qtexts, places, ks))
        if "bm25ctx" in args.signals:  # on top of the shipped context vectors: do the two add up?
            extra = bm25_context(turns, qs_of, qtexts, args.pool, both=True)
            result["ctxvec_plus_bm25_both"] = evaluate("ctxvec_plus_bm25_both", questions, rows, ks, extra.get, places)
            print("ctxvec_plus_bm25_both", result["ctxvec_plus_bm25_both"], flush=True)
        if "ctx" in args.signals:
            t0 = time.time()
            qv = query_vectors(store, qtexts)
            for name, both in (("ctx_prev", False), ("ctx_both", True)):
                tv = {cid: store.embedder.encode(contextual_lines(ts, both)) for cid, ts in turns.items()}
                dense_signal(name, tv, qv)
            print("ctx s", round(time.time() - t0, 1), flush=True)
            for name, both in (("ctx_bm25_both", True),):
                extra = bm25_context(turns, qs_of, qtexts, args.pool, both=both)
                result[name] = evaluate(name, questions, rows, ks, extra.get, places)
                print(name, result[name], flush=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
