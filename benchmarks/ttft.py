"""Time to first token: memories mounted as stored KV vs the same memories re-encoded as text.

Both modes run side by side in one process, alternating, on the same token ids (SmolLM2-135M on CPU by
default). Memories are LoCoMo turns (or synthetic text without the data file), grouped into entries of about
``--entry-tokens`` tokens, stored as KV blob files and opened per call (memory-mapped, zero-copy; ``--file-read
read`` reads each into a buffer kept per blob instead), so "load" includes opening the file and the safetensors decode
and "mount" reads the KV from the page cache (``--source memory`` keeps the blob bytes in RAM instead).
Retrieval is part of both modes' TTFT (``--retrieval-lines``, default 2,000): a real ``AgentMemory.recall`` of as
many entries as are mounted, over a store holding that many memory lines, is timed before each answer; the mounted
set itself stays fixed so both modes mount exactly the same tokens.
Reported per size: median TTFT of each mode (retrieval included), the speedup, the share of KV TTFT spent on
load and mount (re-rotation + placement), and the ceiling (text TTFT over the bare suffix prefill).

    python benchmarks/ttft.py --memory-tokens 256 512 1024 2048
    python benchmarks/ttft.py --memory-tokens 2048 --background-load 1   # one busy neighbour process

Threads: by default agentmem's policy (``agentmem.kv.device.default_threads``: half the usable CPUs per worker),
as ``AgentMemory`` applies it; ``--threads N`` overrides, ``--threads 0`` leaves torch's own default (every core).
``--background-load N`` runs N CPU-bound processes (a busy Python loop each) beside the benchmark for its whole
duration, the contention a shared host or a multi-worker server sees.

Last line: {"sizes": {"2048": {"kv_ttft_s": ..., "text_ttft_s": ..., "speedup": ..., "mount_share": ...}}, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentmem.kv import KVEngine, MemoryItem, codec, load_model  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared/data/locomo/locomo_dev5.json"
QUESTION = "What did Caroline say about the adoption agencies she was researching?"


class EngineBackend:
    """The engine driven directly, blobs in files; :class:`FacadeBackend` has the same methods over the facade."""

    def __init__(
        self, model, tokenizer, workdir: Path, source: str = "file", kv_dtype: str = "float32", file_read: str = "mmap"
    ) -> None:
        self.engine = KVEngine(model, tokenizer, codec=kv_dtype)  # any stored-KV codec (agentmem.kv.quant.CODECS)
        self.dir = workdir
        self.source = source  # "file": blob files opened per call; "memory": blobs kept as bytes (a RAM tier)
        self.file_read = file_read  # "mmap": mapped, zero-copy; "read": read into a buffer kept per blob
        self.texts: dict[str, str] = {}
        self.blobs: dict[str, bytes] = {}
        self.buffers: dict[str, bytearray] = {}

    def add(self, texts: list[str]) -> list[str]:
        ids = []
        for start in tqdm(range(0, len(texts), 8), desc="encoding memories", unit="batch", disable=None):
            chunk = texts[start : start + 8]
            for text, entry in zip(chunk, self.engine.encode_many(chunk)):
                mid = f"m{len(self.texts):05d}"
                blob = self.engine.to_bytes(entry)
                (self.dir / f"{mid}.kv").write_bytes(blob)
                if self.source == "memory":
                    self.blobs[mid] = blob
                self.texts[mid] = text
                ids.append(mid)
        return ids

    def answer(self, question: str, ids: list[str], mode: str):
        def loader(mid: str):
            path = str(self.dir / f"{mid}.kv")

            def load():
                if self.source == "memory":
                    return self.engine.from_bytes(self.blobs[mid], cast=False)
                if self.file_read == "mmap":  # page-cache pages mapped, nothing copied until the mount places it
                    return self.engine.from_bytes(codec.map_file(path), cast=False)
                # Read into a buffer kept per blob across calls: decoding is zero-copy, and no fresh multi-MB buffer
                # is allocated and faulted in per load. (Not one buffer for all blobs: the engine places every
                # entry only once all are loaded.)
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    buffer = self.buffers.get(mid)
                    if buffer is None or len(buffer) != size:
                        buffer = self.buffers[mid] = bytearray(size)
                    view = memoryview(buffer)
                    f.readinto(view)
                return self.engine.from_bytes(view, cast=False)

            return load

        items = [MemoryItem(mid, self.texts[mid], loader(mid)) for mid in ids]
        return self.engine.generate(question, items, mode=mode, max_new_tokens=1, budget_tokens=1 << 30)

    def tokens(self, text: str) -> int:
        return len(self.engine.layout.entry_ids(text))


class FacadeBackend:
    """The same two calls through the public facade: ``remember_many`` then ``generate(entry_ids=...)``.

    Retrieval is bypassed (``entry_ids``) so both modes mount exactly the chosen memories; blobs are whatever the
    store writes (its ``kv_dtype``, encryption if configured), read by its own loader.
    """

    def __init__(self, model, tokenizer, workdir: Path, kv_dtype: str = "float32", threads: int | None = None,
                 prefix_cache: bool = True) -> None:
        from agentmem import AgentMemory

        # threads=None: the store applies agentmem's policy when it loads the model, as a user's store would
        self.mem = AgentMemory(workdir / "store", model=(model, tokenizer), kv_codec=kv_dtype, kv_encoding="eager",
                               threads=threads, prefix_cache=prefix_cache)
        self.counter = EngineBackend(model, tokenizer, workdir)  # only for token counts

    def add(self, texts: list[str]) -> list[str]:
        records = self.mem.remember_many([{"text": t, "user_id": "bench"} for t in texts])
        return [r.id for r in records]

    def answer(self, question: str, ids: list[str], mode: str):
        return self.mem.generate(
            question, user_id="bench", entry_ids=ids, mode=mode, max_new_tokens=1, budget_tokens=1 << 30
        )

    def tokens(self, text: str) -> int:
        return self.counter.tokens(text)


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
    """Join consecutive lines into entries of at most ~``entry_tokens`` tokens, about ``total`` tokens in all."""
    entries, current, used = [], [], 0
    for line in lines:
        if current and backend.tokens("\n".join(current + [line])) > entry_tokens:
            entries.append("\n".join(current))
            used += backend.tokens(entries[-1])
            current = []
            if used >= total:
                break
        current.append(line)
    return entries


def fill(entries: list[str], ids: list[str], backend: EngineBackend, size: int) -> tuple[list[str], int]:
    """First-fit: entries in order that keep the total within ``size`` tokens."""
    chosen, used = [], 0
    for mid, text in zip(ids, entries):
        n = backend.tokens(text)
        if used + n <= size:
            chosen.append(mid)
            used += n
    return chosen, used


class Retrieval:
    """A real store of memory lines, recalled (and timed) before each answer, as ``generate`` would."""

    def __init__(self, workdir: Path, lines: list[str]) -> None:
        from agentmem import AgentMemory

        self.mem = AgentMemory(workdir / "retrieval", kv_encoding="off")
        for start in tqdm(range(0, len(lines), 256), desc="filling the retrieval store", disable=None):
            self.mem.remember_many([{"text": t, "user_id": "bench"} for t in lines[start : start + 256]])

    def timed_recall(self, question: str, k: int) -> float:
        t = time.perf_counter()
        self.mem.recall(question, user_id="bench", k=k)
        return time.perf_counter() - t


def _spin() -> None:
    """A CPU-bound neighbour: a busy loop until terminated."""
    n = 0
    while True:
        n = (n * 1103515245 + 12345) & 0xFFFFFFFF


def start_background_load(n: int) -> list:
    """Start ``n`` busy neighbour processes; stop them with :func:`stop_background_load`."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_spin, daemon=True, name=f"ttft-load-{i}") for i in range(n)]
    for p in procs:
        p.start()
    return procs


def stop_background_load(procs: list) -> None:
    for p in procs:  # only the processes this run started, by their own handles
        p.terminate()
    for p in procs:
        p.join(timeout=5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memory-tokens", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--entry-tokens", type=int, default=128, help="approximate size of one memory entry")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--model", default=None, help="local HF model dir (default: embedded SmolLM2)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--torch-dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                    help="the model's dtype; auto is MemoryConfig's default (agentmem/kv/device.py)")
    ap.add_argument("--plot", type=Path, default=None, help="save a PNG plot here (e.g. docs/kv-ttft.png)")
    ap.add_argument("--with-fix", action="store_true", help="also time mode kv+fix (default strategy)")
    ap.add_argument(
        "--backend", choices=["engine", "facade"], default="engine",
        help="drive KVEngine directly (blob files read here) or the public AgentMemory facade",
    )
    ap.add_argument("--kv-dtype", default="float32", choices=sorted(codec.CODECS), help="stored KV codec")
    ap.add_argument(
        "--source", choices=["file", "memory"], default="file",
        help="where stored KV come from: blob files mapped per call, or blob bytes already in RAM (a hot tier)",
    )
    ap.add_argument(
        "--file-read", choices=["mmap", "read"], default="mmap",
        help="--source file: map each blob file (zero-copy, codec.map_file) or read it into a buffer kept per blob",
    )
    ap.add_argument(
        "--threads", type=int, default=None,
        help="torch intra-op threads (default: agentmem's policy, as AgentMemory applies it; 0: torch's own default). "
        "On an oversubscribed CPU, fewer threads avoid OpenMP barrier stalls of a scheduler tick per op",
    )
    ap.add_argument("--background-load", type=int, default=0, help="CPU-bound neighbour processes to run beside")
    ap.add_argument(
        "--retrieval-lines", type=int, default=2000,
        help="memory lines in the store recalled before each answer (0: leave retrieval out of TTFT)",
    )
    ap.add_argument("--no-prefix-cache", action="store_true",
                    help="facade: text mode prefills the preamble every time (MemoryConfig.prefix_cache=False)")
    args = ap.parse_args()
    # --threads 0 keeps torch's own default (every core); the store is then told that count explicitly
    args.threads_in_use = torch.get_num_threads() if args.threads == 0 else args.threads
    if args.threads != 0:
        from agentmem.kv.device import apply_threads

        apply_threads(args.threads)
    neighbours = start_background_load(args.background_load)
    try:
        sizes, lines, model = run(args)
    finally:
        stop_background_load(neighbours)
    report(args, sizes, lines, model)


def run(args: argparse.Namespace) -> tuple[dict[str, dict], list[str], object]:
    """Encode, store and time every size; returns the per-size results."""
    model, tokenizer = load_model(args.model, device=args.device, dtype=args.torch_dtype)
    with tempfile.TemporaryDirectory() as tmp:
        if args.backend == "facade":
            backend = FacadeBackend(model, tokenizer, Path(tmp), args.kv_dtype, threads=args.threads_in_use,
                                    prefix_cache=not args.no_prefix_cache)
        else:
            backend = EngineBackend(model, tokenizer, Path(tmp), args.source, args.kv_dtype, args.file_read)
        lines = memory_texts(args.data)
        entries = group(lines, backend, args.entry_tokens, max(args.memory_tokens))
        ids = backend.add(entries)
        retrieval = Retrieval(Path(tmp), lines[: args.retrieval_lines]) if args.retrieval_lines > 0 else None
        sizes: dict[str, dict] = {}
        for size in args.memory_tokens:
            chosen, used = fill(entries, ids, backend, size)
            modes = ["kv", "text"] + (["kv+fix"] if args.with_fix else [])
            runs: dict[str, list[dict]] = {m: [] for m in modes}
            for rep in tqdm(range(args.repeats + 1), desc=f"{size} tokens", unit="rep", disable=None):
                for mode in modes if rep % 2 == 0 else modes[::-1]:  # alternate the order against drift
                    retrieve = retrieval.timed_recall(QUESTION, len(chosen)) if retrieval is not None else 0.0
                    result = backend.answer(QUESTION, chosen, mode)
                    assert result.mounted == chosen and not result.fallbacks, "benchmark must mount everything"
                    if rep > 0:  # the first round warms caches and the workspace
                        timings = dict(result.timings)
                        timings["retrieve"] = timings.get("retrieve", 0.0) + retrieve
                        timings["ttft"] += retrieve
                        runs[mode].append(timings)

            def med(mode: str, key: str) -> float:
                return statistics.median(t[key] for t in runs[mode])

            kv, text = med("kv", "ttft"), med("text", "ttft")
            sizes[str(size)] = {
                "entries": len(chosen),
                "memory_tokens": used,
                "kv_ttft_s": round(kv, 4),
                "text_ttft_s": round(text, 4),
                "kv_retrieve_s": round(med("kv", "retrieve"), 4),
                "speedup": round(text / kv, 2),
                "kv_load_s": round(med("kv", "load"), 4),
                "kv_mount_s": round(med("kv", "mount"), 4),
                "kv_prefill_s": round(med("kv", "prefill"), 4),
                "mount_share": round((med("kv", "load") + med("kv", "mount")) / kv, 4),
                "ceiling_speedup": round(text / med("kv", "prefill"), 2),
            }
            if args.with_fix:
                fix = med("kv+fix", "ttft")
                sizes[str(size)].update(kv_fix_ttft_s=round(fix, 4), kv_fix_speedup=round(text / fix, 2))
            print(json.dumps({size: sizes[str(size)]}), file=sys.stderr)
    return sizes, lines, model


def report(args: argparse.Namespace, sizes: dict[str, dict], lines: list[str], model: object) -> None:
    """Plot (optional) and print the last JSON line."""
    if args.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        xs = [int(s) for s in sizes]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(xs, [sizes[str(x)]["text_ttft_s"] for x in xs], "o-", label="text (re-encode)")
        ax.plot(xs, [sizes[str(x)]["kv_ttft_s"] for x in xs], "o-", label="kv (mounted)")
        if args.with_fix:
            ax.plot(xs, [sizes[str(x)]["kv_fix_ttft_s"] for x in xs], "o--", label="kv+fix")
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
                "backend": args.backend,
                "source": args.source if args.backend == "engine" else "store",
                "file_read": args.file_read if (args.backend, args.source) == ("engine", "file") else None,
                "kv_dtype": args.kv_dtype,
                "torch_dtype": str(model.dtype).removeprefix("torch."),
                "threads": torch.get_num_threads(),
                "threads_policy": "torch default" if args.threads == 0 else "given" if args.threads else "agentmem",
                "background_load": args.background_load,
                "cpus": os.cpu_count(),
                "load_avg_1m": round(os.getloadavg()[0], 2),
                "repeats": args.repeats,
                "entry_tokens": args.entry_tokens,
                "retrieval_lines": min(args.retrieval_lines, len(lines)),
                "sizes": sizes,
            }
        )
    )


if __name__ == "__main__":
    main()
