"""docs/results.md is generated from the committed benchmark results (scripts/make_results.py), never stale."""

from __future__ import annotations

import doctest
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make_results.py"


def _load():
    spec = importlib.util.spec_from_file_location("make_results", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_results"] = module
    spec.loader.exec_module(module)
    return module


def test_the_committed_page_is_what_the_committed_results_generate() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_row_naming_a_record_that_is_not_there_is_an_error() -> None:
    mr = _load()
    row = {"title": "t", "command": "c", "source": "locomo_round3.jsonl", "match": {"consolidation": "nope"},
           "show": ["recall@5"]}
    with pytest.raises(mr.ResultsError, match="no record"):
        mr.render_row(row)
    with pytest.raises(mr.ResultsError, match="not under docs"):
        mr.render_row({**row, "source": "missing.jsonl"})


def test_goals_are_checked_on_the_record_shown(tmp_path: Path) -> None:
    mr = _load()
    record = {"recall@10": 0.8, "by_category": {"1": 0.6, "2": 0.5}, "min_score": {"0.5": {"kept@10": 0.88}}}
    assert mr.check(record, "min_score.0.5.kept@10 >= 0.8")  # a key with a dot in it
    assert mr.check(record, "recall@10 >= 0.8")
    assert not mr.check(record, "recall@10 > 0.8")
    assert mr.check(record, "by_category.* >= 0.5") and not mr.check(record, "by_category.* >= 0.55")
    with pytest.raises(mr.ResultsError, match="no field"):
        mr.check(record, "recall@5 >= 0.1")


def test_label_lines_label_the_results_below_them() -> None:
    mr = _load()
    assert doctest.testmod(mr).failed == 0
