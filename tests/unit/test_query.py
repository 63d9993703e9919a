"""The query parsed once (agentmem/recall/query.py) and the time signals read from entry fields
(agentmem/recall/temporal.py): the same on LoCoMo's line and date formats, REALTALK's, and a plain user's."""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from pathlib import Path

import pytest

from agentmem import AgentMemory
from agentmem.recall.head import rank_candidates
from agentmem.recall.multihop import for_query
from agentmem.recall.query import QueryInfo, parse_query
from agentmem.recall.rerank import HeadEntry, rerank
from agentmem.recall.retrieval import Candidates, RetrievalParams
from agentmem.recall.temporal import DateAnchor, date_anchors, event_date, happened_within, mentions_time


@pytest.mark.parametrize("question, wh, asks_time, is_list", [
    ("When did Caroline go to the LGBTQ support group?", "when", True, False),       # LoCoMo
    ("What activities does Melanie partake in?", "what", False, True),
    ("When did Muhammad participate in a Fortnite tournament?", "when", True, False),  # REALTALK
    ("What games do Fahim Khan and Muhammad play together?", "what", False, True),
    ("In what ways is Kate involved?", "what", False, True),
    ("where do I live?", "where", False, False),                                     # a plain user
    ("Is my dentist appointment before the trip?", None, True, False),
    ("dentist appointment", None, False, False),
])
def test_a_query_is_parsed_into_its_form(question: str, wh: str | None, asks_time: bool, is_list: bool) -> None:
    q = parse_query(question)
    assert (q.text, q.wh, q.asks_time, q.is_list) == (question, wh, asks_time, is_list)
    assert parse_query(question) is q  # parsed once per distinct text


@pytest.mark.parametrize("question, anchors", [
    ("What did Kevin watch on the night of 10.01.2024?", [DateAnchor(2024, 1, 10)]),  # REALTALK: dotted, day first
    ("What kind of pasta did Kate make on 29 Dec 2023?", [DateAnchor(2023, 12, 29)]),
    ("Where is Paola going on the 10th of February 2024?", [DateAnchor(2024, 2, 10)]),
    ("Who did Maria have dinner with on May 3, 2023?", [DateAnchor(2023, 5, 3)]),      # LoCoMo
    ("What did John attend with his colleagues in March 2023?", [DateAnchor(2023, 3, None)]),
    ("Which outdoor spot did Joanna visit in May?", [DateAnchor(None, 5, None)]),
    ("What football match did Kevin watch in 2017?", [DateAnchor(2017, None, None)]),
    ("what did I book for 2024-01-06 and 02/14/2024?", [DateAnchor(2024, 1, 6), DateAnchor(2024, 2, 14)]),
    ('When did he start reading "11/22/63"?', []),  # a title, not a date: numeric dates need a four-digit year
    ("may I ask what we did in march?", []),  # lower-case "may" / "march" are verbs here, not months
    ("What happened on 31.02.2024?", []),  # no such day
    ("How many hours of lessons did Paola have?", []),
])
def test_the_dates_a_query_names(question: str, anchors: list[DateAnchor]) -> None:
    assert list(parse_query(question).anchors) == anchors == list(date_anchors(question))


@pytest.mark.parametrize("occurred_at, expected", [
    ("1:56 pm on 8 May, 2023", date(2023, 5, 8)),     # LoCoMo's session dates
    ("29.12.2023, 00:51:12", date(2023, 12, 29)),     # REALTALK's: day first
    ("06.01.2024, 16:43:00", date(2024, 1, 6)),       # day first even where month first would parse
    ("8 May 2023, 13:56", date(2023, 5, 8)),          # what remember() writes for a datetime or by default
    ("2024-01-06T16:43:00+01:00", date(2024, 1, 6)),
    ("13:56", None), ("soon", None), (None, None),    # no calendar date in it
])
def test_an_entrys_date_is_read_from_its_occurred_at_in_any_form(occurred_at: str | None,
                                                                  expected: date | None) -> None:
    assert event_date(occurred_at) == expected


def test_time_expressions_are_read_from_the_text_not_the_line() -> None:
    assert mentions_time("we met two years ago") and mentions_time("I was born in 1990")
    assert not mentions_time("we met at the park")
    # a head entry's body is the entry's own text: neither the line's date stamp nor a speaker called June counts
    entry = HeadEntry("a", 1.0, "June", "[3 June 2022] June: we met at the park", text="we met at the park")
    assert not mentions_time(entry.body)
    dated = HeadEntry("b", 0.9, "Bob", "[3 June 2022] Bob: we met at the park last week", text="we met at the park last week")
    boosted = dict(rerank("When did they meet at the park?", [entry, dated], RetrievalParams(temporal_boost=0.2)))
    assert boosted == {"a": 1.0, "b": pytest.approx(0.9 * 1.2)}
    assert happened_within("3 June 2022, 10:00", parse_query("Who did she meet in June 2022?").anchors)


@pytest.mark.parametrize("question, speakers, named", [
    ("When did Muhammad play Fortnite?", ["Fahim Khan", "Muhhamed"], {"Muhhamed"}),  # REALTALK's own spellings
    ("How do Faheem and Mohammed use music?", ["Fahim Khan", "Muhhamed"], {"Fahim Khan", "Muhhamed"}),
    ("When has Elisa's friend an internship?", ["Kevin", "elise"], {"elise"}),
    ("what does caroline like?", ["Caroline Smith", "Melanie", None], {"Caroline Smith"}),
    ("What did Carol say?", ["Caroline", "Carol"], {"Carol"}),
    ("What did Carol say?", ["Caroline"], set()),          # a shorter name is another name
    ("What did Caroline do in Milan?", ["Caroline", "Melanie"], {"Caroline"}),
    ("Which city have Jean and John visited?", ["Jon", "Gina"], set()),
    ("when did muhammad play?", ["Muhhamed"], set()),       # only a capitalised word is read as a name
])
def test_the_speakers_a_query_names(question: str, speakers: list[str | None], named: set[str]) -> None:
    assert parse_query(question).named_speakers(speakers) == named


def test_every_stage_reads_the_parsed_query_not_the_text() -> None:
    p = RetrievalParams()
    plain = parse_query("Tell me about Jon's job")
    assert for_query(p, plain) is p
    assert for_query(p, replace(plain, is_list=True)).session_weight == p.list_session_weight
    head = [HeadEntry("a", 1.0, "Ann", "Ann: I work at the bank", text="I work at the bank"),
            HeadEntry("b", 0.9, "Bob", "Bob: I started at the bank last year", text="I started at the bank last year")]
    assert [i for i, _ in rerank(plain, head, p)] == ["a", "b"]
    assert [i for i, _ in rerank(replace(plain, asks_time=True), head, replace(p, temporal_boost=0.5))] == ["b", "a"]
    cands = Candidates({"a": 0.6, "b": 0.5}, {"a": 2.0, "b": 1.0})

    def load(ranked: list[tuple[str, float]], depth: int) -> tuple[list[HeadEntry], list[tuple[str, float]]]:
        by_id = {h.id: h for h in head}
        return [by_id[i]._replace(score=s) for i, s in ranked[:depth]], ranked[depth:]

    assert rank_candidates(plain, cands, p, 2, load) == rank_candidates(plain.text, cands, p, 2, load)


def _top(mem: AgentMemory, question: str, user: str) -> str:
    return mem.recall(question, user_id=user, k=1)[0].text


def test_a_name_spelt_otherwise_still_names_the_speaker(tmp_path: Path) -> None:
    with AgentMemory(tmp_path / "s", consolidation="off", kv_encoding="off") as mem:
        mem.remember_many([
            dict(text="My favourite food is spicy ramen with an egg on top", user_id="u", session_id="s1",
                 kind="turn", speaker="Fahim Khan", timestamp="29.12.2023, 00:51:12"),
            dict(text="I like ramen too", user_id="u", session_id="s1", kind="turn", speaker="Muhhamed",
                 timestamp="29.12.2023, 00:52:40"),
        ])
        assert _top(mem, "What food does Muhammad like?", "u") == "I like ramen too"
        assert _top(mem, "What food does Fahim like?", "u").startswith("My favourite food")
