"""One LoCoMo ingest, its candidates and vectors, cached in a pickle so the learned-ranking ablations
(``research/learned_ablation.py``) can try many models without touching the store again.

    python research/_locomo_cache.py --data ../shared/data/locomo/locomo_dev5.json --store /tmp/q-store \
        --out /tmp/q-store/cache.pkl

What is cached: every question (conversation, text, category, gold ids) with the store's own candidates
(``EntryStore.candidates``, as recall gets them: dense, lexical, turn-context cosines, placements); every turn's
row fields the ranking reads (session, speaker, memory line), its placement, its stored vector and its stored
context vector; every question's query vector as recall embeds it (``EntryStore.embed_query``).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]  # research/, benchmarks/
import locomo  # noqa: E402
import locomo_cv  # noqa: E402
import retrieval_ablation as ra  # noqa: E402

from agentmem import AgentMemory  # noqa: E402
from agentmem.ports.vectors import CONTEXT_SPACE  # noqa: E402


class Row(NamedTuple):
    """The row fields the ranking reads (``text``: the entry's own text, which the head's time expressions and
    question-word cues read; None in a cache written before it was kept, where they read the memory line;
    ``occurred_at``: when it happened, which the time-window match reads; None in a cache written before it was
    kept)."""

    session_id: str | None
    speaker: str | None
    memory_text: str
    text: str | None = None
    occurred_at: str | None = None


def build(data: Path, store_dir: Path, consolidation: str, pool: int) -> dict:
    """Ingest (or reuse) the store, gather every question's candidates and the vectors; return the cache dict.

    Example:
        >>> cache = build(Path("locomo_dev5.json"), Path("/tmp/s"), "local", 100)   # doctest: +SKIP
    """
    conversations = json.loads(data.read_text())
    store_dir.mkdir(parents=True, exist_ok=True)
    manifest = store_dir / "locomo-ids.json"
    made_by = {"data": str(data.resolve()), "backend": "embedded", "consolidation": consolidation,
               "conversations": None}
    with AgentMemory(store_dir, kv_encoding="off", consolidation=consolidation) as mem:
        id_maps = locomo.ingest_once(mem, conversations, manifest, made_by)
        questions = locomo.questions_of(conversations, id_maps)
        rows = locomo_cv.gather_candidates(mem, questions, pool)
        store = mem._store
        places = store.catalog.turn_context(list(rows))
        turns = ra.conv_turns(conversations, id_maps, rows)
        vecs = ra.stored_vectors(store, turns)
        ctx = {}
        for cid, ts in turns.items():
            got = store.vectors.get(f"locomo-{cid}", list(dict.fromkeys(t["id"] for t in ts)), space=CONTEXT_SPACE)
            ctx[cid] = np.stack([got.get(t["id"], vecs[cid][n]) for n, t in enumerate(ts)])
        qvecs = ra.query_vectors(store, [q.text for q in questions])
    return {"questions": questions,
            "rows": {i: Row(r.session_id, r.speaker, r.memory_text, r.text, r.occurred_at) for i, r in rows.items()},
            "places": places, "turns": turns, "vecs": vecs, "ctx": ctx, "qvecs": qvecs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--store", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--consolidation", choices=["off", "local"], default="local")
    ap.add_argument("--pool", type=int, default=100)
    args = ap.parse_args()
    cache = build(args.data, args.store, args.consolidation, args.pool)
    args.out.write_bytes(pickle.dumps(cache))
    print(json.dumps({"questions": len(cache["questions"]), "turns": len(cache["rows"]), "out": str(args.out)}))


if __name__ == "__main__":
    main()
