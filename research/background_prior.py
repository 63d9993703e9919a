"""The background a new user's first memories are compared against (``PairModel.background_prior``, issue #38's
"generalise, and prove it across datasets"; round 3 session 15).

The pairwise supersession model reads ``margin``: the pair's cosine minus the newer memory's *background*, the
median cosine to its 10 nearest older memories of the speaker. With fewer than 3 older memories there was no
background and it was set to 1.0, so nothing could stand out: a new user who says "I take 20 mg of lisinopril every
morning." and, a session later, "My doctor raised my lisinopril to 40 mg." got the stale dose first from
``recall(k=1)`` in 26 of the 34 held-out natural pairs of ``benchmarks/ku_natural.py`` (with four unrelated memories
stored besides, 6 of 34). Recall's conflict check has the same gap whenever it finds fewer than 3 of a speaker's
memories.

The prior is measured, not tuned: the median background of every conversation turn (from a speaker's 4th turn on)
of one dev set, LoCoMo's or REALTALK's. This script measures both and scores each on the pairs of both halves of
the hand-written sets (natural updates, the template updates, look-alike statements that are not updates, another
fact of the same user, chit-chat): the share of pairs the model, with that background, puts at or above ``conflict``
(recall puts the newer first; a mount leaves the older out) and at or above ``supersede`` (the write hides the
older). Recall@k on the other dev set is the cross-dataset check (``benchmarks/locomo.py``, run with each prior
written; research/notes/consolidation-crossdataset.md).

    python research/background_prior.py --locomo ../shared/data/locomo/locomo_dev5.json \
        --realtalk ../shared/data/realtalk/realtalk_dev5.json [--write locomo|realtalk]

``--write`` stores that dataset's prior, with its provenance, in ``agentmem/consolidate/weights/
supersession_pairs.json``. Last line: {"priors": {"locomo": ..., "realtalk": ...}, "pairs": {prior: {set: {...}}}}
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]

from fit_supersession import unit  # noqa: E402
from ku_natural import CHECK, DESIGN  # noqa: E402
from ku_scenarios import _ALIKE, _CHATTER, _TEST, _TUNE  # noqa: E402
from locomo import turn_text  # noqa: E402

from agentmem import AgentMemory  # noqa: E402
from agentmem.consolidate.pairs import (BACKGROUND_NEIGHBOURS, MIN_BACKGROUND, WEIGHTS, PairModel,  # noqa: E402
                                      pair_features)
from agentmem.text import content_words  # noqa: E402


def dataset_background(mem: AgentMemory, path: Path) -> float:
    """Median over every turn (a speaker's 4th on) of its background among the speaker's older turns."""
    out = []
    for conv in json.loads(path.read_text()):
        by_speaker: dict[str, list[str]] = {}
        for session in conv["sessions"]:
            for turn in session["turns"]:
                by_speaker.setdefault(turn.get("speaker", "?"), []).append(turn_text(turn))
        for texts in by_speaker.values():
            vectors = unit(np.asarray(mem.embed(texts)))
            for i in range(MIN_BACKGROUND, len(texts)):
                top = np.sort(vectors[:i] @ vectors[i])[::-1][:BACKGROUND_NEIGHBOURS]
                out.append(float(np.median(top)))
    return round(float(np.median(out)), 3)


def pair_sets(seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """(older, newer) pairs: updates the model should catch, and pairs it must leave alone."""
    rng = random.Random(seed)
    table = {**_TUNE, **_TEST}
    sets: dict[str, list[tuple[str, str]]] = {"natural_design": [(a, b) for a, b, _ in DESIGN],
                                              "natural_check": [(a, b) for a, b, _ in CHECK],
                                              "template_updates": [], "alike": [], "other_fact": [], "chatter": []}
    for attribute, (statements, updates, _, values) in sorted(table.items()):
        for _ in range(6):
            old, new, third = rng.sample(values, 3)
            stated = rng.choice(statements).format(v=old)
            sets["template_updates"].append((stated, rng.choice(updates).format(v=new)))
            alike = rng.choice(_ALIKE[attribute]).format(v=third)
            sets["alike"] += [(stated, alike), (alike, stated)]
            other = rng.choice([a for a in table if a != attribute])
            sets["other_fact"].append((stated, rng.choice(table[other][0]).format(v=rng.choice(table[other][3]))))
            sets["chatter"].append((rng.choice(_CHATTER), stated))
    return sets


def pair_rates(mem: AgentMemory, model: PairModel, pairs: list[tuple[str, str]], prior: float) -> dict[str, float]:
    """Share of pairs at or above ``conflict`` and ``supersede`` when the newer has only the older before it."""
    texts = sorted({t for p in pairs for t in p})
    vectors = dict(zip(texts, unit(np.asarray(mem.embed(texts)))))
    scores = np.array([float((pair_features(vectors[b], content_words(b), [vectors[a]], [content_words(a)],
                                            background_prior=prior) @ model.weights + model.bias)[0])
                       for a, b in pairs])
    return {"pairs": len(pairs), "conflict": round(float((scores >= model.conflict).mean()), 3),
            "supersede": round(float((scores >= model.supersede).mean()), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--locomo", type=Path, required=True)
    ap.add_argument("--realtalk", type=Path, required=True)
    ap.add_argument("--write", choices=["locomo", "realtalk"], default=None,
                    help="store this dataset's prior in the bundled weights file")
    args = ap.parse_args()
    model = PairModel.bundled()
    assert model is not None, "the bundled pairwise model is missing"
    with tempfile.TemporaryDirectory() as tmp, AgentMemory(tmp) as mem:
        priors = {"locomo": dataset_background(mem, args.locomo), "realtalk": dataset_background(mem, args.realtalk)}
        print("priors", priors, file=sys.stderr, flush=True)
        sets = pair_sets()
        rates = {str(prior): {name: pair_rates(mem, model, pairs, prior) for name, pairs in sets.items()}
                 for prior in (1.0, priors["locomo"], priors["realtalk"])}
    if args.write:
        data = json.loads(WEIGHTS.read_text())
        data["background_prior"] = {
            "value": priors[args.write],
            "provenance": f"research/background_prior.py --write {args.write}: the median background (cosine to "
                          f"the 10 nearest older turns of the speaker) of every {args.write} dev turn from a "
                          f"speaker's 4th on; measured priors {priors}; cross-dataset recall in "
                          "research/notes/consolidation-crossdataset.md (round 3 session 15)"}
        WEIGHTS.write_text(json.dumps(data))
    print(json.dumps({"priors": priors, "pairs": rates}), flush=True)


if __name__ == "__main__":
    main()
