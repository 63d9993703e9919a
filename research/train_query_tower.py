"""Train the query tower that ships (``agentmem/embed/weights/query_tower.safetensors``), or one per held-out conversation.

The tower is ``research/query_tower_ablation.py``'s: the bundled all-MiniLM-L6-v2 with LoRA (rank 8, alpha 16)
on every linear layer of its top two layers, trained with a softmax over each question's own conversation's frozen
turn vectors (temperature 0.05, the evidence turns as targets; Adam). The settings are those the ablation's nested
choice made (learning rate 1e-3 and 2 epochs in 4 of its 5 folds, the tower alone, a = 1); the shipped tower is
trained on all the dev conversations' questions, as the head's and the calibration's constants are fitted on them.

    python research/train_query_tower.py --cache /tmp/q-cache.pkl --out agentmem/embed/weights/query_tower.safetensors
    python research/train_query_tower.py --cache /tmp/q-cache.pkl --hold-out /tmp/towers   # <conv>.safetensors,
                                                               # each trained without that conversation
    python research/train_query_tower.py --cache /tmp/L.pkl /tmp/R.pkl --hold-out /tmp/towers  # two datasets' questions
    python benchmarks/locomo.py --data ... --store <copy of the cached store> --held-out-towers /tmp/towers

Each file is checked against the path recall runs it through (``MiniLMEmbedder(query_tower=...).encode_query``: the
merged model's ONNX graph with int8 feed-forward weights): ``served_cos`` is the mean / min cosine between the
trained tower's vectors and the served ones over the questions.

Last line: {"towers": {"<name>": {"questions": N, "loss": [...], "served_cos": [mean, min], "bytes": B}}, ...}
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]  # research/, benchmarks/
import learned_ablation as la  # noqa: E402
import query_tower_ablation as qta  # noqa: E402

from agentmem.embed.query_tower import BUNDLED_BASE, save_tower  # noqa: E402
from agentmem.embed.minilm import MiniLMEmbedder, bundled_embedding_model_path  # noqa: E402

LR, EPOCHS, RANK, TAU = 1e-3, 2, 8, 0.05


def deltas_of(layers: torch.nn.ModuleList, first: int) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], float]:
    """The trained LoRA factors of ``layers`` (the model's layers ``first``, ``first + 1``, …) under the full
    model's module names, and their scale.

    Example:
        >>> deltas, scale = deltas_of(layers, 4)                                              # doctest: +SKIP
        >>> sorted(deltas)[0]                                                                   # doctest: +SKIP
        'encoder.layer.4.attention.output.dense'
    """
    deltas, scales = {}, set()
    for n, layer in enumerate(layers):
        for path in qta.LINEARS:
            lora = layer.get_submodule(path)
            deltas[f"encoder.layer.{first + n}.{path}"] = (lora.A.detach(), lora.B.detach())
            scales.add(float(lora.scale))
    (scale,) = scales
    return deltas, scale


def merged(caches: list[dict[str, Any]]) -> la.Data:
    """One :class:`la.Data` over the conversations of several caches (e.g. LoCoMo's and REALTALK's), so a tower
    trains on every dataset's questions; conversation ids must not repeat across caches.

    Example:
        >>> merged([la.load_cache(Path("L.pkl")), la.load_cache(Path("R.pkl"))]).convs[:2]    # doctest: +SKIP
        ['26', '30']
    """
    first, *rest = caches
    out = {k: (list(v) if k == "questions" else dict(v) if isinstance(v, dict) else v) for k, v in first.items()}
    for cache in rest:
        clash = set(out["turns"]) & set(cache["turns"])
        if clash:
            raise ValueError(f"conversation ids in more than one cache: {sorted(clash)}")
        out["questions"] += cache["questions"]
        for key in ("rows", "places", "turns", "vecs", "ctx"):
            out[key].update(cache[key])
        out["qvecs"] = np.concatenate([out["qvecs"], cache["qvecs"]])
    return la.Data(**out)


def train(tower: qta.Tower, data: la.Data, members: list[int], path: Path, *, lr: float, epochs: int, rank: int,
          tau: float, seed: int) -> dict[str, Any]:
    """Train on questions ``members``, write the tower to ``path``, and check it against the served vectors."""
    gold, convs = qta.gold_rows(data), [q.conv for q in data.questions]
    V = {c: V for c, (_, V, _) in la.unique_turns(data).items()}
    kept: list[torch.nn.ModuleList] = []
    fits, losses = qta.train_tower(tower, members, convs, gold, V, lr, [epochs], rank=rank, alpha=2.0 * rank,
                                   tau=tau, seed=seed, keep=kept)
    deltas, scale = deltas_of(kept[0], len(tower.full.encoder.layer) - len(kept[0]))
    save_tower(path, deltas, scale=scale, base=BUNDLED_BASE)
    with tempfile.TemporaryDirectory() as cache:
        served = MiniLMEmbedder(cache_dir=Path(cache), query_tower=path)
        sample = list(range(0, len(data.questions), 7))  # every 7th question: enough to see a drift
        got = np.stack([served.encode_query(data.questions[j].text) for j in sample])
    cos = np.sum(got * fits[epochs][sample], axis=1)
    return {"questions": len([j for j in members if gold[j]]), "loss": losses,
            "served_cos": [round(float(cos.mean()), 4), round(float(cos.min()), 4)], "bytes": path.stat().st_size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True, type=Path, nargs="+",
                    help="research/_locomo_cache.py's cache (several: trained on every one's questions)")
    ap.add_argument("--out", type=Path, help="the tower trained on every conversation's questions")
    ap.add_argument("--hold-out", type=Path, help="a folder: one <conversation>.safetensors trained without it")
    ap.add_argument("--lr", type=float, default=LR)
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--rank", type=int, default=RANK)
    ap.add_argument("--tau", type=float, default=TAU)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not (args.out or args.hold_out):
        ap.error("give --out, --hold-out or both")
    torch.set_num_threads(1)
    data = merged([la.load_cache(path) for path in args.cache])
    tower = qta.Tower(bundled_embedding_model_path(), [q.text for q in data.questions])
    every = list(range(len(data.questions)))
    jobs: dict[str, tuple[list[int], Path]] = {}
    if args.out:
        jobs["all"] = (every, args.out)
    if args.hold_out:
        args.hold_out.mkdir(parents=True, exist_ok=True)
        for c in data.convs:
            jobs[c] = ([j for j in every if data.questions[j].conv != c], args.hold_out / f"{c}.safetensors")
    t0, out = time.time(), {}
    for name, (members, path) in jobs.items():
        out[name] = train(tower, data, members, path, lr=args.lr, epochs=args.epochs, rank=args.rank,
                          tau=args.tau, seed=args.seed)
        print(name, json.dumps(out[name]), flush=True)
    print(json.dumps({"towers": out, "settings": {"lr": args.lr, "epochs": args.epochs, "rank": args.rank,
                                                  "tau": args.tau, "seed": args.seed},
                      "seconds": round(time.time() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
