"""research/demotion_crossfit.py: what it records and replays is what recall does (research/notes/
consolidation-crossdataset.md, round 3 session 4): the shipped rule replayed gives recall's order, the previous rule
the order before the change, and no demotion the store's own ranking."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import demotion_crossfit as dc  # noqa: E402

from agentmem import AgentMemory  # noqa: E402

# the write supersedes Lyon; restored, the pair is left to recall (tests/unit/test_text_vectors.py)
TEXTS = ["I live in Lyon.", "The weather was lovely this weekend.", "Actually I moved to Paris last month."]
QUERY = "where do I live?"


def test_the_replay_of_a_recorded_pool_gives_recalls_order(tmp_path: Path) -> None:
    with AgentMemory(tmp_path / "s") as mem:
        ids = [mem.remember(t, user_id="u1").id for t in TEXTS]
        assert mem.restore(ids[0]).status == "active"
        shipped = [h.id for h in mem.recall(QUERY, user_id="u1", k=5)]
        recorder = dc.Recorder(mem)
        mem._recaller._demotion = recorder
        unchanged = [h.id for h in mem.recall(QUERY, user_id="u1", k=5)]
    seen = recorder.last
    assert unchanged == seen["ids"][:5]  # the recorder hands the ranking back untouched
    assert (ids[0], ids[-1]) in {(o, n) for o, n, _ in seen["pairs"]}  # the Lyon / Paris pair, with its score
    assert dc.replay(seen, dc.shipped_rule())[:5] == shipped
    assert shipped.index(ids[-1]) < shipped.index(ids[0])  # newer first: the demotion acted
    assert dc.replay(seen, dc.Rule(math.inf, 0, swapped=False)) == seen["ids"]


def test_several_sentences_need_the_supersede_threshold_in_the_replay() -> None:
    pool = {"ids": ["old", "x", "new"], "pairs": [("old", "new", -1.0)], "swapped": [], "sentences": {"old": 2}}
    assert dc.replay(pool, dc.previous_rule()) == ["new", "x", "old"]  # a weak conflict demoted any memory
    assert dc.replay(pool, dc.shipped_rule()) == ["old", "x", "new"]  # now a longer one stays
    assert dc.replay({**pool, "sentences": {"old": 1}}, dc.shipped_rule()) == ["new", "x", "old"]
