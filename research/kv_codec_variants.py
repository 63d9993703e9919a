"""Which 3-4-bit KV quantization choices matter for fidelity? Simulated codecs side by side, on a TUNE split.

Each variant quantizes and dequantizes an entry's KV in float (a "fake-quant" of what a stored codec would keep),
so ideas can be compared before any of them is built into ``agentmem/kv/quant.py``: bit widths, key group size,
an orthogonal (Hadamard) rotation of values and/or keys before quantization, keys quantized before RoPE, a few
first tokens kept in float. For each: mean KL(text || variant) over gold-answer tokens in ``kv`` and ``kv+fix``,
the gold NLL relative to fp32, and the stored bits per element the variant would cost on 45-token entries
(LoCoMo's typical turn).

The questions are a TUNE split (``--split tune``: conversations with an odd index, a seed other than the main
benchmark's), so a choice made here is scored independently by ``kv_compression.py`` on its own sample.

    python research/kv_codec_variants.py --data ../shared/data/locomo/locomo_dev5.json --questions 16

Last line: {"benchmark": "kv_codec_variants", "variants": {"int4": {...}, ...}}
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]  # research/, benchmarks/

import mount_fidelity  # noqa: E402

from agentmem.kv import FixConfig, KVEngine, MemoryItem, load_model, rotary_inv_freq  # noqa: E402
from agentmem.kv.quant import hadamard_matrix  # noqa: E402


CLIP_GRID = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6)


def _qdq(part: torch.Tensor, lo: torch.Tensor, scale: torch.Tensor, levels: int) -> torch.Tensor:
    return torch.clamp(torch.round((part - lo) / scale), 0, levels) * scale + lo


FINE_GRID = tuple(round(1.0 - 0.025 * i, 3) for i in range(23))  # 1.0 ... 0.45


def fake_quant(x: torch.Tensor, bits: int, dim: int, group: int, symmetric: bool = False,
               clip: bool = False, grid: tuple = CLIP_GRID) -> torch.Tensor:
    """Min/max asymmetric quantization of ``x`` [L, H, T, D] along ``dim`` (2: per channel over tokens, 3: per
    token over channels) in groups of ``group``, scales/zeros rounded to fp16 as stored. ``symmetric``: one scale,
    the zero point fixed at the middle of the range (-absmax). ``clip``: each group's range shrunk by the factor of
    ``CLIP_GRID`` with the least squared error on that group (an encode-time search; the stored format is the same)."""
    levels = (1 << bits) - 1
    n = x.shape[dim]
    out = torch.empty_like(x)
    for s in range(0, n, group):
        part = x.narrow(dim, s, min(group, n - s))
        best, best_err = None, None
        for c in grid if clip else (1.0,):
            if symmetric:
                amax = part.abs().amax(dim=dim, keepdim=True) * c
                scale = (2 * amax / levels).half().float()
                lo = -scale * levels / 2
            else:
                hi, lo0 = part.amax(dim=dim, keepdim=True), part.amin(dim=dim, keepdim=True)
                mid, half = (hi + lo0) / 2, (hi - lo0) / 2 * c
                lo = (mid - half).half().float()
                scale = ((mid + half - lo) / levels).half().float()
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
            rec = _qdq(part, lo, scale, levels)
            if best is None:
                best, best_err = rec, ((rec - part) ** 2).sum(dim=dim, keepdim=True)
                continue
            err = ((rec - part) ** 2).sum(dim=dim, keepdim=True)
            better = err < best_err
            best, best_err = torch.where(better, rec, best), torch.where(better, err, best_err)
        out.narrow(dim, s, part.shape[dim]).copy_(best)
    return out


def rope_rotate(keys: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, sign: float) -> torch.Tensor:
    """Keys rotated by ``sign * position`` (half-split layout, as Llama's RoPE), per token."""
    half = inv_freq.numel()
    ang = positions[:, None].float() * inv_freq[None, :].float() * sign
    c, s = ang.cos(), ang.sin()
    x1, x2, rest = keys[..., :half], keys[..., half : 2 * half], keys[..., 2 * half :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)


@dataclasses.dataclass(frozen=True)
class Variant:
    kb: int
    vb: int
    key_group: int = 32  # tokens per key scale (per channel); 0: the whole entry
    had_values: bool = False  # Hadamard over the head dim before per-token value quantization
    had_keys: bool = False  # keys quantized per TOKEN after a Hadamard (QuaRot-style) instead of per channel
    pre_rope: bool = False  # keys quantized before RoPE
    sink: int = 0  # first tokens of the entry kept in float
    sym_values: bool = False  # values: one fp16 scale per token (no zero point)
    clip_values: bool = False  # values: per-token range clipped by an MSE search (CLIP_GRID)
    clip_keys: bool = False  # keys: per-channel range clipped likewise
    layer_bits: tuple = ()  # ((layer, kb, vb), ...): those layers at other bit widths
    fine: bool = False  # the clip search over FINE_GRID instead of CLIP_GRID

    def bits_per_element(self, tokens: int = 60, dim: int = 64, layers: int = 30) -> float:
        """Stored bits per element on an entry of ``tokens`` tokens (codes + fp16 scale and zero point; LoCoMo's
        turns average 60 tokens), without the blob header and token ids (~0.05 bits)."""
        kg = tokens if self.key_group == 0 else self.key_group
        if self.had_keys:
            key_over = 32 / dim
        else:
            key_over = 32 * math.ceil(tokens / kg) / tokens
        val_over = (16 if self.sym_values else 32) / dim
        quant = (tokens - self.sink) / tokens
        over = dict((layer, (kb, vb)) for layer, kb, vb in self.layer_bits)
        codes = sum(sum(over.get(i, (self.kb, self.vb))) for i in range(layers)) / layers
        return (quant * (codes + key_over + val_over) + (1 - quant) * 32) / 2

    def bytes_per_token(self, tokens: int = 60) -> float:
        """SmolLM2 (30 x 3 x 64 x 2 elements per token), header (~1.4 KB per blob) and token ids included."""
        return self.bits_per_element(tokens) / 8 * 11520 + 1400 / tokens + 8

    def apply(self, keys: torch.Tensor, values: torch.Tensor, offset: int, inv_freq: torch.Tensor):
        if not self.layer_bits:
            return self._apply(keys, values, offset, inv_freq, self.kb, self.vb)
        kq, vq = self._apply(keys, values, offset, inv_freq, self.kb, self.vb)
        for layer, kb, vb in self.layer_bits:
            k1, v1 = self._apply(keys[layer : layer + 1], values[layer : layer + 1], offset, inv_freq, kb, vb)
            kq[layer], vq[layer] = k1[0], v1[0]
        return kq, vq

    def _apply(self, keys, values, offset, inv_freq, kb: int, vb: int):
        k, v = keys.float(), values.float()
        T, D = k.shape[2], k.shape[3]
        pos = torch.arange(offset, offset + T)
        if kb >= 16:
            kq = k.clone()
        else:
            if self.pre_rope:
                k = rope_rotate(k, pos, inv_freq, -1.0)
            if self.had_keys:
                h = hadamard_matrix(D)
                kq = fake_quant(k @ h.T, kb, 3, D, clip=self.clip_keys) @ h
            else:
                kq = fake_quant(k, kb, 2, T if self.key_group == 0 else self.key_group, clip=self.clip_keys,
                                grid=FINE_GRID if self.fine else CLIP_GRID)
            if self.pre_rope:
                kq = rope_rotate(kq, pos, inv_freq, 1.0)
        if vb >= 16:
            vq = v.clone()
        elif self.had_values:
            h = hadamard_matrix(D)  # the stored codecs' rotation (value_transform="hadamard")
            vq = fake_quant(v @ h.T, vb, 3, D, self.sym_values, self.clip_values,
                            FINE_GRID if self.fine else CLIP_GRID) @ h
        else:
            vq = fake_quant(v, vb, 3, D, self.sym_values, self.clip_values)
        if self.sink:
            kq[:, :, : self.sink], vq[:, :, : self.sink] = keys[:, :, : self.sink], values[:, :, : self.sink]
        return kq, vq


VARIANTS = {
    "int4": Variant(4, 4),
    "int4_kg_entry": Variant(4, 4, key_group=0),
    "int4_hv": Variant(4, 4, key_group=0, had_values=True),
    "int4_prerope": Variant(4, 4, key_group=0, pre_rope=True),
    "int4_hv_prerope": Variant(4, 4, key_group=0, had_values=True, pre_rope=True),
    "int4_sink2": Variant(4, 4, key_group=0, sink=2),
    # which side loses fidelity: exact values / exact keys
    "k4v16": Variant(4, 16, key_group=0),
    "k4v16_prerope": Variant(4, 16, key_group=0, pre_rope=True),
    "k4v16_clipk": Variant(4, 16, key_group=0, clip_keys=True),
    "k16v3_hv": Variant(16, 3, key_group=0, had_values=True),
    "k16v3_hvs_clip": Variant(16, 3, key_group=0, had_values=True, sym_values=True, clip_values=True),
    "k4v3": Variant(4, 3, key_group=0),
    "k4v3_hv": Variant(4, 3, key_group=0, had_values=True),
    "k4v3_hvs": Variant(4, 3, key_group=0, had_values=True, sym_values=True),
    "k4v3_hvs_clip": Variant(4, 3, key_group=0, had_values=True, sym_values=True, clip_values=True),
    "k4v3_hvs_clip_prerope": Variant(4, 3, key_group=0, had_values=True, sym_values=True, clip_values=True,
                                     pre_rope=True),
    "k4v3_hvs_clip_clipk": Variant(4, 3, key_group=0, had_values=True, sym_values=True, clip_values=True,
                                   clip_keys=True),
    "k4v3_hv_clip_clipk": Variant(4, 3, key_group=0, had_values=True, clip_values=True, clip_keys=True),
    "k4v3_hvs_clipk": Variant(4, 3, key_group=0, had_values=True, sym_values=True, clip_keys=True),
    "k4v3_hvs_clip_clipk_prerope": Variant(4, 3, key_group=0, had_values=True, sym_values=True, clip_values=True,
                                           clip_keys=True, pre_rope=True),
    "k4v3_hvs_clip_clipk_fine": Variant(4, 3, key_group=0, had_values=True, sym_values=True, clip_values=True,
                                        clip_keys=True, fine=True),
    "k4v3_hvs_clip_clipk_l01": Variant(4, 3, key_group=0, had_values=True, sym_values=True, clip_values=True,
                                       clip_keys=True, layer_bits=((0, 16, 16), (1, 16, 16))),
    "int4_hvs_clip_clipk": Variant(4, 4, key_group=0, had_values=True, sym_values=True, clip_values=True,
                                   clip_keys=True),
    "k4v2_hv_clip_clipk": Variant(4, 2, key_group=0, had_values=True, clip_values=True, clip_keys=True),
    "k3v4": Variant(3, 4, key_group=0),
    # session 4: the fine clip grid, and layer 1 (the leave-one-layer-out sweep's most sensitive) at more bits
    **{f"k4v3hsf{tag}": Variant(4, 3, key_group=0, had_values=True, sym_values=True, clip_values=True,
                                clip_keys=True, fine=True, layer_bits=lb)
       for tag, lb in (("", ()), ("_l1k8", ((1, 8, 3),)), ("_l1v4", ((1, 4, 4),)), ("_l1k8v4", ((1, 8, 4),)),
                       ("_l1x", ((1, 16, 16),)), ("_l1xk", ((1, 16, 3),)), ("_l1xv", ((1, 4, 16),)),
                       ("_l1v8", ((1, 4, 8),)),
                       *((f"_l1v4_v4l{j}", ((1, 4, 4), (j, 4, 4))) for j in (5, 7, 10, 17, 18, 23)))},
    # k4v3hs with ONE layer exact (leave-one-layer-out): which layers' quantization costs the KL
    **{f"k4v3hs_x{i}": Variant(4, 3, key_group=0, had_values=True, sym_values=True, clip_values=True,
                               clip_keys=True, layer_bits=((i, 16, 16),)) for i in range(30)},
    # ... or one layer's keys / values only exact
    **{f"k4v3hs_xk{i}": Variant(4, 3, key_group=0, had_values=True, sym_values=True, clip_values=True,
                                clip_keys=True, layer_bits=((i, 16, 3),)) for i in range(30)},
    **{f"k4v3hs_xv{i}": Variant(4, 3, key_group=0, had_values=True, sym_values=True, clip_values=True,
                                clip_keys=True, layer_bits=((i, 4, 16),)) for i in range(30)},
    "k3v4_prerope": Variant(3, 4, key_group=0, pre_rope=True),
    "k3v3_hv": Variant(3, 3, key_group=0, had_values=True),
    "k4v2_hv": Variant(4, 2, key_group=0, had_values=True),
}


def tune_questions(data: Path, n: int, k: int, seed: int, split: str) -> list[dict]:
    conversations = json.loads(data.read_text())
    keep = [c for i, c in enumerate(conversations) if (i % 2 == 1) == (split == "tune")]
    return mount_fidelity.sample_questions(keep, n, k, seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--split", choices=["tune", "score"], default="tune")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, tokenizer = load_model(None)
    inv_freq = rotary_inv_freq(model).cpu()
    engines = {"kv": KVEngine(model, tokenizer), "kv_fix": KVEngine(model, tokenizer, fix=FixConfig())}
    enc = engines["kv"]
    questions = tune_questions(args.data, args.questions, args.k, args.seed, args.split)
    names = ["float32", *args.variants]
    entries: dict[str, dict[str, object]] = defaultdict(dict)
    kl: dict[tuple[str, str], list[float]] = defaultdict(list)
    nll: dict[tuple[str, str], list[float]] = defaultdict(list)
    with torch.no_grad():
        for qi, q in enumerate(questions):
            for key, text in q["memories"]:
                if key in entries["float32"]:
                    continue
                e = enc.encode(text)
                entries["float32"][key] = e
                for name in args.variants:
                    kq, vq = VARIANTS[name].apply(e.keys, e.values, e.offset, inv_freq)
                    entries[name][key] = dataclasses.replace(e, keys=kq.contiguous(), values=vq.contiguous())
            texts = dict(q["memories"])
            ref, ids = enc.answer_logits(q["question"], [MemoryItem(k, texts[k]) for k in texts], q["answer"],
                                         mode="text")
            ref_logp = ref.log_softmax(-1)
            target = torch.tensor(ids)
            for name in names:
                for mode, engine in engines.items():
                    items = [MemoryItem(k, texts[k], lambda k=k, n=name: entries[n][k]) for k in texts]
                    logp = engine.answer_logits(q["question"], items, q["answer"], mode="kv" if mode == "kv"
                                                else "kv+fix")[0].log_softmax(-1)
                    kl[name, mode].append((ref_logp.exp() * (ref_logp - logp)).sum(-1).mean().item())
                    nll[name, mode].append(-logp[torch.arange(len(ids)), target].mean().item())
            print(f"q {qi + 1}/{len(questions)} {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    out = {}
    for name in names:
        v = VARIANTS.get(name)
        row = {"bits_per_element_60tok": round(v.bits_per_element(), 3) if v else 32.0,
               "bytes_per_token_60tok": round(v.bytes_per_token()) if v else 46080 + 1400 / 60 + 8}
        for mode in engines:
            row[f"kl_{mode}"] = round(statistics.mean(kl[name, mode]), 5)
            row[f"kl_{mode}_vs_fp32"] = round(statistics.mean(kl[name, mode]) / statistics.mean(kl["float32", mode]), 3)
            row[f"nll_vs_fp32_{mode}"] = round(statistics.mean(nll[name, mode]) / statistics.mean(nll["float32", mode])
                                               - 1, 4)
        out[name] = row
        print(f"{name:>14} {row}", file=sys.stderr)
    print(json.dumps({"benchmark": "kv_codec_variants", "split": args.split, "seed": args.seed,
                      "questions": len(questions), "k": args.k, "elapsed_s": round(time.perf_counter() - t0, 1),
                      "variants": out}))


if __name__ == "__main__":
    main()
