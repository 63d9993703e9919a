"""Benchmark: does a trained KV entry of p tokens stand in for a ~1k-token document?

For each chosen LoCoMo conversation, the document is a stretch of whole sessions of about ``--doc-tokens`` tokens
(lines ``[date] Speaker: text``); the held-out questions are those of categories 1-4 whose evidence turns all lie
in the stretch. Training never sees them: it uses only recall samples made from the document's own lines
("Quote the line … that begins …", answered with the line) and, with ``--samples N``, the model's self-generated
questions and answers (the first recipe: ``--samples 128 --recall-repeat 0``).

Reported per answer token (gold answer as the assistant reply to the question, SmolLM2-135M-Instruct):

* ``none``      preamble only (no memory)
* ``text``      the whole document mounted as text (one entry after the preamble)
* ``untrained`` the real KV of the document's first p tokens (the trained entry's initialisation)
* ``trained``   the trained p-token entry

``recovered = (none - trained) / (none - text)``: the share of the document's benefit that the entry keeps.
Also reported: ``kl_to_text``, the mean KL(text ‖ condition) over the gold answer tokens (full vocabulary), i.e.
how far each condition's predictions are from having the document in context, and
``kl_recovered = 1 - kl_trained / kl_none``.

Run (the stretch is the one holding the most held-out questions; ties go to the earliest):

    .venv/bin/python benchmarks/trained_entry.py --data ../shared/data/locomo/locomo_dev5.json \\
        --doc-tokens 1024 --tokens 64 128

The last stdout line is one JSON object with all numbers. Artifacts (self-study data, checkpoints, prefixes)
go to ``--out``; a rerun resumes interrupted training and reuses finished entries.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentmem.kv.model import load_model  # noqa: E402
from agentmem.train import PromptLayout, TrainedPrefix, TrainOptions, make_data, train_prefix  # noqa: E402
from agentmem.train.cartridge import make_recall_data  # noqa: E402
from agentmem.train.checkpoint import load_state, save_state  # noqa: E402
from agentmem.train.evaluate import answer_logprobs, context_kv, kl, memory_kv, mounted_context, nll  # noqa: E402
from agentmem.train.selfstudy import SelfStudyData  # noqa: E402


def turn_line(date: str, turn: dict) -> str:
    text = turn["text"]
    if turn.get("image_caption"):
        text += f" [shares a photo: {turn['image_caption']}]"
    return f"[{date}] {turn['speaker']}: {text}"


def pick_stretch(conv: dict, count, doc_tokens: int) -> tuple[str, list[dict], dict]:
    """The run of whole turns from a session start, up to ``doc_tokens`` tokens, holding the most held-out QA."""
    turns = [(s["date_time"], t, si) for si, s in enumerate(conv["sessions"]) for t in s["turns"]]
    starts = [i for i, (_, _, si) in enumerate(turns) if i == 0 or turns[i - 1][2] != si]
    sizes = [count(turn_line(d, t)) + 1 for d, t, _ in turns]
    usable = [q for q in conv["qa"] if q.get("category") in (1, 2, 3, 4) and q.get("answer") not in (None, "")
              and q.get("evidence")]
    best = None
    for start in starts:
        end, used = start, 0
        while end < len(turns) and used + sizes[end] <= doc_tokens:
            used += sizes[end]
            end += 1
        ids = {turns[i][1]["dia_id"] for i in range(start, end)}
        qa = [q for q in usable if all(e in ids for e in q["evidence"])]
        if best is None or len(qa) > len(best[2]):
            best = (start, end, qa)
    start, end, qa = best
    doc = "\n".join(turn_line(d, t) for d, t, _ in turns[start:end])
    info = {"first_turn": turns[start][1]["dia_id"], "last_turn": turns[end - 1][1]["dia_id"], "turns": end - start}
    return doc, qa, info


def score(model, layout, context, qa, reference=None) -> tuple[dict, list]:
    """Gold-answer NLL (macro: mean over questions of per-token NLL; micro: pooled) and KL to ``reference``."""
    lps = answer_logprobs(model, layout, context, qa)
    res = mean_nll([nll(lp, ids) for lp, ids in lps])
    if reference is not None:
        res["kl_to_text"] = sum(kl(r, lp) for (r, _), (lp, _) in zip(reference, lps)) / len(lps)
    return res, lps


def gold_logp(lps: list) -> torch.Tensor:
    """Log-prob of every gold answer token, concatenated over questions."""
    return torch.cat([lp.gather(-1, torch.tensor(ids).unsqueeze(1)).squeeze(1) for lp, ids in lps])


def split_by_teacher(text: torch.Tensor, untrained: torch.Tensor, trained: torch.Tensor) -> dict:
    """Where does training move gold-token log-probs? Split by whether the document-in-context beats the init.

    A prefix that imitates the document-in-context teacher gains where the teacher is better than the untrained
    prefix and loses where the untrained prefix happened to be better than the teacher.
    """
    out = {}
    for name, m in (("text_better", text > untrained), ("init_better", text <= untrained)):
        n = int(m.sum())
        out[name] = {"tokens": n,
                     "text_minus_init": round(float((text[m] - untrained[m]).mean()), 4) if n else None,
                     "trained_minus_init": round(float((trained[m] - untrained[m]).mean()), 4) if n else None}
    return out


def cached_data(path: Path, make) -> tuple[SelfStudyData, float, bool]:
    """Training data from ``path`` if there, else ``make()`` saved there; with the seconds it took to make."""
    if path.exists():
        tensors, meta = load_state(path)
        return SelfStudyData.from_tensors(tensors), float(meta["seconds"]), True
    t = time.monotonic()
    data = make()
    seconds = time.monotonic() - t
    save_state(path, data.tensors(), {"seconds": seconds, "load": os.getloadavg()})
    return data, seconds, False


def mean_nll(rows: list[tuple[float, int]]) -> dict:
    per_q = [s / n for s, n in rows]
    return {"macro": sum(per_q) / len(per_q), "micro": sum(s for s, _ in rows) / sum(n for _, n in rows),
            "per_question": [round(x, 4) for x in per_q]}


def recovered(none: float, text: float, x: float) -> float | None:
    return None if abs(none - text) < 1e-9 else (none - x) / (none - text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--doc-tokens", type=int, default=1024)
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--conversations", type=int, nargs="+", default=[0], help="indices into the data file")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--samples", type=int, default=TrainOptions.samples,
                    help="self-generated Q/A conversations (0: none)")
    ap.add_argument("--recall-repeat", type=int, default=TrainOptions.recall_repeat,
                    help="recall samples (one per document line), each this many times (0: none)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--answer-tokens", type=int, default=TrainOptions.answer_tokens,
                    help="cap on self-study answer length (training targets)")
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; 1 because a 2-thread OpenMP team stalls badly on a shared 2-core box")
    ap.add_argument("--out", default=".cache/trained_entry")
    ap.add_argument("--plot", default="docs/trained-entries.png")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    t0 = time.monotonic()
    model, tok = load_model()
    model.requires_grad_(False)
    layout = PromptLayout.for_tokenizer(tok)
    preamble = layout.preamble_ids()
    count = lambda text: len(layout.answer_ids(text, end=False))  # noqa: E731
    opts = TrainOptions(samples=args.samples, batch_size=args.batch_size, answer_tokens=args.answer_tokens,
                        recall_repeat=args.recall_repeat)
    # Artifact names carry every setting that changes them (the first recipe's settings keep the short names).
    variant = "" if args.answer_tokens == 40 else f"-a{args.answer_tokens}"
    if args.recall_repeat:
        variant += f"-n{args.samples}-r{args.recall_repeat}"
    out_dir = Path(args.out)
    data_all = json.load(open(args.data))
    results, curves = [], {}
    for ci in args.conversations:
        conv = data_all[ci]
        cid = conv["conversation_id"]
        doc, qa_items, info = pick_stretch(conv, count, args.doc_tokens)
        qa = [(q["question"], str(q["answer"])) for q in qa_items]
        doc_ids = layout.document_ids(doc)
        print(f"conversation {cid}: {len(doc_ids)} document tokens ({info['first_turn']}..{info['last_turn']}), "
              f"{len(qa)} held-out questions", file=sys.stderr)
        text_res, text_lps = score(model, layout, context_kv(model, preamble, doc_ids), qa)
        base = {"none": score(model, layout, context_kv(model, preamble), qa, text_lps)[0], "text": text_res}
        conv_dir = out_dir / f"conv{cid}-d{args.doc_tokens}-s{args.seed}"
        parts, data_seconds, data_reused = [], 0.0, True
        if args.samples:  # self-generated Q/A: the expensive part, cached (and shared with the first recipe)
            qa_variant = "" if args.answer_tokens == 40 else f"-a{args.answer_tokens}"
            qa_opts = TrainOptions(samples=args.samples, answer_tokens=args.answer_tokens, recall_repeat=0)
            part, secs, reused = cached_data(conv_dir / f"selfstudy-n{args.samples}{qa_variant}.safetensors",
                                             lambda: make_data(model, layout, doc, seed=args.seed, options=qa_opts,
                                                               progress=not args.no_progress))
            parts.append(part)
            data_seconds, data_reused = data_seconds + secs, data_reused and reused
        if args.recall_repeat:  # one teacher-forced pass per 8 lines: seconds
            part, secs, reused = cached_data(conv_dir / f"recall-k{opts.recall_key_words}-t{opts.recall_tokens}"
                                                        f".safetensors",
                                             lambda: make_recall_data(model, layout, doc, options=opts))
            parts.append(part.repeat(args.recall_repeat))
            data_seconds, data_reused = data_seconds + secs, data_reused and reused
        data = parts[0] if len(parts) == 1 else SelfStudyData.concat(parts, tok.pad_token_id or 0)
        print(f"  training data: {len(data)} samples, {data_seconds:.0f} s", file=sys.stderr)
        row = {"conversation": cid, "document_tokens": len(doc_ids), "questions": len(qa), "stretch": info,
               "nll": {k: round(v["macro"], 4) for k, v in base.items()},
               "nll_micro": {k: round(v["micro"], 4) for k, v in base.items()},
               "kl_to_text_none": round(base["none"]["kl_to_text"], 4),
               "nll_per_question": {k: v["per_question"] for k, v in base.items()},
               "selfstudy_seconds": round(data_seconds, 1), "selfstudy_reused": data_reused, "entries": []}
        for p in args.tokens:
            untrained = TrainedPrefix(*memory_kv(model, preamble, doc_ids[:p]), doc_ids[:p], len(preamble))
            tag = f"p{p}-steps{args.steps}-lr{args.lr}{variant}"
            entry_path = conv_dir / f"entry-{tag}.safetensors"
            if entry_path.exists():
                tp = TrainedPrefix.from_bytes(entry_path.read_bytes())
            else:
                tp = train_prefix(model, tok, doc, tokens=p, steps=args.steps, seed=args.seed, lr=args.lr,
                                  options=opts, data=data, progress=not args.no_progress,
                                  checkpoint_path=conv_dir / f"ckpt-{tag}.safetensors")
                entry_path.write_bytes(tp.to_bytes())
            nll_u, lps_u = score(model, layout, mounted_context(model, preamble, *untrained.kv()), qa, text_lps)
            nll_t, lps_t = score(model, layout, mounted_context(model, preamble, *tp.kv()), qa, text_lps)
            none, text = base["none"]["macro"], base["text"]["macro"]
            train_s = tp.record["wall_seconds"]
            entry = {
                "tokens": p, "compression": round(len(doc_ids) / p, 2),
                "nll_untrained": round(nll_u["macro"], 4), "nll_trained": round(nll_t["macro"], 4),
                "nll_micro_untrained": round(nll_u["micro"], 4), "nll_micro_trained": round(nll_t["micro"], 4),
                "recovered_untrained": round(recovered(none, text, nll_u["macro"]), 4),
                "recovered": round(recovered(none, text, nll_t["macro"]), 4),
                "recovered_micro": round(recovered(base["none"]["micro"], base["text"]["micro"], nll_t["micro"]), 4),
                "kl_to_text_untrained": round(nll_u["kl_to_text"], 4),
                "kl_to_text_trained": round(nll_t["kl_to_text"], 4),
                "kl_recovered_untrained": round(1 - nll_u["kl_to_text"] / base["none"]["kl_to_text"], 4),
                "kl_recovered": round(1 - nll_t["kl_to_text"] / base["none"]["kl_to_text"], 4),
                "gold_token_logp_shift": split_by_teacher(gold_logp(text_lps), gold_logp(lps_u), gold_logp(lps_t)),
                "nll_per_question_untrained": nll_u["per_question"],
                "nll_per_question_trained": nll_t["per_question"],
                "steps": tp.record["steps"], "train_seconds": train_s,
                "entry_seconds": round(train_s + data_seconds, 1),  # what one mem.train() call costs end to end
                "final_loss": tp.record["losses"][-1] if tp.record["losses"] else None,
            }
            row["entries"].append(entry)
            curves[f"conv {cid}, p={p}"] = tp.record["losses"]
            print(f"  p={p}: " + json.dumps(entry), file=sys.stderr)
        results.append(row)

    _plot(curves, args.plot)
    summary = {
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, fp32)",
        "doc_tokens_target": args.doc_tokens, "steps": args.steps, "samples": args.samples,
        "recall_repeat": args.recall_repeat,
        "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed, "threads": args.threads,
        "top_k": opts.top_k, "chunk_tokens": opts.chunk_tokens, "answer_tokens": opts.answer_tokens,
        "question_tokens": opts.question_tokens, "temperature": opts.temperature,
        "loadavg_start": [round(x, 2) for x in load_start], "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "wall_seconds_total": round(time.monotonic() - t0, 1),
        "conversations": results,
    }
    for p in args.tokens:  # pooled over conversations: every question weighs the same
        per = {k: [] for k in ("none", "text", "untrained", "trained", "kl_none", "kl_untrained", "kl_trained")}
        for row in results:
            e = next(x for x in row["entries"] if x["tokens"] == p)
            per["none"] += [row["nll"]["none"]] * row["questions"]
            per["text"] += [row["nll"]["text"]] * row["questions"]
            per["untrained"] += [e["nll_untrained"]] * row["questions"]
            per["trained"] += [e["nll_trained"]] * row["questions"]
            per["kl_none"] += [row["kl_to_text_none"]] * row["questions"]
            per["kl_untrained"] += [e["kl_to_text_untrained"]] * row["questions"]
            per["kl_trained"] += [e["kl_to_text_trained"]] * row["questions"]
        m = {k: sum(v) / len(v) for k, v in per.items()}
        summary[f"p{p}"] = {**{(k if k.startswith("kl") else f"nll_{k}"): round(v, 4) for k, v in m.items()},
                            "recovered": round(recovered(m["none"], m["text"], m["trained"]), 4),
                            "recovered_untrained": round(recovered(m["none"], m["text"], m["untrained"]), 4),
                            "kl_recovered": round(1 - m["kl_trained"] / m["kl_none"], 4),
                            "kl_recovered_untrained": round(1 - m["kl_untrained"] / m["kl_none"], 4),
                            "max_entry_seconds": max(next(x for x in r["entries"] if x["tokens"] == p)["entry_seconds"]
                                                     for r in results)}
    print(json.dumps(summary))


def _plot(curves: dict[str, list[float]], path: str) -> None:
    if not curves or not path:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, losses in curves.items():
        ax.plot(range(1, len(losses) + 1), losses, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("distillation KL (nats/token)")
    ax.set_title("Trained KV entry: self-study loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
