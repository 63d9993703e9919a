"""research/grouped_sdpa_attention.py: both attention functions agree, each is timed, the last line is its JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import grouped_sdpa_attention as gsa  # noqa: E402


def test_times_both_paths_and_reports_identical_outputs(capsys) -> None:
    result = gsa.main(["--pairs", "16:4", "16:1", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
                       "--dtype", "float32", "--repeats", "3"])
    assert [(r["cached"], r["new_tokens"]) for r in result["rows"]] == [(16, 4), (16, 1)]
    assert all(r["identical"] and r["stock_us"] > 0 and r["grouped_us"] > 0 for r in result["rows"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
