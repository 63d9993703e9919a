"""Fuzz the public API and the HTTP server with the state machine of tests/property/served_machine.py.

The machine is tests/property/api_machine.py's with the server in front of the same store.

    python benchmarks/fuzz.py --minutes 10 [--steps 50]

Runs batches of random examples (each a fresh store and up to ``--steps`` steps: remember / remember_many /
update / recall / list / get / forget / sweep / reopen / a second process / chat over HTTP / hostile ids over REST,
hostile inputs mixed in, invisible and bidi characters among the ids) until the time is up. After every step the
machine checks: success or an agentmem error; rows = vectors = blobs, no orphans; every user sees exactly their
own entries; no erased marker, erased vector or planted secret anywhere on disk; no endpoint (REST, inspector,
MCP, /v1/stats, /metrics) serves an erased entry's text.
A failing example is shrunk and printed, and counted as a violation.

Last line: {"steps": N, "violations": 0, "examples": E, "agentmem_errors": A, "minutes": M}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "property")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ.pop("AGENTMEM_ENCRYPTION_KEY", None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--steps", type=int, default=50, help="most steps per example")
    ap.add_argument("--batch", type=int, default=8,
                    help="examples per hypothesis run (the first of each run is the minimal one: keep it > 1)")
    args = ap.parse_args()

    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test

    from agentmem.kv.testing import tiny_causal_lm
    from api_machine import STATS
    from served_machine import ServedApiMachine

    ServedApiMachine.model_pair = tiny_causal_lm("llama", seed=0)
    run_settings = settings(max_examples=args.batch, stateful_step_count=args.steps, deadline=None, database=None,
                            suppress_health_check=list(HealthCheck), print_blob=True)
    t0 = time.monotonic()
    violations: list[str] = []
    while time.monotonic() - t0 < args.minutes * 60:
        try:
            run_state_machine_as_test(ServedApiMachine, settings=run_settings)
        except Exception:  # a violated property (AssertionError) or an error that is not an AgentMemError
            violations.append(traceback.format_exc(limit=6))
            print(f"VIOLATION {len(violations)}:\n{violations[-1]}", file=sys.stderr, flush=True)
        elapsed = (time.monotonic() - t0) / 60
        print(f"{elapsed:6.2f} min  examples={STATS['examples']}  steps={STATS['steps']}  "
              f"violations={len(violations)}", flush=True)
    print(json.dumps({"steps": STATS["steps"], "violations": len(violations), "examples": STATS["examples"],
                      "agentmem_errors": STATS["agentmem_errors"],
                      "minutes": round((time.monotonic() - t0) / 60, 2)}))


if __name__ == "__main__":
    main()
