"""research/sentence_conflicts_same_store.py: the previous check it compares with takes a memory of several
sentences whole, at the pairwise model's ``supersede``, whatever the sentences and the query."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import sentence_conflicts_same_store as same_store  # noqa: E402


def test_the_previous_check_reads_the_whole_memory_score_only() -> None:
    consolidator = SimpleNamespace(pairs=SimpleNamespace(supersede=0.24))
    got = same_store.previous_check(consolidator, 0, {1: 0.3, 2: 0.1, 3: 0.24}, [1, 2, 3], None, None, None, None)
    assert got == [1, 3]
