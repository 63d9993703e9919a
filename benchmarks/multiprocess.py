"""Several worker processes remember, recall and forget on shared users of one store; an observer process
measures how soon each write becomes visible to another process (row, vector and, with KV, blob).

    python benchmarks/multiprocess.py --backend embedded|postgres --workers 4 --seconds 60

Phase 1 runs one worker, phase 2 ``--workers`` workers, on fresh stores, side by side in one run:
``throughput_ratio`` = operations per second with N workers / with 1. Every worker logs each entry it stored (after
``remember`` returned) and each one it forgot; at the end the store must hold exactly the stored-minus-forgotten
entries (``lost``: logged but missing a row, vector or blob; ``duplicated``: a row no worker logged, or an id logged
twice), and ``errors`` counts exceptions raised in workers; rows are read with ``list``, vectors with
``stored_vectors`` and blobs checked by ``verify``. The observer polls the newest write of another process with
``recall`` until a hit for it carries a ``dense`` score (the vector index returned it: row and vector both
visible). ``visibility_ms_p95``: from the write (logged once ``remember`` returned) to the start of the first read
that saw it; ``seen_ms_p95``: to the end of that read (its latency, lock waits and query embedding included);
``first_read_share``: how often the first read saw it already (then the delay is only how soon the observer
noticed the write: an upper bound set by its polling, not by the store).
KV is encoded with a tiny random llama (real blobs, fast), so blobs take part.

Last line: {"backend", "workers", "writes", "lost", "duplicated", "errors", "visibility_ms_p95", "throughput_ratio",
"seen_ms_p95", "first_read_share"}
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
USERS = ["u0", "u1", "u2", "u3"]
WORKER_NICENESS = 10


def _open(store: Path, urls: dict[str, str]):
    from agentmem import AgentMemory
    from agentmem.kv.testing import tiny_causal_lm

    # consolidation off: merging near-identical notes would return one id for two writes (storage is measured here)
    return AgentMemory(store, model=tiny_causal_lm("llama", seed=0), kv_encoding="eager", consolidation="off", **urls)


def _ready(mem, start, seconds: float) -> float:
    """Load everything a call needs (embedder, model), wait for every process, return the common end time."""
    mem.recall("warm up", user_id="warmup", k=1)
    mem.load_model()
    start.wait()
    return time.time() + seconds


def worker(n: int, store: Path, urls: dict[str, str], start, seconds: float, log_dir: Path) -> None:
    """remember 60 %, recall 30 %, forget one of its own entries 10 %; log every id stored and forgotten."""
    rng = random.Random(n)
    ops = errors = 0
    mine: list[str] = []
    # the observer is the instrument: on a machine with fewer cores than processes it must not queue behind the
    # workers for a core, or the delay it reports is its own scheduling, not the store's (both phases run niced)
    os.nice(WORKER_NICENESS)
    with _open(store, urls) as mem, open(log_dir / f"w{n}.log", "a") as log:
        until = _ready(mem, start, seconds)
        while time.time() < until:
            user = rng.choice(USERS)
            roll = rng.random()
            try:
                if roll < 0.6 or not mine:
                    tag = f"w{n}x{ops}"
                    rec = mem.remember(f"worker {n} note {ops}: the heron {tag} waded past stone {rng.randrange(50)}",
                                       user_id=user, session_id=f"{user}-w{n}")
                    mine.append(rec.id)
                    log.write(f"+ {rec.id} {user} {time.time():.6f} {tag}\n")
                elif roll < 0.9:
                    mem.recall(f"heron near stone {rng.randrange(50)}", user_id=user, k=5)
                else:
                    victim = mine.pop(rng.randrange(len(mine)))
                    mem.forget(victim)
                    log.write(f"- {victim}\n")
                log.flush()
                ops += 1
            except Exception as exc:  # counted; the run goes on
                errors += 1
                where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in
                                    reversed(traceback.extract_tb(exc.__traceback__)[-6:]))
                print(f"worker {n}: {type(exc).__name__}: {exc} at {where}", file=sys.stderr, flush=True)
    (log_dir / f"w{n}.done").write_text(json.dumps({"ops": ops, "errors": errors}))


class _Tails:
    """The workers' logs read incrementally (re-reading whole files each poll made the observer slow to notice)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.offsets: dict[Path, int] = {}
        self.rest: dict[Path, str] = {}

    def newest_write(self) -> tuple[str, str, float, str] | None:
        """(entry id, user, written at, tag) of the newest write logged since the last call, or None."""
        newest = None
        for f in self.log_dir.glob("w*.log"):
            with open(f) as fh:
                fh.seek(self.offsets.get(f, 0))
                data = self.rest.get(f, "") + fh.read()
                self.offsets[f] = fh.tell()
            *lines, self.rest[f] = data.split("\n")
            for ln in lines:
                parts = ln.split()
                if parts and parts[0] == "+" and (newest is None or float(parts[3]) > newest[2]):
                    newest = (parts[1], parts[2], float(parts[3]), parts[4])
        return newest


def observer(store: Path, urls: dict[str, str], start, seconds: float, log_dir: Path, out: Path) -> None:
    """Poll the newest logged write until this process's ``recall`` finds it with its vector; record the delay."""
    delays: list[float] = []
    lags: list[float] = []  # from the write to the observer picking it up (its own polling, not the store's)
    answered: list[float] = []  # from the write to the end of the read that saw it (that read's latency included)
    attempts: list[int] = []  # reads until one saw it (1: visible at once)
    with _open(store, urls) as mem:
        until = _ready(mem, start, seconds)
        tails = _Tails(log_dir)
        while time.time() < until:
            newest = tails.newest_write()
            if newest is None:
                time.sleep(0.005)
                continue
            entry_id, user, written, tag = newest
            picked = time.time()
            lags.append(picked - written)
            first = time.time()
            deadline = first + 10
            for attempt in itertools.count(1):
                if time.time() >= deadline:
                    break
                began = time.time()
                hits = mem.recall(f"the heron {tag}", user_id=user, k=5)
                # "dense" is in a hit's scores when the vector index returned it: the row and the vector are visible
                if any(h.id == entry_id and "dense" in h.scores for h in hits):
                    # picked up, plus how long after its first read the read that saw it began
                    delays.append(picked - written + began - first)
                    answered.append(picked - written + time.time() - first)
                    attempts.append(attempt)
                    break
                time.sleep(0.005)
    out.write_text(json.dumps({"delays": delays, "lags": lags, "answered": answered, "attempts": attempts}))


def run_phase(workers: int, seconds: float, urls: dict[str, str], base: Path) -> dict:
    store, log_dir = base / "store", base / "logs"
    log_dir.mkdir(parents=True)
    _open(store, urls).close()  # create the store (and its schema) once
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(workers + (1 if workers > 1 else 0))  # the clock starts once every process is loaded
    procs = [ctx.Process(target=worker, args=(n, store, urls, start, seconds, log_dir)) for n in range(workers)]
    obs = ctx.Process(target=observer, args=(store, urls, start, seconds, log_dir, base / "vis.json")) \
        if workers > 1 else None
    for p in procs + ([obs] if obs else []):
        p.start()
    for p in procs + ([obs] if obs else []):
        p.join()
    done = [json.loads((log_dir / f"w{n}.done").read_text()) for n in range(workers)]
    stored, forgotten = [], set()
    for n in range(workers):
        for line in (log_dir / f"w{n}.log").read_text().splitlines():
            kind, entry_id = line.split()[:2]
            (stored.append(entry_id) if kind == "+" else forgotten.add(entry_id))
    expected = set(stored) - forgotten
    with _open(store, urls) as mem:
        rows, complete = set(), set()  # every row; those with their vector and a KV blob named
        for user in USERS:
            records = mem.list(user_id=user)
            with_vector = mem.stored_vectors([r.id for r in records], user_id=user)
            rows |= {r.id for r in records}
            complete |= {r.id for r in records if r.id in with_vector and r.kv is not None}
        check = mem.verify()
    # a row naming a blob the blob store lacks is counted by verify (an upper bound if it also lacks its vector)
    lost = len(expected - complete) + check["rows_missing_blob"]
    duplicated = (len(stored) - len(set(stored))) + len(rows - expected) + check["orphan_vectors"] + check["orphan_blobs"]
    vis = json.loads((base / "vis.json").read_text()) if obs else {"delays": [], "lags": [], "answered": [],
                                                                     "attempts": []}
    return {"ops": sum(d["ops"] for d in done), "errors": sum(d["errors"] for d in done), "writes": len(stored),
            "lost": lost, "duplicated": duplicated, "delays": vis["delays"], "lags": vis["lags"], "seconds": seconds,
            "answered": vis["answered"], "attempts": vis["attempts"]}


def _p50(xs: list[float]) -> float | None:
    return sorted(xs)[len(xs) // 2] if xs else None


def _p95(xs: list[float]) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["embedded", "postgres"], default="embedded")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--single-seconds", type=float, default=None, help="phase 1 length (default: seconds / 2)")
    ap.add_argument("--postgres-url", default=None, help="default: start a throwaway server (tests/servers.py)")
    args = ap.parse_args()
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    server = None
    with tempfile.TemporaryDirectory(prefix="agentmem-mp-") as tmp:
        base = Path(tmp)
        os.chmod(base, 0o755)  # the PostgreSQL server user must reach its data dir
        urls_for = lambda phase: {}  # noqa: E731
        if args.backend == "postgres":
            from tests.servers import create_postgres_database, start_postgres

            url = args.postgres_url
            if url is None:
                server = start_postgres(base / "pg")
            urls_for = lambda phase: {"catalog_url": url or create_postgres_database(server, phase),  # noqa: E731
                                      "vector_url": "pgvector"}
        try:
            single = run_phase(1, args.single_seconds or args.seconds / 2, urls_for("single"), base / "single")
            multi = run_phase(args.workers, args.seconds, urls_for("multi"), base / "multi")
        finally:
            if server is not None:
                server.stop()
    ratio = (multi["ops"] / multi["seconds"]) / max(single["ops"] / single["seconds"], 1e-9)
    p95 = _p95(multi["delays"])
    print(f"1 worker: {single['ops']} ops in {single['seconds']:.0f}s; {args.workers} workers: {multi['ops']} ops, "
          f"{len(multi['delays'])} visibility samples, p50 "
          f"{1000 * sorted(multi['delays'])[len(multi['delays']) // 2] if multi['delays'] else float('nan'):.0f} ms "
          f"(of which the observer's own polling lag: p50 {1000 * (_p50(multi['lags']) or float('nan')):.0f} ms)")
    print(json.dumps({
        "backend": args.backend, "workers": args.workers, "writes": single["writes"] + multi["writes"],
        "lost": single["lost"] + multi["lost"], "duplicated": single["duplicated"] + multi["duplicated"],
        "errors": single["errors"] + multi["errors"],
        "visibility_ms_p95": None if p95 is None else round(1000 * p95, 1), "throughput_ratio": round(ratio, 2),
        "seen_ms_p95": None if not multi["answered"] else round(1000 * _p95(multi["answered"]), 1),
        "first_read_share": None if not multi["attempts"] else
        round(sum(a == 1 for a in multi["attempts"]) / len(multi["attempts"]), 3),
    }))


if __name__ == "__main__":
    main()
