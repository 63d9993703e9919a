"""Would ordering recall's hits by their score put the answer first more often than the rank order does?

``recall(k)`` returns its hits in the rank order (the learned head's, then the conflict check's and "questions
last"), and each hit's ``Hit.score`` is a calibrated relevance that reads alike on every store. The two disagree on
small personal stores: for "What do I do for a living?" the head ranks "My mom lives in Porto." (score 0.08) and "I
live in Lyon with my partner." (0.05) above "I work as a nurse at St. Mary's hospital." (0.58). This script
measures, on the same recalled hits (``k`` = 10), both orders:

* ``rank``: as returned;
* ``score``: the hits sorted by score, keeping what the rank order settles apart from relevance: a hit a newer
  recalled memory contradicts (``Hit.contradicted_by``) and a memory that only asks go after the others, in their
  rank order (else the stale dose would come first again: it still matches the question).

Per source: ``first`` (the first hit is an answer: evidence / the item's own memory), recall@1/3/5 (share of the
evidence in the first k; @10 is the same set), ``mrr``. Sources: LoCoMo dev and REALTALK dev (stores ingested by
``benchmarks/locomo.py --store``), the small stores of ``research/score_stores.py`` (3 shuffles of stores of 8
items: facts, preferences, tool outputs, documents) and :data:`PERSONAL` (one user's 25 everyday facts in one store,
each asked about; two of them are updates of another: the older's question is then answered by the newer, so both
count). Nothing is fitted, so there is no cross-dataset fit to report: a rule ships only if it loses on no source.

    python research/order_by_score.py --locomo-store DIR --realtalk-store DIR [--out FILE]

Last line: {"orders": {order: {source: figures}}} (research/notes/order_by_score.json; notes in
research/notes/scores.md, session 22).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "research"), str(ROOT / "benchmarks")]
import fit_scores  # noqa: E402

from agentmem import AgentMemory  # noqa: E402
from agentmem.consolidate.statements import only_asks  # noqa: E402

# one user's everyday facts as told to an assistant, each with the question it answers; the (index of the) older
# fact a later one updates: its question is then answered by the newer one as well
PERSONAL = [
    ("Hi, I'm Alice Smith.", "What's my name?"),
    ("My name is Jordan, by the way.", "Do you remember my name?"),
    ("I'm 34 years old.", "How old am I?"),
    ("I turned 40 last week.", "What's my age?"),
    ("I work as a nurse at St. Mary's hospital.", "What do I do for a living?"),
    ("I live in Lyon with my partner.", "Where do I live?"),
    ("My birthday is on March 3rd.", "When is my birthday?"),
    ("We have a cat called Miso.", "What's my pet's name?"),
    ("My wife Sara is a teacher.", "What does my wife do?"),
    ("My son Leo just started school.", "How old is my son?"),
    ("I love spicy Thai food.", "What kind of food do I like?"),
    ("I'm allergic to penicillin.", "Do I have any allergies?"),
    ("I drive a blue Toyota Corolla.", "What car do I have?"),
    ("My favourite band is Radiohead.", "What music do I like?"),
    ("I'm learning Japanese on Duolingo.", "Which language am I studying?"),
    ("My flight to Boston leaves Friday at 7am.", "When is my flight?"),
    ("I usually wake up at 6:30.", "What time do I get up?"),
    ("I'm vegan since 2019.", "Do I eat meat?"),
    ("My phone number is 555-0142.", "What's my number?"),
    ("My mom lives in Porto.", "Where does my mother live?"),
    ("I play tennis every Sunday.", "What sports do I play?"),
    ("I'm saving up for a house.", "What am I saving money for?"),
    ("My doctor is Dr. Patel.", "Who is my doctor?"),
    ("I graduated from MIT in 2012.", "Where did I go to college?"),
    ("I prefer window seats on planes.", "Aisle or window?"),
]
UPDATES = {0: 1, 2: 3}  # older fact -> the newer one that updates it


def annotate(mem: AgentMemory, query: str, hits: list[Any], made: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the orders read, added to :func:`fit_scores.dev_samples`' samples."""
    for sample, h in zip(made, hits):
        sample.update(score=h.score, contradicted=h.contradicted_by is not None, asks=only_asks(h.text))
    return made


def personal_samples() -> list[dict[str, Any]]:
    """:data:`PERSONAL` in one store, every question asked (label 1: a memory that answers it)."""
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, AgentMemory(tmp, kv_encoding="off") as mem:
        ids = [mem.remember(text, user_id="u", role="user").id for text, _ in PERSONAL]
        for qi, (_, question) in enumerate(PERSONAL):
            answers = {ids[qi]} | ({ids[UPDATES[qi]]} if qi in UPDATES else set())
            answers |= {ids[old] for old, new in UPDATES.items() if new == qi}
            hits = mem.recall(question, user_id="u", k=fit_scores.K)
            made = [fit_scores.hit_sample(h, int(h.id in answers), qi, "personal", rank, question)
                    for rank, h in enumerate(hits)]
            out += annotate(mem, question, hits, made)
            out[-1]["gold"] = len(answers)
    return out


def ordered(hits: list[dict[str, Any]], order: str) -> list[dict[str, Any]]:
    """One recall's samples in ``order`` (see the module docstring)."""
    by_rank = sorted(hits, key=lambda s: s["rank"])
    if order == "rank":
        return by_rank
    settled = [s for s in by_rank if s["contradicted"] or s["asks"]]
    return sorted((s for s in by_rank if not (s["contradicted"] or s["asks"])), key=lambda s: -s["score"]) + settled


def figures(samples: list[dict[str, Any]], order: str, dev: bool) -> dict[str, float]:
    """``first``, recall@1/3/5 and ``mrr`` over the questions of one source (of a ``dev`` set, its own recalls only:
    the same question asked of another conversation is labelled 0 there, its own non-evidence -1)."""
    by_q: dict[int, list[dict[str, Any]]] = defaultdict(list)
    gold: dict[int, int] = {}
    for s in samples:
        if "gold" in s:
            gold[s["q"]] = s["gold"]
        if not (dev and s["label"] == 0):
            by_q[s["q"]].append(s)
    per: dict[str, list[float]] = defaultdict(list)
    for q, hits in by_q.items():
        labels = [s["label"] == 1 for s in ordered(hits, order)]
        per["first"].append(float(labels[0]))
        for k in (1, 3, 5):
            per[f"recall@{k}"].append(sum(labels[:k]) / max(1, gold.get(q, 1)))
        per["mrr"].append(next((1 / (n + 1) for n, y in enumerate(labels) if y), 0.0))
    return {name: round(statistics.fmean(v), 4) for name, v in per.items()} | {"questions": len(by_q)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--locomo-store", type=Path, required=True)
    ap.add_argument("--realtalk-store", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=None, help="also write the last line here")
    args = ap.parse_args()
    sources = {"locomo": fit_scores.dev_samples("locomo", args.locomo_store, annotate),
               "realtalk": fit_scores.dev_samples("realtalk", args.realtalk_store, annotate),
               "small": fit_scores.small_samples(annotate=annotate), "personal": personal_samples()}
    line = {"orders": {order: {name: figures(samples, order, name in fit_scores.DATA)
                               for name, samples in sources.items()}
                       for order in ("rank", "score")}}
    text = json.dumps(line)
    if args.out:
        args.out.write_text(text + "\n")
    print(text, flush=True)


if __name__ == "__main__":
    main()
