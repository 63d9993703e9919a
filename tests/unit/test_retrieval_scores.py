"""Recall scores that mean something (calibrated, comparable across queries and stores, ``min_score``) and the
re-ranking of the head by speaker and time. What the scores mean on small stores of every kind:
test_score_meaning.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmem import AgentMemory
from agentmem.errors import InvalidInputError
from agentmem.recall.calibration import Calibration
from agentmem.recall.rerank import HeadEntry, named_speakers, rerank
from agentmem.recall.retrieval import Candidates, RetrievalParams, rank_scores
from agentmem.recall.temporal import asks_about_time, mentions_time


@pytest.fixture
def mem(tmp_path: Path):
    with AgentMemory(tmp_path / "m", kv_encoding="off") as m:
        yield m


def test_one_stored_item_and_an_unrelated_query_scores_low(mem: AgentMemory) -> None:
    mem.remember("I moved to Lyon last May with my two cats.", user_id="u1", session_id="s1")
    unrelated = mem.recall("quarterly tax return deadline for freelancers", user_id="u1", k=5)
    related = mem.recall("where did I move to last May?", user_id="u1", k=5)
    assert len(unrelated) == len(related) == 1
    # the only candidate is "the best" of its pool either way; the calibrated score still tells them apart
    assert unrelated[0].score < 0.3 < 0.5 <= related[0].score


def test_scores_are_probabilities_and_min_score_keeps_those_at_or_above_it_in_rank_order(mem: AgentMemory) -> None:
    texts = ["Caroline went to the LGBTQ support group yesterday.", "Melanie painted a sunrise over the lake.",
             "Caroline is researching adoption agencies.", "We talked about the new bakery downtown.",
             "Melanie ran a charity race for mental health.", "The weather was cold and rainy all week."]
    mem.remember_many([dict(text=t, user_id="u1", session_id="s1", kind="turn") for t in texts])
    hits = mem.recall("What is Caroline researching?", user_id="u1", k=6)
    scores = [h.score for h in hits]
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert "adoption" in hits[0].text and scores[0] == max(scores)
    cut = (max(scores) + min(scores)) / 2
    kept = mem.recall("What is Caroline researching?", user_id="u1", k=6, min_score=cut)
    assert [h.id for h in kept] == [h.id for h in hits if h.score >= cut] and 0 < len(kept) < len(hits)
    assert mem.recall("What is Caroline researching?", user_id="u1", k=6, min_score=1.0) == []


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.3", float("nan"), True])
def test_min_score_must_be_a_probability(mem: AgentMemory, bad) -> None:
    mem.remember("hello there", user_id="u1")
    with pytest.raises(InvalidInputError, match="min_score"):
        mem.recall("hello", user_id="u1", min_score=bad)


def test_every_hit_reports_its_cosine_even_beyond_the_dense_pool(tmp_path: Path) -> None:
    # a pool of 4: most hits come from the lexical side or from spillover, outside the dense candidates
    with AgentMemory(tmp_path / "m", kv_encoding="off", candidate_pool=4) as mem:
        recs = mem.remember_many([dict(text=f"note {i}: the kayak trip number {i} was fun", user_id="u1",
                                       session_id="s1", kind="turn") for i in range(30)])
        hits = mem.recall("kayak trip", user_id="u1", k=12)
        assert len(hits) == 12 and all("dense" in h.scores for h in hits)
        assert len(recs) == 30
        query = mem._store.embed_query("kayak trip")  # recall's query path (int8 feed-forward weights)
        stored = mem.stored_vectors([h.id for h in hits], user_id="u1")  # what the index holds for each hit
        assert len(stored) == 12
        for h, v in ((h, stored[h.id]) for h in hits):
            assert h.scores["dense"] == pytest.approx(float(query @ v), abs=1e-4)


def test_the_named_speakers_turns_and_dated_turns_are_lifted() -> None:
    head = [HeadEntry("m1", 1.0, "Melanie", "[1 May 2023] Melanie: I love painting at the lake",
                      text="I love painting at the lake"),
            HeadEntry("c1", 0.8, "Caroline", "[1 May 2023] Caroline: painting helps me too", text="painting helps me too"),
            HeadEntry("c2", 0.5, "Caroline", "[1 May 2023] Caroline: I went to the group yesterday",
                      text="I went to the group yesterday")]
    p = RetrievalParams(speaker_boost=0.5, temporal_boost=0.2)
    assert [i for i, _ in rerank("What does Caroline paint?", head, p)] == ["c1", "m1", "c2"]
    assert [i for i, _ in rerank("When did Caroline go to the group?", head, p)][0] == "c1"
    timed = dict(rerank("When did Caroline go to the group?", head, p))
    assert timed["c2"] == pytest.approx(0.5 * 1.5 * 1.2)
    assert timed["c1"] == pytest.approx(0.8 * 1.5)  # the line's "[1 May 2023]" stamp does not date the text
    # two speakers named, or none: order unchanged; the boosts switched off: unchanged
    assert [i for i, _ in rerank("Did Caroline and Melanie paint?", head, p)] == ["m1", "c1", "c2"]
    assert [i for i, _ in rerank("What does Caroline paint?", head, RetrievalParams(speaker_boost=0.0))] == \
        ["m1", "c1", "c2"]
    assert named_speakers("what did carol say?", ["Caroline", "Carol"]) == {"Carol"}


def test_time_questions_and_time_expressions() -> None:
    assert asks_about_time("When did she move?") and asks_about_time("how long has he lived there")
    assert asks_about_time("What year did they marry?") and not asks_about_time("Where is the whenua?")
    assert mentions_time("we met two years ago") and mentions_time("I was born in 1990")
    assert not mentions_time("we met at the park")  # more formats: tests/unit/test_query.py


def test_speaker_named_in_the_query_wins_end_to_end(mem: AgentMemory) -> None:
    mem.remember_many([
        dict(text="I started pottery classes, it is relaxing", user_id="u1", session_id="s1", kind="turn",
             speaker="Melanie"),
        dict(text="Pottery sounds relaxing, I tried it once", user_id="u1", session_id="s1", kind="turn",
             speaker="Caroline"),
    ])
    assert mem.recall("What relaxing classes did Caroline try?", user_id="u1", k=2)[0].speaker == "Caroline"
    assert mem.recall("What relaxing classes did Melanie start?", user_id="u1", k=2)[0].speaker == "Melanie"


def test_rank_scores_match_the_documented_fusion() -> None:
    cands = Candidates({"a": 0.9, "b": 0.5}, {"b": 4.0, "c": 2.0})
    p = RetrievalParams(dense_weight=0.5, session_weight=0.0)
    assert rank_scores(cands, p) == pytest.approx({"a": 0.5, "b": 0.5, "c": 0.25})


def test_calibration_fit_is_monotone_and_bounded() -> None:
    x = [Calibration.features(0.6, 1.0)] * 30 + [Calibration.features(0.1, 0.0)] * 30 + [Calibration.features(0.3, 0.5)] * 30
    y = [1] * 25 + [0] * 5 + [0] * 30 + [1] * 15 + [0] * 15
    cal = Calibration.fit(x, y)
    strong = cal(cosine=0.6, overlap=1.0)
    assert strong == pytest.approx(25 / 30, abs=0.05)  # the fitted probability is the observed rate
    assert cal(cosine=0.1, overlap=0.0) < 0.05
    assert cal(cosine=0.3, overlap=0.5) == pytest.approx(0.5, abs=0.05)
    assert all(0.0 <= cal(cosine=c, overlap=o) <= 1.0 for c in (-1, 0, 1) for o in (0, 0.5, 1))
    # each sample's weight counts: the same rows, the positives weighed 3 times, give higher scores
    heavier = Calibration.fit(x, y, weights=[3.0 if label else 1.0 for label in y])
    assert heavier(cosine=0.3, overlap=0.5) > cal(cosine=0.3, overlap=0.5)
