"""research/padded_dataset.py: each dev conversation grows past the target with its questions kept, in the same
format the dev set has."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import padded_dataset as pd  # noqa: E402
import recall_by_history_size as rh  # noqa: E402


@pytest.mark.parametrize("speakers", ["own", "others"])
def test_the_written_file_is_the_dev_set_grown_to_the_target(tmp_path: Path, speakers: str) -> None:
    if not rh.DATA["realtalk"].exists():
        pytest.skip("no REALTALK dev set here")
    out = tmp_path / "grown.json"
    result = pd.main(["--dataset", "realtalk", "--pad-to", "1000", "--speakers", speakers, "--out", str(out)])
    dev = json.loads(rh.DATA["realtalk"].read_text())
    grown = json.loads(out.read_text())
    assert [c["conversation_id"] for c in grown] == [c["conversation_id"] for c in dev]
    for conv, mine in zip(dev, grown):
        assert mine["qa"] == conv["qa"] and mine["sessions"][: len(conv["sessions"])] == conv["sessions"]
        speakers_seen = {t["speaker"] for s in mine["sessions"] for t in s["turns"]}
        assert (speakers_seen == {conv["speaker_a"], conv["speaker_b"]}) == (speakers == "own")
    assert all(n >= 1000 for n in result["turns"]) and result["out"] == str(out)
