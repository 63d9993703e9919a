"""Probe: can the local model (SmolLM2-135M) re-rank recall's candidates by query likelihood?

Lab experiment for issue #38 (a stronger relevance model than the ranking's). For each question the store's top
``--pool`` recalled memories are scored by the model's pointwise mutual information of the question given the memory:
``log P(question | memory) - log P(question)`` (the memory's own line as the prompt, then "Question: ..."), and the
ranking is re-ordered by ``rank_score + w * pmi`` (``w`` fitted on one dataset, scored on the other).

    python research/llm_rerank_probe.py gather --data ../shared/data/realtalk/realtalk_dev5.json --store S --out R.pkl
    python research/llm_rerank_probe.py score --cands R.pkl --out R-pmi.pkl
    python research/llm_rerank_probe.py fit --a R-pmi.pkl --b L-pmi.pkl
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "benchmarks")]
import locomo  # noqa: E402

from agentmem import AgentMemory  # noqa: E402


def gather(args: argparse.Namespace) -> None:
    conversations = json.loads(Path(args.data).read_text())
    with AgentMemory(args.store, kv_encoding="off") as mem:
        id_maps = locomo.ingest_once(mem, conversations, Path(args.store) / "locomo-ids.json",
                                     {"data": str(Path(args.data).resolve()), "backend": "embedded",
                                      "consolidation": "local", "conversations": None})
        questions = locomo.questions_of(conversations, id_maps)
        out = []
        for q in tqdm(questions, desc="recalling"):
            hits = mem.recall(q.text, user_id=f"locomo-{q.conv}", k=args.pool)
            out.append({"q": q.text, "cat": q.category, "gold": sorted(q.gold), "ids": [h.id for h in hits],
                        "texts": [h.memory_text or h.text for h in hits], "score": [h.score for h in hits],
                        "rank": [h.scores.get("rank", 0.0) for h in hits]})
    Path(args.out).write_bytes(pickle.dumps(out))


@torch.inference_mode()
def _logprob(model, tok, prompts: list[str], question: str, batch: int) -> list[float]:
    """Sum log P(question tokens | prompt) for each prompt."""
    q_ids = tok(" " + question, add_special_tokens=False)["input_ids"]
    out = []
    for i in range(0, len(prompts), batch):
        chunk = [tok(p, add_special_tokens=False)["input_ids"][-160:] for p in prompts[i:i + batch]]
        seqs = [c + q_ids for c in chunk]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), tok.pad_token_id or 0)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):  # left padding: the question ends every row at the same column
            ids[r, width - len(s):] = torch.tensor(s)
            mask[r, width - len(s):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
        logp = torch.log_softmax(logits[:, -len(q_ids) - 1:-1], -1)
        target = ids[:, -len(q_ids):]
        out += logp.gather(-1, target[..., None])[..., 0].sum(-1).tolist()
    return out


def score(args: argparse.Namespace) -> None:
    from agentmem.kv import load_model

    torch.set_num_threads(args.threads)
    model, tok = load_model(dtype="float32")
    rows = pickle.loads(Path(args.cands).read_bytes())[::args.every]
    for r in tqdm(rows, desc="scoring"):
        for key in ("ids", "texts", "score", "rank"):
            r[key] = r[key][:args.pool]
        prompts = [f"{t}\nQuestion:" for t in r["texts"]]
        r["lp"] = _logprob(model, tok, prompts, r["q"], args.batch)
        r["lp0"] = _logprob(model, tok, ["Question:"], r["q"], 1)[0]
    Path(args.out).write_bytes(pickle.dumps(rows))


def _recall_at(rows: list[dict], w: float, k: int, key: str) -> float:
    vals = []
    for r in rows:
        pmi = np.array(r["lp"]) - r["lp0"]
        base = np.array(r[key], dtype=float)
        base = np.log(np.clip(base, 1e-9, 1)) if key == "score" else base
        order = np.argsort(-(base + w * pmi / max(1, len(r["q"].split()))), kind="stable")
        top = {r["ids"][i] for i in order[:k]}
        vals.append(len(top & set(r["gold"])) / len(r["gold"]))
    return round(statistics.fmean(vals), 4)


def fit(args: argparse.Namespace) -> None:
    grid = [0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0]
    data = {name: pickle.loads(Path(p).read_bytes()) for name, p in (("a", args.a), ("b", args.b)) if p}
    report = {}
    for name, rows in data.items():
        curve = {w: (_recall_at(rows, w, 5, args.key), _recall_at(rows, w, 10, args.key)) for w in grid}
        best = max(grid, key=lambda w: curve[w][1])
        report[name] = {"curve": {str(w): v for w, v in curve.items()}, "best_w": best}
    if len(data) == 2:
        for fit_on, score_on in (("a", "b"), ("b", "a")):
            w = report[fit_on]["best_w"]
            rows = data[score_on]
            report[f"fit_{fit_on}_score_{score_on}"] = {"w": w, "recall@5": _recall_at(rows, w, 5, args.key),
                                                        "recall@10": _recall_at(rows, w, 10, args.key)}
    print(json.dumps(report))


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gather")
    g.add_argument("--data", required=True); g.add_argument("--store", required=True)
    g.add_argument("--out", required=True); g.add_argument("--pool", type=int, default=30)
    s = sub.add_parser("score")
    s.add_argument("--cands", required=True); s.add_argument("--out", required=True)
    s.add_argument("--batch", type=int, default=16); s.add_argument("--threads", type=int, default=1)
    s.add_argument("--every", type=int, default=1, help="score every n-th question only (the model is slow)")
    s.add_argument("--pool", type=int, default=30)
    f = sub.add_parser("fit")
    f.add_argument("--a", required=True); f.add_argument("--b"); f.add_argument("--key", default="score")
    args = p.parse_args()
    {"gather": gather, "score": score, "fit": fit}[args.cmd](args)


if __name__ == "__main__":
    main()
