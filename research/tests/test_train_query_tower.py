"""research/train_query_tower.py: several datasets' caches merge into one set of conversations to train on."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import train_query_tower as tqt  # noqa: E402


def _cache(conv: str, questions: int) -> dict:
    turn = {"id": f"{conv}-t0", "session": f"{conv}-s1", "line": "A: hi", "text": "hi", "speaker": "A"}
    return {"questions": [SimpleNamespace(conv=conv, text=f"q{j}", gold={turn["id"]}) for j in range(questions)],
            "rows": {turn["id"]: {}}, "places": {turn["id"]: {}}, "turns": {conv: [turn]},
            "vecs": {conv: np.ones((1, 4))}, "ctx": {conv: np.ones((1, 4))}, "qvecs": np.ones((questions, 4))}


def test_caches_merge_into_every_conversation_and_question() -> None:
    data = tqt.merged([_cache("26", 2), _cache("rt1", 3)])
    assert data.convs == ["26", "rt1"]
    assert [q.conv for q in data.questions] == ["26", "26", "rt1", "rt1", "rt1"]
    assert data.qvecs.shape == (5, 4) and set(data.vecs) == set(data.turns) == {"26", "rt1"}


def test_a_conversation_id_in_two_caches_is_refused() -> None:
    with pytest.raises(ValueError, match="more than one cache"):
        tqt.merged([_cache("26", 1), _cache("26", 1)])
