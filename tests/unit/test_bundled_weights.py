"""The fitted files the package ships: each sits in its part's ``weights/`` folder and loads. A missing file would
silently switch its fitted model off (the code falls back), so it is checked here; that package data covers them is
tests/infra/test_packaging.py's check."""

from __future__ import annotations

from agentmem.consolidate.pairs import WEIGHTS, PairModel
from agentmem.embed.query_tower import BUNDLED_TOWER, QueryTower
from agentmem.factory import query_tower_path


def test_the_supersession_model_ships_and_loads() -> None:
    assert WEIGHTS.is_file() and WEIGHTS.parent.name == "weights"
    model = PairModel.bundled()
    assert model is not None and model.dim == 384  # the bundled all-MiniLM-L6-v2


def test_the_query_tower_ships_and_is_the_default() -> None:
    assert BUNDLED_TOWER.is_file() and BUNDLED_TOWER.parent.name == "weights"
    assert query_tower_path("auto", None) == BUNDLED_TOWER
    assert QueryTower.load(BUNDLED_TOWER).digest

