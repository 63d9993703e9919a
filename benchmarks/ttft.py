"""Time to first token: memories mounted as stored KV vs the same memories re-encoded as text.

Both modes run side by side in one process, alternating, on the same token ids (SmolLM2-135M on CPU by
default). Memories are LoCoMo turns (or synthetic text without the data file), grouped into entries of about
``--entry-tokens`` tokens, stored as KV blob files and mapped back per call, so "load" includes opening and
mapping the file and the safetensors header parse; the page-ins happen during the mount, which copies the data.
Reported per size: median TTFT of each mode, the speedup, the share of KV TTFT spent on
load and mount (re-rotation + placement), and the ceiling (text TTFT over the bare suffix prefill).

    python benchmarks/ttft.py --memory-tokens 256 512 1024 2048

Last line: {"sizes": {"2048": {"kv_ttft_s": ..., "text_ttft_s": ..., "speedup": ..., "mount_share": ...}}, ...}
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentmem.kv import KVEngine, MemoryItem, load_model  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared/data/locomo/locomo_dev5.json"
QUESTION = "What did Caroline say about the adoption agencies she was researching?"


class EngineBackend:
    """The engine driven directly, blobs in files. To benchmark through the facade instead, swap this class for
    one with the same two methods over ``AgentMemory(path, model=(model, tokenizer))``: ``add`` = ``remember``
    each text, ``answer`` = ``mem.generate(question, user_id=..., k=len(ids), mode=mode, max_new_tokens=1)``."""

    def __init__(self, model, tokenizer, workdir: Path) -> None:
        self.engine = KVEngine(model, tokenizer)
        self.dir = workdir
        self.texts: dict[str, str] = {}

    def add(self, texts: list[str]) -> list[str]:
        ids = []
        for start in tqdm(range(0, len(texts), 8), desc="encoding memories", unit="batch", disable=None):
            chunk = texts[start : start + 8]
            for text, entry in zip(chunk, self.engine.encode_many(chunk)):
                mid = f"m{len(self.texts):05d}"
                (self.dir / f"{mid}.kv").write_bytes(self.engine.to_bytes(entry))
                self.texts[mid] = text
                ids.append(mid)
        return ids

    def answer(self, question: str, ids: list[str], mode: str):
        def loader(mid: str):
            def load():
                # Map the file instead of reading it: decoding is zero-copy, so the page cache feeds the mount
                # directly and no fresh 8 MB buffer per entry has to be allocated and faulted in.
                with open(self.dir / f"{mid}.kv", "rb") as f:
                    return self.engine.from_bytes(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))

            return load

        items = [MemoryItem(mid, self.texts[mid], loader(mid)) for mid in ids]
        return self.engine.generate(question, items, mode=mode, max_new_tokens=1, budget_tokens=1 << 30)

    def tokens(self, text: str) -> int:
        return len(self.engine.layout.entry_ids(text))


def memory_texts(data: Path | None) -> list[str]:
    if data is not None and data.exists():
        lines = []
        for conv in json.loads(data.read_text()):
            for session in conv["sessions"]:
                for turn in session["turns"]:
                    lines.append(f"[{session['date_time']}] {turn['speaker']}: {turn['text']}")
        return lines
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()
    return [" ".join(words[(i * 7 + j) % len(words)] for j in range(24)) + "." for i in range(4000)]


def group(lines: list[str], backend: EngineBackend, entry_tokens: int, total: int) -> list[str]:
    """Join consecutive lines into entries of about ``entry_tokens`` tokens until ``total`` tokens."""
    entries, current, used = [], [], 0
    for line in lines:
        current.append(line)
        text = "\n".join(current)
        n = backend.tokens(text)
        if n >= entry_tokens:
            if used + n > total:
                break
            entries.append(text)
            used += n
            current = []
    return entries


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memory-tokens", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--entry-tokens", type=int, default=128, help="approximate size of one memory entry")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--model", default=None, help="local HF model dir (default: embedded SmolLM2)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--plot", type=Path, default=None, help="save a PNG plot here (e.g. docs/kv-ttft.png)")
    ap.add_argument(
        "--threads", type=int, default=None,
        help="torch intra-op threads (default: torch's choice). On an oversubscribed CPU, 1 avoids OpenMP barrier "
        "stalls of a scheduler tick per op, which hit the many small ops of KV mode hardest",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = load_model(args.model, device=args.device)
    with tempfile.TemporaryDirectory() as tmp:
        backend = EngineBackend(model, tokenizer, Path(tmp))
        entries = group(memory_texts(args.data), backend, args.entry_tokens, max(args.memory_tokens))
        ids = backend.add(entries)
        sizes: dict[str, dict] = {}
        for size in args.memory_tokens:
            chosen, used = [], 0
            for mid, text in zip(ids, entries):
                n = backend.tokens(text)
                if used + n > size:
                    break
                chosen.append(mid)
                used += n
            runs: dict[str, list[dict]] = {"kv": [], "text": []}
            for rep in tqdm(range(args.repeats + 1), desc=f"{size} tokens", unit="rep", disable=None):
                for mode in ("kv", "text") if rep % 2 == 0 else ("text", "kv"):  # alternate order against drift
                    result = backend.answer(QUESTION, chosen, mode)
                    assert result.mounted == chosen and not result.fallbacks, "benchmark must mount everything"
                    if rep > 0:  # the first round warms caches and the workspace
                        runs[mode].append(result.timings)

            def med(mode: str, key: str) -> float:
                return statistics.median(t[key] for t in runs[mode])

            kv, text = med("kv", "ttft"), med("text", "ttft")
            sizes[str(size)] = {
                "entries": len(chosen),
                "memory_tokens": used,
                "kv_ttft_s": round(kv, 4),
                "text_ttft_s": round(text, 4),
                "speedup": round(text / kv, 2),
                "kv_load_s": round(med("kv", "load"), 4),
                "kv_mount_s": round(med("kv", "mount"), 4),
                "kv_prefill_s": round(med("kv", "prefill"), 4),
                "mount_share": round((med("kv", "load") + med("kv", "mount")) / kv, 4),
                "ceiling_speedup": round(text / med("kv", "prefill"), 2),
            }
            print(json.dumps({size: sizes[str(size)]}), file=sys.stderr)

    if args.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        xs = [int(s) for s in sizes]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(xs, [sizes[str(x)]["text_ttft_s"] for x in xs], "o-", label="text (re-encode)")
        ax.plot(xs, [sizes[str(x)]["kv_ttft_s"] for x in xs], "o-", label="kv (mounted)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("memory tokens")
        ax.set_ylabel("time to first token (s)")
        ax.set_title(f"TTFT, {type(model).__name__} on {args.device}")
        ax.legend()
        fig.tight_layout()
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=120)

    print(
        json.dumps(
            {
                "benchmark": "ttft",
                "device": args.device,
                "threads": torch.get_num_threads(),
                "load_avg_1m": round(os.getloadavg()[0], 2),
                "repeats": args.repeats,
                "entry_tokens": args.entry_tokens,
                "sizes": sizes,
            }
        )
    )


if __name__ == "__main__":
    main()
