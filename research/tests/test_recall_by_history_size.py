"""research/recall_by_history_size.py: the padding is later history of the same user in time order, the fixed
question set only asks about the first chunk, and the slope does not read a difference between conversations as an
effect of history size."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import recall_by_history_size as rh  # noqa: E402


@pytest.fixture(params=sorted(rh.DATA))
def convs(request: pytest.FixtureRequest) -> list[dict]:
    """One dev set's conversations."""
    if not rh.DATA[request.param].exists():
        pytest.skip(f"{rh.DATA[request.param]} is not here")
    return json.loads(rh.DATA[request.param].read_text())


def test_padding_follows_the_conversation_in_time_and_reaches_the_target(convs: list[dict]) -> None:
    for index, conv in enumerate(convs):
        pad = rh.padding(convs, index, 1400)
        whole = conv["sessions"] + pad["sessions"]
        dates = [rh.parse_date(s["date_time"])[0] for s in whole]
        assert dates == sorted(dates) and len(set(dates)) == len(dates)
        assert [s["session"] for s in whole] == list(range(1, len(whole) + 1))  # no session id reused
        own = {t["dia_id"] for s in conv["sessions"] for t in s["turns"]}
        assert not own & {t["dia_id"] for s in pad["sessions"] for t in s["turns"]}
        turns = [sum(len(s["turns"]) for s in whole[:n]) for n in range(len(whole) + 1)]
        assert turns[-1] >= 1400 > turns[-2]  # whole sessions, the last one crosses the target
        assert pad["conversation_id"] == conv["conversation_id"] and pad["qa"] == []
        cuts = rh.pad_cuts(conv, pad, [1000, 1400])
        assert cuts[-1] == len(pad["sessions"]) and turns[len(conv["sessions"]) + cuts[0]] >= 1000


def test_the_fixed_questions_ask_only_about_the_first_quarter() -> None:
    conv = json.loads(rh.DATA["locomo"].read_text())[0] if rh.DATA["locomo"].exists() else pytest.skip("no LoCoMo")
    first = rh.session_cuts(conv)[0]
    early = {t["dia_id"] for s in conv["sessions"][:first] for t in s["turns"]}
    held = {t["dia_id"] for s in conv["sessions"] for t in s["turns"]}
    fixed = rh.asked_within(conv, early)["qa"]
    assert fixed and len(fixed) < len(conv["qa"])
    assert all({d for d in qa["evidence"] if d in held} <= early for qa in fixed)
    late = [qa for qa in conv["qa"] if qa not in fixed and set(qa.get("evidence") or []) & held]
    assert all(set(qa["evidence"]) & (held - early) for qa in late)


def test_the_slope_reads_change_within_a_conversation_not_between_them() -> None:
    # the longer conversation scores lower throughout, but neither changes as its history grows
    flat = [("short", 400, 0.9, 10), ("short", 1000, 0.9, 10), ("long", 700, 0.5, 10), ("long", 1400, 0.5, 10)]
    assert rh.within_slope(flat) == 0
    falling = [("a", 500, 0.8, 4), ("a", 1500, 0.7, 4), ("b", 500, 0.6, 8), ("b", 1500, 0.5, 8)]
    assert rh.within_slope(falling) == pytest.approx(-0.1)


def test_padding_told_by_the_own_pair_names_no_one_else(convs: list[dict]) -> None:
    for index, conv in enumerate(convs):
        pair = {conv["speaker_a"], conv["speaker_b"]}
        pad = rh.padding(convs, index, 1400, speakers="own")
        plain = rh.padding(convs, index, 1400)
        assert {t["speaker"] for s in pad["sessions"] for t in s["turns"]} == pair
        assert [t["dia_id"] for s in pad["sessions"] for t in s["turns"]] == \
            [t["dia_id"] for s in plain["sessions"] for t in s["turns"]]  # the same turns, renamed
        others = {n for c in convs if c is not conv for n in (c["speaker_a"], c["speaker_b"])} - pair
        firsts = {n.split()[0].lower() for n in others}
        words = {w.strip(".,!?:;'\"()").lower() for s in pad["sessions"] for t in s["turns"] for w in t["text"].split()}
        assert not firsts & words
