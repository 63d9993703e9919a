"""Question-text cues and the widened head that research/learned_ablation.py measures for the learned head order
(agentmem/recall/head_cues.py): what each cue reads from the question and the head's turns, and what joins the head."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from agentmem.recall.head_cues import CUES, cue_columns, cues, question_words, stem, widen
from agentmem.recall.learned_rank import FEATURES, HeadModel, features, reorder
from agentmem.recall.rerank import HeadEntry, rerank
from agentmem.recall.retrieval import Candidates, RetrievalParams, best_first, rank_parts


class Place:
    def __init__(self, session_id: str) -> None:
        self.session_id, self.before, self.after = session_id, (), ()


HEAD = [HeadEntry("a", 1.0, "Ann", "[1 May 2023] Ann: we went camping by the lake"),
        HeadEntry("b", 0.9, "Ann", "[1 May 2023] Ann: the kids loved it"),
        HeadEntry("c", 0.8, "Bob", "[9 June 2023] Bob: I paint landscapes of lakes and camps"),
        HeadEntry("d", 0.7, "Ann", "[1 May 2023] Ann: camping again soon")]
PLACES = {"a": Place("s1"), "b": Place("s1"), "c": Place("s2"), "d": Place("s1")}
CANDS = Candidates({"a": 0.6, "b": 0.5, "c": 0.4, "d": 0.3}, {"a": 2.0, "c": 1.0}, PLACES)


def _cues(query: str) -> tuple[list[str], dict[str, dict[str, float]]]:
    p = RetrievalParams()
    _, fused, spilled = rank_parts(CANDS, p)
    order = rerank(query, HEAD, p)
    assert features(query, HEAD, order, CANDS, fused, spilled, p).shape == (len(HEAD), len(FEATURES))
    C = cue_columns(query, HEAD, order, CANDS)
    assert C.shape == (len(HEAD), len(CUES))
    ids = [i for i, _ in order]
    return ids, {i: dict(zip(CUES, C[n])) for n, i in enumerate(ids)}


def test_stems_meet_across_plural_ing_and_ed_forms() -> None:
    assert stem("painting") == stem("paints") == stem("painted") == "paint"
    assert stem("lakes") == stem("lake") and stem("glass") == "glass"


def test_question_words_drop_names_and_function_words_and_stem() -> None:
    assert question_words("Where did Ann go camping with Bob?", ["Ann", "Bob Smith"]) == ["go", "camp"]
    assert question_words("Would Ann enjoy the lakes?", ["Ann"]) == ["enjoy", "lake"]


def test_overlap_counts_the_question_words_a_turn_repeats() -> None:
    ids, c = _cues("Where did Ann go camping by the lake?")  # content words: go, camp(ing), lake
    assert c["a"]["overlap"] == 2 / 3  # "camping", "lake"
    assert c["c"]["overlap"] == 2 / 3  # "camps", "lakes": the same stems
    assert c["d"]["overlap"] == 1 / 3  # "camping"
    assert c["b"]["overlap"] == 0.0
    # weighted by rarity in the head of 4: "go" in none, "lake" in two turns, "camp" in three
    idf = {"go": math.log(1 + 4 / 1), "lake": math.log(1 + 4 / 3), "camp": math.log(1 + 4 / 4)}
    assert np.isclose(c["a"]["rare_overlap"], (idf["lake"] + idf["camp"]) / sum(idf.values()))
    assert np.isclose(c["d"]["rare_overlap"], idf["camp"] / sum(idf.values()))


def test_session_cues_count_the_head_entries_of_a_session() -> None:
    ids, c = _cues("Where did Ann go camping by the lake?")
    s1 = [i for i in ids if i in ("a", "b", "d")]
    assert [c[i]["session_first"] for i in s1] == [1.0, 0.5, 1 / 3]  # first, second, third of session s1
    assert c["c"]["session_first"] == 1.0 and c["c"]["session_mass"] == 0.25
    assert c["a"]["session_mass"] == 0.75
    assert all(c[i]["list_first"] == 0.0 for i in ids)  # not a list question
    ids_l, listed = _cues("Which lakes has Ann camped by?")
    assert {i: listed[i]["list_first"] for i in ids_l} == {i: listed[i]["session_first"] for i in ids_l}


def test_cues_of_a_head_without_question_words_or_sessions() -> None:
    C = cues("Who?", ["Ann: hi", "Bob: yo"], [None, None], ["Ann", "Bob"], listed=True)
    assert C[:, CUES.index("overlap")].tolist() == [0.0, 0.0]
    assert C[:, CUES.index("session_first")].tolist() == [1.0, 1.0]  # no session: never a repeat
    assert C[:, CUES.index("list_first")].tolist() == [1.0, 1.0]


def test_widen_moves_the_pools_best_into_the_head_and_keeps_every_entry() -> None:
    ranked = [(f"f{n}", 10.0 - n) for n in range(6)] + [("x", 1.0), ("y", 0.5), ("z", 0.1)]
    cands = Candidates({"z": 0.9, "f0": 0.8, "y": 0.1}, {}, turn_context={"x": 0.7, "z": 0.6})
    out, depth = widen(ranked, cands, 3, reserve=2)
    # z and f0 lead the dense pool, x and z the context pool: f0 is in the head already, x and z join it
    assert depth == 5 and [i for i, _ in out[:depth]] == ["f0", "f1", "f2", "x", "z"]
    assert sorted(out) == sorted(ranked)  # the same entries with the same scores, nothing lost
    assert [i for i, _ in out[depth:]] == ["f3", "f4", "f5", "y"]  # the rest in its fused order
    assert widen(ranked, Candidates({"f1": 0.9}, {}), 3, reserve=2) == (ranked, 3)


def test_the_widened_head_lets_the_learned_order_lift_a_dense_match_the_fused_order_buries() -> None:
    """25 turns that match the question's words fill the fused head; the dense pool's best shares no word. Only
    in the widened head can a model that reads the dense cosine put it first."""
    lexical = {f"w{n}": 5.0 - n / 10 for n in range(25)}
    dense = {"m": 0.9} | {f"w{n}": 0.2 for n in range(25)}
    cands = Candidates(dense, lexical)
    p = replace(RetrievalParams(), session_weight=0.0, list_session_weight=0.0)
    scores, fused, spilled = rank_parts(cands, p)
    ranked = best_first(scores)
    assert "m" not in {i for i, _ in ranked[:20]}
    dense_only = HeadModel(weights=tuple(5.0 if n == "dense" else 0.0 for n in FEATURES), bias=0.0, blend=1.0)

    def top(ranked: list, depth: int) -> list[str]:
        head = [HeadEntry(i, s, "Ann", f"Ann: turn {i}") for i, s in ranked[:depth]]
        order = reorder("What did Ann do?", head, rerank("What did Ann do?", head, p), cands, fused, spilled, p,
                        dense_only)
        return [i for i, _ in order][:10]

    assert "m" not in top(ranked, 20)
    assert top(*widen(ranked, cands, 20, reserve=20))[0] == "m"


