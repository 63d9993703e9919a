"""Reliability report: crash safety, concurrency, secrets, verified erasure. Public API only.

    python benchmarks/reliability.py [--kills 50] [--store DIR]

1. kills: a writer process (KV encoded with a tiny model, so blobs hit the disk) is SIGKILLed at a random
   moment of its remember loop, N times; after each kill the store is reopened (which reconciles) and every
   entry the writer had reported stored must be intact: row, vector and KV blob; no orphan may remain.
2. concurrency: 8 threads here and 2 writer processes remember and recall on one store at once.
3. secrets: messages with planted credentials are remembered; the store's files are scanned for them.
4. erasure: >100 entries of one user carry unique markers; forget(user_id=...) then every file of the store
   is scanned byte by byte for the markers; the other user's entries must be untouched.

Last line: {"kills": N, "lost": 0, "orphans": 0, "concurrent_errors": 0, "planted_secrets_stored": 0,
            "erase_residue": 0, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from tqdm import tqdm

from agentmem import AgentMemory
from agentmem.kv.testing import tiny_causal_lm
from agentmem.security import scan_tree_for_markers

WRITER = Path(__file__).with_name("_writer.py")
# Credentials in the shapes real ones have (random, never valid anywhere).
PLANTED = {
    "openai": "sk-proj-" + "Zq3" * 16,
    "aws": "AKIA" + "QW7RZ2KD5XJ4NB6M",
    "github": "ghp_" + "aB3dE5fG7hJ9kL1mN2pQ4rS6tU8vW0xY2z4A",
    "private_key": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7abc123def456ghi789\n-----END RSA PRIVATE KEY-----",
    "password": "password=Tr0ub4dor&3xyz",
    "card": "4111 1111 1111 1111",
}


def _writer(store: Path, report: Path, user: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WRITER), str(store), str(report), "--user", user, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _reported(report: Path) -> list[str]:
    if not report.exists():
        return []
    # the last line may be torn by the kill: only complete lines count as reported
    return [line for line in report.read_text().split("\n")[:-1] if line]


def crash_loop(store: Path, kills: int, rng: random.Random) -> dict[str, int]:
    lost = orphans = reconciled = 0
    report = store.parent / "reported.txt"
    for _ in tqdm(range(kills), desc="kill -9 writers", disable=None):
        before = len(_reported(report))
        proc = _writer(store, report, "crash", "--tiny-model", "--count", "100000")
        deadline = time.time() + 120
        while len(_reported(report)) == before and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)  # wait until it is really writing, then kill it at a random point
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        with AgentMemory(store, model=tiny_causal_lm("llama", seed=0)) as mem:  # opening reconciles
            check = mem.verify()
            orphans += check["orphan_vectors"] + check["orphan_blobs"] + check["rows_missing_vector"]
            orphans += check["rows_missing_blob"]
            for entry_id in _reported(report):
                try:
                    rec = mem.get(entry_id)
                    if rec.kv is None:
                        lost += 1
                except Exception:
                    lost += 1
        reconciled += 1
    return {"kills": kills, "lost": lost, "orphans": orphans, "reported_entries": len(_reported(report))}


def concurrency(store: Path) -> dict[str, int]:
    errors: list[str] = []
    procs = [_writer(store, store.parent / f"conc{p}.txt", f"proc{p}", "--count", "30", "--recall") for p in range(2)]
    with AgentMemory(store) as mem:
        def work(n: int) -> None:
            for i in range(15):
                try:
                    mem.remember(f"thread {n} remembers item {i}", user_id=f"thread{n}", session_id="s")
                    mem.recall(f"item {i}", user_id=f"thread{n}", k=3)
                except Exception as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for p in procs:
        out, err = p.communicate(timeout=600)
        errors += [line for line in err.splitlines() if line.startswith("ERROR")]
        if p.returncode != 0:
            errors.append(f"exit {p.returncode}")
    for message in sorted(set(errors))[:10]:  # what went wrong, once each (memory text never appears in these)
        print(f"concurrency error: {message[:300]}", file=sys.stderr, flush=True)
    return {"concurrent_errors": len(errors), "concurrent_writes": 8 * 15 + 2 * 30}


def secrets_check(store: Path) -> dict[str, int]:
    with AgentMemory(store, model=tiny_causal_lm("llama", seed=0), kv_encoding="eager") as mem:
        for kind, secret in PLANTED.items():
            mem.remember(f"here is my {kind}: {secret} keep it safe", user_id="sec")
        mem.remember_messages([{"role": "tool", "content": f"config dump {PLANTED['openai']}", "name": "env"}],
                              user_id="sec")
    needles = [s.encode() for s in PLANTED.values()] + [PLANTED["private_key"].splitlines()[1].encode()]
    hits = scan_tree_for_markers(store, needles)
    return {"planted_secrets": len(PLANTED), "planted_secrets_stored": sum(len(v) for v in hits.values())}


def erasure(store: Path) -> dict[str, int]:
    markers = [f"zq{uuid.uuid4().hex[:12]}marker" for _ in range(120)]
    with AgentMemory(store, model=tiny_causal_lm("llama", seed=0), kv_encoding="eager") as mem:
        mem.remember_many([dict(text=f"my code word is {m}", user_id="victim", session_id=f"v{i % 4}",
                                tags=["codes"]) for i, m in enumerate(markers)])
        keep = mem.remember("the other user's fact stays", user_id="bystander")
        erased = mem.forget(user_id="victim")
        bystander_ok = [r.id for r in mem.list(user_id="bystander")] == [keep.id]
    hits = scan_tree_for_markers(store, [m.encode() for m in markers])
    return {"erased": erased, "erase_residue": sum(len(v) for v in hits.values()),
            "bystander_untouched": int(bystander_ok)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    result: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for part in ("crash", "conc", "sec", "erase"):
            (root / part).mkdir()
        t0 = time.time()
        result.update(crash_loop(root / "crash" / "store", args.kills, rng))
        result.update(concurrency(root / "conc" / "store"))
        result.update(secrets_check(root / "sec" / "store"))
        result.update(erasure(root / "erase" / "store"))
        result["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
