"""research/embedder_ablation.py: the pure parts (predecessors read back, exact fused pools, the nested pick)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import embedder_ablation as ea  # noqa: E402
import learned_ablation as la  # noqa: E402

from agentmem.entries.context_vectors import context_vector  # noqa: E402
from agentmem.recall.retrieval import Candidates  # noqa: E402


def _data(questions: list = ()) -> la.Data:
    """One conversation of three turns in one session: a, then b, then c (each one's context vector from the one
    before), and a fourth, d, that opens its own session."""
    rng = np.random.default_rng(0)
    V = rng.normal(size=(4, 8)).astype(np.float32)
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    C = np.stack([context_vector(V[0], None), context_vector(V[1], V[0]), context_vector(V[2], V[1]),
                  context_vector(V[3], None)])
    turns = {"c1": [{"id": i} for i in "abcd"]}
    return la.Data(list(questions), {}, {}, turns, {"c1": V}, {"c1": C}, np.zeros((0, 8), np.float32))


def test_predecessors_are_read_back_from_the_context_vectors() -> None:
    assert ea.predecessors(_data()) == {"a": None, "b": "a", "c": "b", "d": None}


def test_exact_pools_mix_the_two_cosines_and_keep_the_lexical_pool() -> None:
    ids = ["a", "b"]
    m = {"minilm": np.eye(2, dtype=np.float32), "minilm_ctx": np.eye(2, dtype=np.float32),
         "mpnet": np.eye(2, dtype=np.float32)[::-1], "mpnet_ctx": np.eye(2, dtype=np.float32)[::-1]}
    q = SimpleNamespace(cands=Candidates({}, {"b": 3.0}))
    qv = np.array([1.0, 0.0], np.float32)  # MiniLM: a; mpnet (rows swapped): b
    assert list(ea.exact_pools(q, (ids, m), qv, qv, 0.0, {}).dense) == ["a", "b"]
    got = ea.exact_pools(q, (ids, m), qv, qv, 1.0, {})
    assert list(got.dense) == ["b", "a"] and list(got.turn_context) == ["b", "a"]
    assert got.lexical == {"b": 3.0}
    assert ea.exact_pools(q, (ids, m), qv, qv, 0.5, {}).dense == {"a": 0.5, "b": 0.5}


def test_nested_pick_chooses_on_the_other_conversations() -> None:
    qs = [SimpleNamespace(conv=c) for c in ("x", "y", "z")]
    data = _data(qs)
    good = {5: 1.0, 10: 1.0}
    bad = {5: 0.0, 10: 0.0}
    per = {"u": [good, bad, bad], "v": [bad, good, good]}
    held, chosen = ea.nested_pick(data, per)
    # x held out: y and z decide (v); y or z held out: a tie, the first listed (u); never the held-out one's own
    assert chosen == ["v", "u", "u"]
    assert held == [bad, bad, bad]


def test_texts_key_depends_on_order() -> None:
    assert ea.texts_key(["a", "b"]) != ea.texts_key(["b", "a"])


def test_the_identity_map_gives_back_the_minilm_query_and_pools() -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 6)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    W = ea.fit_map(X, X, 0.0)  # MiniLM -> MiniLM: the map must be the identity (bias 0)
    q = rng.normal(size=6).astype(np.float32)
    np.testing.assert_allclose(ea.apply_map(W, q), q / np.linalg.norm(q), atol=1e-5)
    ids = [f"e{n}" for n in range(40)]
    m = {"minilm": X, "minilm_ctx": X, "mpnet": X, "mpnet_ctx": X}
    qq = SimpleNamespace(cands=Candidates({}, {}))
    base = ea.exact_pools(qq, (ids, m), q, q, 0.0, {})
    for a in (0.5, 1.0):  # the identity-mapped query fused with itself: the MiniLM baseline's pools
        got = ea.exact_pools(qq, (ids, m), q, ea.apply_map(W, q), a, {})
        assert list(got.dense) == list(base.dense)
        np.testing.assert_allclose(list(got.dense.values()), list(base.dense.values()), atol=1e-5)


def test_the_map_is_fitted_on_the_training_lines_and_its_ridge_chosen_inside() -> None:
    rng = np.random.default_rng(2)
    A = rng.normal(size=(4, 3))  # a true linear map MiniLM -> mpnet: the least ridge wins, held out cos ~1
    conv = {}
    for c in "wxyz":
        X = rng.normal(size=(30, 4)).astype(np.float32)
        conv[c] = ([], {"minilm": X, "mpnet": (X @ A).astype(np.float32)})
    spaces = SimpleNamespace(conv=conv)
    W, ridge = ea.fold_map(spaces, ["w", "x", "y"])
    assert ridge == min(ea.MAP_RIDGES)
    assert ea.line_cos(W, spaces, ["z"]) > 0.999
