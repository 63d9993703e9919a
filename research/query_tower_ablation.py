"""A fine-tuned query tower (issue #16): the bundled all-MiniLM-L6-v2 fine-tuned on the QUERY side only, the
entries keeping the shipped MiniLM vectors (no store re-embedded, the query path's architecture unchanged).

The tower is the bundled model with LoRA (rank ``--rank``, B = 0 at the start, so it starts as the base model) on
every linear layer (attention query / key / value / output, feed-forward in / out) of its top ``--top`` layers; the
layers below are frozen, so their hidden states are computed once per question. Loss: a softmax over the
question's own conversation's frozen turn vectors at temperature ``--tau``, multi-positive
(-log sum over the evidence turns of p). Adam, constant learning rate, batches of 32, no dropout.

Nested CV over conversations (``learned_ablation.inner_cv``'s pattern): for the held-out conversation c, the
learning rate, the epochs and the fusion weight ``a`` are chosen by leave-one-conversation-out inside the other 4
(summed recall@5 + @10 of the shipped ranking), the tower then trained on all 4 and scored on c. At test the dense
and turn-context pools are searched exactly with the fused cosine ``(1 - a) V q + a V q_ft``
(``embedder_ablation.exact_pools``, MiniLM in both slots). Scored two ways: ``fixed``, the shipped learned head;
``refit``, the head refitted in the fold (``learned_ablation.ltr_fold``) on cross-fitted pools (a training
conversation d's questions read a tower trained on the other 3, never on d). Baseline: the same at a = 0.
``--arm mapq`` (session 14's ``mapq`` with a tower): the tower's output goes through a linear 384 -> 768 started at
the fold's ridge map (``embedder_ablation.fold_map``, memory lines only) and trained with it against mpnet's turn
vectors (``--vectors``); the pools fuse MiniLM's cosine with that mapped query's mpnet cosine.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice python research/query_tower_ablation.py --cache /tmp/q-cache.pkl

Last line: {"minilm": {"fixed": {...}, "refit": {...}, "reach": {...}}, "tower_a0.5": {...}, ..., "info": {...}}
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]  # research/, benchmarks/
import category_ablation as ca  # noqa: E402
import embedder_ablation as ea  # noqa: E402
import learned_ablation as la  # noqa: E402

from agentmem.recall.learned_rank import FEATURES  # noqa: E402

LINEARS = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
           "intermediate.dense", "output.dense")
Fits = dict[int, np.ndarray]  # epoch -> every question's tuned query vector (unit rows)


class LoRALinear(nn.Module):
    """``base(x) + scale · x Aᵀ Bᵀ`` with ``base`` frozen; B starts at 0, so the layer starts as ``base``.

    Example:
        >>> lin = nn.Linear(4, 3); lo = LoRALinear(lin, rank=2, alpha=4.0, seed=0)
        >>> x = torch.randn(5, 4); bool(torch.equal(lo(x), lin(x)))
        True
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, seed: int) -> None:
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        g = torch.Generator().manual_seed(seed)
        self.A = nn.Parameter(torch.randn(rank, base.in_features, generator=g) / math.sqrt(base.in_features))
        self.B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.A.T @ self.B.T) * self.scale


def add_lora(layers: nn.ModuleList, rank: int, alpha: float, seed: int = 0) -> list[nn.Parameter]:
    """Wrap every :data:`LINEARS` module of ``layers`` (in place) in :class:`LoRALinear`; the trainable A, B."""
    params: list[nn.Parameter] = []
    for n, layer in enumerate(layers):
        for k, path in enumerate(LINEARS):
            *up, name = path.split(".")
            parent = layer
            for u in up:
                parent = getattr(parent, u)
            lo = LoRALinear(getattr(parent, name), rank, alpha, seed * 1000 + n * 10 + k)
            setattr(parent, name, lo)
            params += [lo.A, lo.B]
    return params


def additive_mask(mask: torch.Tensor) -> torch.Tensor:
    """The (B, 1, 1, T) additive attention mask a BertLayer takes for a (B, T) 0/1 mask."""
    return (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min


class Tower:
    """The bundled MiniLM with every question's hidden states below the top ``top`` layers computed once.

    Example:
        >>> t = Tower(bundled_embedding_model_path(), ["when did she move?"])                 # doctest: +SKIP
        >>> t.encode(t.top_layers, [0]).shape                                                  # doctest: +SKIP
        torch.Size([1, 384])
    """

    def __init__(self, model_dir: Path | str, texts: list[str], top: int = 2) -> None:
        from transformers import AutoModel, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model_dir))
        model = AutoModel.from_pretrained(str(model_dir)).eval()
        enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        self.mask = enc["attention_mask"]
        layers = model.encoder.layer
        with torch.no_grad():
            h = model.embeddings(input_ids=enc["input_ids"], token_type_ids=enc["token_type_ids"])
            for layer in layers[:len(layers) - top]:
                h = self._run(layer, h, self.mask)
        self.hidden = h
        self.top_layers = nn.ModuleList(layers[len(layers) - top:])
        self.full = model

    @staticmethod
    def _run(layer: nn.Module, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = layer(h, attention_mask=additive_mask(mask))
        return out[0] if isinstance(out, tuple) else out

    def encode(self, layers: nn.ModuleList, idx: list[int] | np.ndarray, out: nn.Module | None = None
               ) -> torch.Tensor:
        """Unit mean-pooled vectors of questions ``idx`` through ``layers`` (the top ones, tuned or not); ``out``:
        an output map applied to the unit vector (then normalised again)."""
        m = self.mask[idx]
        width = int(m.sum(1).max())  # the batch's own width: the cached states past it are padding
        h, m = self.hidden[idx, :width], m[:, :width]
        for layer in layers:
            h = self._run(layer, h, m)
        mf = m.unsqueeze(-1).float()
        v = nn.functional.normalize((h * mf).sum(1) / mf.sum(1), dim=1)
        return v if out is None else nn.functional.normalize(out(v), dim=1)

    def encode_all(self, layers: nn.ModuleList, out: nn.Module | None = None, batch: int = 128) -> np.ndarray:
        """Every question's vector through ``layers`` (and ``out``; no gradient)."""
        with torch.no_grad():
            return np.concatenate([self.encode(layers, list(range(i, min(i + batch, len(self.mask)))), out).numpy()
                                   for i in range(0, len(self.mask), batch)])

    def fresh(self, rank: int, alpha: float, seed: int = 0) -> tuple[nn.ModuleList, list[nn.Parameter]]:
        """A copy of the top layers with LoRA added (the base model's output until trained) and its parameters."""
        layers = copy.deepcopy(self.top_layers)
        return layers, add_lora(layers, rank, alpha, seed)


def tower_loss(q: torch.Tensor, convs: list[str], gold: list[list[int]], V: dict[str, torch.Tensor], tau: float
               ) -> torch.Tensor:
    """Mean over the batch of -log Σ_evidence softmax(V_conv q / tau): each question against its own conversation.

    Example:
        >>> V = {"c": torch.eye(3)}; q = nn.functional.normalize(torch.tensor([[1.0, 0.1, 0.0]]), dim=1)
        >>> float(tower_loss(q, ["c"], [[0]], V, 0.05)) < float(tower_loss(q, ["c"], [[2]], V, 0.05))
        True
    """
    total = q.new_zeros(())
    for c in sorted(set(convs)):
        rows = [n for n, x in enumerate(convs) if x == c]
        logits = q[rows] @ V[c].T / tau
        pos = torch.zeros_like(logits, dtype=torch.bool)
        for r, n in enumerate(rows):
            pos[r, gold[n]] = True
        total = total + (logits.logsumexp(1) - logits.masked_fill(~pos, float("-inf")).logsumexp(1)).sum()
    return total / len(convs)


def train_tower(tower: Tower, train: list[int], convs: list[str], gold: list[list[int]], V: dict[str, np.ndarray],
                lr: float, checkpoints: list[int], *, rank: int = 8, alpha: float = 16.0, tau: float = 0.05,
                batch: int = 32, seed: int = 0, out: nn.Module | None = None, keep: list[nn.ModuleList] | None = None
                ) -> tuple[Fits, list[float]]:
    """LoRA on the tower's top layers trained on questions ``train`` (those with evidence); every question's vector
    at each epoch of ``checkpoints``, and the mean training loss per epoch. ``out``: an output map trained with it
    (arm 2: MiniLM -> mpnet, ``V`` then mpnet's turn vectors). ``keep``: the trained layers are appended to it
    (``research/train_query_tower.py`` writes them out)."""
    torch.manual_seed(seed)
    layers, params = tower.fresh(rank, alpha, seed)
    params += list(out.parameters()) if out is not None else []
    opt = torch.optim.Adam(params, lr=lr)
    Vt = {c: torch.tensor(v, dtype=torch.float32) for c, v in V.items()}
    train = [j for j in train if gold[j]]
    rng = np.random.default_rng(seed)
    fits: Fits = {0: tower.encode_all(layers, out)} if 0 in checkpoints else {}
    losses = []
    for ep in range(1, max(checkpoints) + 1):
        order, run = rng.permutation(train), 0.0
        for i in range(0, len(order), batch):
            b = order[i:i + batch]
            loss = tower_loss(tower.encode(layers, b, out), [convs[j] for j in b], [gold[j] for j in b], Vt, tau)
            opt.zero_grad()
            loss.backward()
            opt.step()
            run += float(loss.detach()) * len(b)
        losses.append(round(run / len(order), 4))
        if ep in checkpoints:
            fits[ep] = tower.encode_all(layers, out)
    if keep is not None:
        keep.append(layers)
    return fits, losses


Config = tuple[float, int, float]  # (learning rate, epochs, a)


def nested(convs_of: list[str], fit: Callable[[frozenset, float], Fits],
           recall: Callable[[np.ndarray, float, list[int]], list[dict[int, float]]], configs: list[Config],
           variants: dict[str, list[Config]]) -> dict[str, Any]:
    """Per held-out conversation c and variant (name -> its configs): the config chosen by leave-one-conversation-out
    inside the others (``fit(train conversations, lr)`` -> epoch -> vectors; ``recall(vectors, a, questions)``),
    its held-out recall from ``fit(all but c, lr)``, and every training question's cross-fitted vector (from the
    tower trained without its own conversation). ``fit`` never sees a set holding c for c's own figures.

    Example:
        >>> r = nested(["x", "y", "z"], lambda s, lr: {1: np.zeros((3, 2))},
        ...            lambda Q, a, js: [{5: a, 10: a} for _ in js], [(1.0, 1, 0.5), (1.0, 1, 1.0)], {"cv": None})
        >>> r["cv"]["chosen"]
        [(1.0, 1, 1.0), (1.0, 1, 1.0), (1.0, 1, 1.0)]
    """
    names = sorted(set(convs_of))
    qs = [type("Q", (), {"conv": c})() for c in convs_of]
    memo: dict[tuple, list[dict[int, float]]] = {}

    def rec(train: list[int], va: list[int], cfg: Config) -> list[dict[int, float]]:
        key = (frozenset(convs_of[j] for j in train), cfg, convs_of[va[0]])
        if key not in memo:
            memo[key] = recall(fit(key[0], cfg[0])[cfg[1]], cfg[2], va)
        return memo[key]

    out: dict[str, Any] = {}
    for name, cfgs in variants.items():
        cfgs = cfgs or configs
        held: list[dict[int, float]] = [{} for _ in convs_of]
        crossed = [np.zeros(0) for _ in names]
        chosen = []
        for n, c in enumerate(names):
            train_convs = [d for d in names if d != c]
            inner = la.inner_cv(qs, train_convs, cfgs, rec)
            best = max(cfgs, key=lambda cfg: (inner[cfg], -cfg[1]))
            chosen.append(best)
            te = [j for j, x in enumerate(convs_of) if x == c]
            Q = fit(frozenset(train_convs), best[0])[best[1]]
            for j, r in zip(te, recall(Q, best[2], te)):
                held[j] = r
            X = Q.copy()  # this fold's vectors: c's from the 4-conversation tower, d's from the one without d
            for d in train_convs:
                rows = [j for j, x in enumerate(convs_of) if x == d]
                X[rows] = fit(frozenset(train_convs) - {d}, best[0])[best[1]][rows]
            crossed[n] = X
        out[name] = {"held": held, "chosen": chosen, "crossed": crossed}
    return out


def mpnet_spaces(data: la.Data, path: Path) -> ea.Spaces:
    """``embedder_ablation.Spaces`` (MiniLM and mpnet turn / turn-context vectors) from its cached mpnet vectors."""
    ids = sorted(data.rows)
    mp, _ = ea.cached_vectors(path, Path("/tmp/mpnet/all-mpnet-base-v2"), ids,
                              [data.rows[i].memory_text for i in ids], [q.text for q in data.questions])
    return ea.Spaces(data, mp, ea.predecessors(data))


def spaces_of(data: la.Data) -> dict[str, tuple[list[str], dict[str, np.ndarray]]]:
    """Per conversation, ``exact_pools``'s conv pair with MiniLM in both slots (the tower's query reads the same
    stored vectors)."""
    return {c: (ids, {"minilm": V, "minilm_ctx": C, "mpnet": V, "mpnet_ctx": C})
            for c, (ids, V, C) in la.unique_turns(data).items()}


def gold_rows(data: la.Data) -> list[list[int]]:
    """Every question's evidence turns as rows of its conversation's ``unique_turns`` matrix."""
    pos = {c: {i: n for n, i in enumerate(ids)} for c, (ids, _, _) in la.unique_turns(data).items()}
    return [sorted(pos[q.conv][i] for i in q.gold if i in pos[q.conv]) for q in data.questions]


def cands_of(data: la.Data, spaces: dict, Q: np.ndarray, a: float, idx: list[int]) -> list[Any]:
    """Questions ``idx`` with their dense / turn-context pools searched at the fused cosine (a = 0: MiniLM)."""
    qs = data.questions
    return ea.with_cands([qs[j] for j in idx], [ea.exact_pools(qs[j], spaces[qs[j].conv], data.qvecs[j], Q[j], a,
                                                               data.places) for j in idx])


def refit_fold(data: la.Data, cands: list[Any], held_conv: str) -> dict[int, dict[int, float]]:
    """The head refitted on 4 conversations (L2 / blend chosen inside, dense weights >= 0) over these candidates
    and scored on ``held_conv``: question index -> recall."""
    nonneg = [FEATURES.index(f) for f in la.MONOTONE["dense"]]
    feats = ea.head_feats(cands, data.rows, ca.unit_vectors(data))
    got, _, _ = la.ltr_fold(data, {"t": feats}, held_conv, nonneg=nonneg)
    return got


def scored(data: la.Data, spaces: dict, result: dict[str, Any], variant: str, do_refit: bool) -> dict[str, Any]:
    """One variant of :func:`nested`: held-out fixed-head summary, reach, chosen configs and (``do_refit``) the head
    refitted per fold on the fold's cross-fitted pools."""
    qs = data.questions
    r = result[variant]
    held_cands: list[Any] = [None] * len(qs)
    refit_held: list[dict[int, float]] = [{} for _ in qs]
    for c, cfg, X in zip(data.convs, r["chosen"], r["crossed"]):
        cands = cands_of(data, spaces, X, cfg[2], list(range(len(qs))))
        for j, q in enumerate(qs):
            if q.conv == c:
                held_cands[j] = cands[j]
        if do_refit:
            for j, rec in refit_fold(data, cands, c).items():
                refit_held[j] = rec
    out = {"fixed": la.summary(qs, r["held"]), "reach": ea.pool_reach(held_cands),
           "chosen": [f"lr={lr:g},ep={ep},a={a:g}" for lr, ep, a in r["chosen"]]}
    if do_refit:
        out["refit"] = la.summary(qs, refit_held)
    return out


def baseline(data: la.Data, spaces: dict, refit: bool) -> dict[str, Any]:
    """MiniLM exact (a = 0): the fixed head, the pools' reach and (``refit``) the head refitted per fold."""
    qs = data.questions
    cands = cands_of(data, spaces, data.qvecs, 0.0, list(range(len(qs))))
    out = {"fixed": la.summary(qs, ea.fixed_recall(cands, data.rows)), "reach": ea.pool_reach(cands)}
    if refit:
        held: list[dict[int, float]] = [{} for _ in qs]
        for c in tqdm(data.convs, desc="baseline refit"):
            for j, rec in refit_fold(data, cands, c).items():
                held[j] = rec
        out["refit"] = la.summary(qs, held)
    return out


def map_module(W: np.ndarray) -> nn.Linear:
    """``embedder_ablation.fit_map``'s ridge map ((384 + 1) x 768, last row the bias) as a linear layer.

    Example:
        >>> lin = map_module(np.vstack([np.eye(2), np.zeros((1, 2))])); lin(torch.ones(1, 2)).tolist()
        [[1.0, 1.0]]
    """
    lin = nn.Linear(W.shape[0] - 1, W.shape[1])
    with torch.no_grad():
        lin.weight.copy_(torch.tensor(W[:-1].T, dtype=torch.float32))
        lin.bias.copy_(torch.tensor(W[-1], dtype=torch.float32))
    return lin


def run(data: la.Data, tower: Tower, args: argparse.Namespace) -> dict[str, Any]:
    """The baseline (a = 0), the nested tower variants (a fixed at each ``--alphas``, and chosen inside) and info.
    ``--arm mapq``: the tower's output mapped into mpnet's space (a linear 384 -> 768 from the fold's ridge map,
    trained with it against mpnet's turn vectors) and fused with MiniLM's cosine as session 14's ``mapq``."""
    qs, gold = data.questions, gold_rows(data)
    convs_of = [q.conv for q in qs]
    every = list(range(len(qs)))
    base = tower.encode_all(tower.top_layers)
    qv = data.qvecs / np.linalg.norm(data.qvecs, axis=1, keepdims=True)
    info: dict[str, Any] = {"float_vs_cache_cos": [round(float(x), 4) for x in
                                                   (np.mean(np.sum(base * qv, 1)), np.min(np.sum(base * qv, 1)))],
                            "fits": {}}
    mp = mpnet_spaces(data, args.vectors) if args.arm == "mapq" else None
    spaces = mp.conv if mp else spaces_of(data)
    V = {c: v[1]["mpnet" if mp else "minilm"] for c, v in spaces.items()}
    out: dict[str, Any] = {"minilm": baseline(data, spaces_of(data), args.refit)}
    print("minilm", json.dumps(out["minilm"]), flush=True)
    fits: dict[tuple[frozenset, float], Fits] = {}
    bar = tqdm(total=10 * len(args.lrs) + 5, desc="tower fits")

    def fit(train_convs: frozenset, lr: float) -> Fits:
        if (train_convs, lr) not in fits:
            t0 = time.time()
            members = [j for j in every if convs_of[j] in train_convs]
            head = map_module(ea.fold_map(mp, sorted(train_convs))[0]) if mp else None
            fits[train_convs, lr], losses = train_tower(tower, members, convs_of, gold, V, lr, args.epochs,
                                                        rank=args.rank, alpha=2.0 * args.rank, tau=args.tau,
                                                        out=head, seed=args.seed)
            info["fits"]["+".join(sorted(train_convs)) + f"|{lr:g}"] = {"s": round(time.time() - t0, 1),
                                                                       "loss": losses}
            bar.update()
        return fits[train_convs, lr]

    def recall(Q: np.ndarray, a: float, idx: list[int]) -> list[dict[int, float]]:
        return ea.fixed_recall(cands_of(data, spaces, Q, a, idx), data.rows)

    configs = [(lr, ep, a) for lr in args.lrs for ep in args.epochs for a in args.alphas]
    arm = "maptower" if mp else "tower"
    variants = {f"{arm}_a{a:g}": [c for c in configs if c[2] == a] for a in args.alphas} | {f"{arm}_cv": configs}
    result = nested(convs_of, fit, recall, configs, variants)
    bar.close()
    for name in variants:
        out[name] = scored(data, spaces, result, name, args.refit)
        print(name, json.dumps(out[name]), flush=True)
    out["info"] = info
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True, type=Path)
    ap.add_argument("--lrs", type=float, nargs="+", default=[3e-4, 1e-3])
    ap.add_argument("--epochs", type=int, nargs="+", default=[2, 5], help="checkpoints of one run, chosen inside")
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.5, 1.0])
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--top", type=int, default=2, help="LoRA on this many top layers (those below frozen)")
    ap.add_argument("--tau", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0, help="LoRA's A and the batch order")
    ap.add_argument("--refit", action="store_true", help="also: the head refitted per fold on cross-fitted pools")
    ap.add_argument("--arm", choices=["minilm", "mapq"], default="minilm",
                    help="mapq: the tower's output mapped into mpnet's space (needs --vectors)")
    ap.add_argument("--vectors", type=Path, default=Path("/tmp/mpnet-vecs.npz"),
                    help="embedder_ablation's cached mpnet vectors of the memory lines and questions")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)  # one core; another helper's job has the other
    from agentmem.embed.minilm import bundled_embedding_model_path

    data = la.Data(**la.load_cache(args.cache))
    tower = Tower(bundled_embedding_model_path(), [q.text for q in data.questions], args.top)
    t0 = time.time()
    result = run(data, tower, args)
    result["info"]["seconds"] = round(time.time() - t0, 1)
    if args.out:
        args.out.write_text(json.dumps(result))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
