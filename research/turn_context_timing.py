"""Time ``SqliteCatalog.turn_context`` (recall's conversation placement) on a copy of a kept store's catalog.

    python research/turn_context_timing.py COPY_OF/catalog.db LABEL [--ids 130] [--repeats 200]

Opening the catalog migrates the copy to this checkout's schema (so run it on a copy). Each repeat places ``--ids``
random turns, as one recall places its candidates. Schema 9 (the turn-order index keyed by session, user, time)
was checked this way against the code before it, on copies of recall_latency.py's 10,000-entry store.

Last line: {"code", "p50_ms", "p95_ms", "load_avg"}
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

from agentmem.backends.sqlite.catalog import SqliteCatalog


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("catalog")
    ap.add_argument("label")
    ap.add_argument("--ids", type=int, default=130)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    cat = SqliteCatalog(args.catalog)
    with cat.engine.connect() as conn:
        turns = [r[0] for r in conn.exec_driver_sql(
            "SELECT id FROM entries WHERE kind = 'turn' AND session_id IS NOT NULL")]
    rng, times = random.Random(0), []
    for _ in range(args.repeats):
        chunk = rng.sample(turns, min(args.ids, len(turns)))
        t0 = time.perf_counter()
        cat.turn_context(chunk)
        times.append(time.perf_counter() - t0)
    cat.close()
    times.sort()
    print(json.dumps({"code": args.label, "p50_ms": round(1000 * statistics.median(times), 3),
                      "p95_ms": round(1000 * times[int(0.95 * len(times)) - 1], 3),
                      "load_avg": [round(x, 2) for x in os.getloadavg()[:2]]}))


if __name__ == "__main__":
    main()
