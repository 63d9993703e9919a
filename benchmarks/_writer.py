"""Child process for crash and concurrency checks: remembers (and recalls) in a loop, reporting each stored id.

    python benchmarks/_writer.py STORE REPORT_FILE --user u --count 1000 [--tiny-model] [--recall]

Each id is appended to REPORT_FILE (and fsynced) only after ``remember`` returned: the parent may then
kill this process at any point and check that every reported entry is intact.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("report")
    ap.add_argument("--user", default="u")
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--tiny-model", action="store_true", help="encode KV with a tiny random model (blobs on disk)")
    ap.add_argument("--recall", action="store_true", help="also recall after each write")
    args = ap.parse_args()

    from agentmem import AgentMemory

    kwargs: dict = {"consolidation": "off"}  # templated writes: every one must land as its own row
    if args.tiny_model:
        from agentmem.kv.testing import tiny_causal_lm

        kwargs.update(model=tiny_causal_lm("llama", seed=0), kv_encoding="eager")
    errors = 0
    with AgentMemory(args.store, **kwargs) as mem, open(args.report, "a") as report:
        for i in range(args.count):
            try:
                rec = mem.remember(f"{args.user} note {i}: the pelican crossed river {i % 17}", user_id=args.user,
                                   session_id=f"{args.user}-s{i % 3}", metadata={"i": i})
                report.write(f"{rec.id}\n")
                report.flush()
                os.fsync(report.fileno())
                if args.recall:
                    mem.recall(f"river {i % 17}", user_id=args.user, k=3)
            except Exception as exc:  # counted, reported to the parent on stderr
                errors += 1
                print(f"ERROR {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    print(f"errors={errors}", flush=True)


if __name__ == "__main__":
    main()
