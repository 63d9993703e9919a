"""research/category_ablation.py's head widenings (research/notes/retrieval-lab-notes.md, session 13): the dense rescue lets in only the
dense pool's turns below the head that repeat a question word, and the session draw the top sessions' best turns."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import category_ablation as ca  # noqa: E402

from agentmem.recall.retrieval import Candidates  # noqa: E402


class Row(NamedTuple):
    session_id: str | None
    speaker: str | None
    memory_text: str


class Place(NamedTuple):
    session_id: str


def _setup() -> tuple[list[tuple[str, float]], Candidates, dict[str, Row]]:
    ids = [f"t{n}" for n in range(30)]
    rows = {i: Row("s1", "Ann", f"[1 May 2023] Ann: chat {i}") for i in ids}
    rows["t25"] = Row("s2", "Ann", "[1 May 2023] Ann: I went camping with the kids")
    rows["t26"] = Row("s2", "Ann", "[1 May 2023] Ann: the weather was fine")
    ranked = [(i, 1.0 - n / 100) for n, i in enumerate(ids)]  # fused order t0 .. t29
    dense = {i: 0.9 - n / 100 for n, i in enumerate(ids[:20])} | {"t25": 0.6, "t26": 0.59}
    places = {i: Place(rows[i].session_id) for i in ids}
    return ranked, Candidates(dense, {}, places), rows


def test_the_rescue_lets_in_only_deep_dense_turns_that_repeat_a_question_word() -> None:
    ranked, cands, rows = _setup()
    out, depth = ca.rescue(ranked, cands, 5, "Where did Ann go camping?", rows, 20, 50)
    assert depth == 6 and out[5][0] == "t25"  # dense rank 20 and "camping": in; "weather" (rank 21): not
    assert [i for i, _ in out].count("t25") == 1 and len(out) == len(ranked)
    out, depth = ca.rescue(ranked, cands, 5, "Where did Ann go camping?", rows, 20, 50, cue=False)
    assert depth == 7 and {i for i, _ in out[5:7]} == {"t25", "t26"}


def test_the_session_draw_brings_the_best_turns_of_the_top_sessions() -> None:
    ranked, cands, _ = _setup()
    out, depth = ca.sessdraw(ranked, cands, 5, 2, 2)  # s1's best two are in the head already; s2's are not
    assert depth == 7 and {i for i, _ in out[5:7]} == {"t25", "t26"}
