"""research/query_tower_ablation.py: LoRA starts as the base model, the loss falls, the folds never train on the
conversation they score."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import query_tower_ablation as qt  # noqa: E402

from agentmem.embed.minilm import bundled_embedding_model_path  # noqa: E402

TEXTS = ["When did Caroline go to the LGBTQ support group?", "What is Melanie's hobby?",
         "Where did Jon move to?", "Which book did she recommend?"]


@pytest.fixture(scope="module")
def tower() -> qt.Tower:
    return qt.Tower(bundled_embedding_model_path(), TEXTS, top=2)


def test_lora_with_b_zero_reproduces_the_base_model(tower: qt.Tower) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bundled_embedding_model_path()))
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = tower.full(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    full = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=1).numpy()
    layers, params = tower.fresh(rank=4, alpha=8.0)
    assert len(params) == 2 * 2 * len(qt.LINEARS)  # A and B on every linear of the 2 top layers
    np.testing.assert_allclose(tower.encode_all(layers), full, atol=1e-5)  # the cached lower layers: exact
    np.testing.assert_allclose(tower.encode_all(tower.top_layers), full, atol=1e-5)


def test_training_lowers_the_loss_and_leaves_the_base_layers_alone(tower: qt.Tower) -> None:
    rng = np.random.default_rng(0)
    V = rng.normal(size=(6, 384)).astype(np.float32)
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    before = [p.detach().clone() for p in tower.top_layers.parameters()]
    fits, losses = qt.train_tower(tower, [0, 1, 2, 3], ["c"] * 4, [[0], [1, 2], [3], [5]], {"c": V}, 3e-3,
                                  [0, 20], rank=4, alpha=8.0, batch=4)
    assert losses[-1] < 0.5 * losses[0]
    assert not np.allclose(fits[0], fits[20])
    assert all(torch.equal(a, b) for a, b in zip(before, tower.top_layers.parameters()))


def test_no_fold_trains_on_the_conversation_it_scores() -> None:
    convs = ["x"] * 3 + ["y"] * 2 + ["z"] * 2 + ["w"] * 2
    seen: list[frozenset] = []

    def fit(train: frozenset, lr: float) -> dict[int, np.ndarray]:
        seen.append(train)
        # each vector records which conversations trained it: row j = 1 where conversation k was in train
        return {1: np.array([[float(k in train) for k in "wxyz"] for _ in convs])}

    scored: dict[str, list[np.ndarray]] = {}

    def recall(Q: np.ndarray, a: float, idx: list[int]) -> list[dict[int, float]]:
        for j in idx:
            scored.setdefault(convs[j], []).append(Q[j])
        return [{5: 1.0, 10: 1.0} for _ in idx]

    r = qt.nested(convs, fit, recall, [(1e-3, 1, 1.0), (3e-4, 1, 1.0)], {"cv": None})["cv"]
    for c, rows in scored.items():  # every vector a conversation's questions were scored with: trained without it
        assert all(row["wxyz".index(c)] == 0.0 for row in rows)
    for held, X in zip(sorted(set(convs)), r["crossed"]):  # cross-fitted: no question's own conversation
        for j, c in enumerate(convs):
            assert X[j]["wxyz".index(c)] == 0.0
            assert X[j]["wxyz".index(held)] == 0.0
    assert max(len(s) for s in seen) == 3 and min(len(s) for s in seen) == 2


def test_loss_prefers_the_evidence() -> None:
    V = {"c": torch.eye(3)}
    q = torch.nn.functional.normalize(torch.tensor([[1.0, 0.2, 0.0]]), dim=1)
    assert float(qt.tower_loss(q, ["c"], [[0]], V, 0.05)) < float(qt.tower_loss(q, ["c"], [[1, 2]], V, 0.05))
