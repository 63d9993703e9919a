"""The query tower (agentmem.embed.query_tower): LoRA deltas merged into a copy of MiniLM for search queries only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from agentmem.errors import InvalidInputError
from agentmem.factory import query_tower_path
from agentmem.embed.query_tower import BUNDLED_BASE, BUNDLED_TOWER, QueryTower, save_tower
from agentmem.embed.minilm import MiniLMEmbedder

QUERIES = ["what did the dentist recommend?", "Would Caroline pursue writing as a career?", "hi"]
TOP = ("encoder.layer.5.attention.self.query", "encoder.layer.5.output.dense", "encoder.layer.4.intermediate.dense")


def _tower(path: Path, *, zero: bool, seed: int = 0) -> Path:
    """A rank-4 tower over three of MiniLM's linear layers: B = 0 (the base model) or random."""
    g = torch.Generator().manual_seed(seed)
    shapes = {TOP[0]: (384, 384), TOP[1]: (384, 1536), TOP[2]: (1536, 384)}
    deltas = {}
    for name, (out, inp) in shapes.items():
        a = torch.randn(4, inp, generator=g) / inp ** 0.5
        b = torch.zeros(out, 4) if zero else torch.randn(out, 4, generator=g) * 0.05
        deltas[name] = (a, b)
    return save_tower(path, deltas, scale=2.0, base=BUNDLED_BASE)


def test_a_zero_tower_is_the_base_model_and_a_tuned_one_moves_queries_but_never_what_is_stored(tmp_path: Path) -> None:
    base = MiniLMEmbedder(cache_dir=tmp_path, onnx_queries=False)
    zero = MiniLMEmbedder(cache_dir=tmp_path, onnx_queries=False, query_tower=_tower(tmp_path / "z.safetensors", zero=True))
    tuned = MiniLMEmbedder(cache_dir=tmp_path, onnx_queries=False, query_tower=_tower(tmp_path / "t.safetensors", zero=False))
    for q in QUERIES:
        np.testing.assert_allclose(zero.encode_query(q), base.encode_query(q), atol=1e-6)
        moved = float(tuned.encode_query(q) @ base.encode_query(q))
        assert 0.3 < moved < 0.999  # a different vector, still a unit vector of the same space
        assert np.linalg.norm(tuned.encode_query(q)) == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_array_equal(tuned.encode(QUERIES), base.encode(QUERIES))  # documents: the base model
    # the merged copy is separate: the base model's weights are what they were
    w = dict(base.model[0].auto_model.named_parameters())[f"{TOP[0]}.weight"]
    w_tuned = dict(tuned.tuned_model[0].auto_model.named_parameters())[f"{TOP[0]}.weight"]
    assert not torch.equal(w, w_tuned)
    assert torch.equal(w, dict(MiniLMEmbedder(cache_dir=tmp_path).model[0].auto_model.named_parameters())[f"{TOP[0]}.weight"])


def test_the_towers_onnx_query_graph_is_its_own_and_matches_the_tuned_model(tmp_path: Path) -> None:
    path = _tower(tmp_path / "t.safetensors", zero=False, seed=1)
    torch_path = MiniLMEmbedder(cache_dir=tmp_path, onnx_queries=False, query_tower=path)
    for int8 in (False, True):
        onnx = MiniLMEmbedder(cache_dir=tmp_path, int8_queries=int8, query_tower=path)
        assert onnx._query_encoder(ffn_int8=int8, tower=True) is not None
        got = np.stack([onnx.encode_query(q) for q in QUERIES])
        want = np.stack([torch_path.encode_query(q) for q in QUERIES])
        cosines = (got * want).sum(1)
        assert cosines.min() > (0.98 if int8 else 0.99999)
    # the base model's int8 graph is another file: building the tower's did not replace it
    base = MiniLMEmbedder(cache_dir=tmp_path)
    reference = base.model.encode(QUERIES[:1], normalize_embeddings=True, convert_to_numpy=True)[0]
    assert float(base.encode_query(QUERIES[0]) @ reference) > 0.99
    assert float(MiniLMEmbedder(cache_dir=tmp_path, query_tower=path).encode_query(QUERIES[0]) @ reference) < 0.99


def test_a_bad_tower_file_is_a_typed_error_naming_the_problem(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="not found"):
        QueryTower.load(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(InvalidInputError, match="not a readable safetensors"):
        QueryTower.load(tmp_path / "junk.safetensors")
    from safetensors.torch import save_file

    save_file({"x.lora_A.weight": torch.zeros(2, 3)}, str(tmp_path / "fmt.safetensors"), metadata={"format": "other"})
    with pytest.raises(InvalidInputError, match="format"):
        QueryTower.load(tmp_path / "fmt.safetensors")
    wrong = save_tower(tmp_path / "shape.safetensors", {TOP[0]: (torch.zeros(2, 100), torch.zeros(384, 2))},
                       scale=1.0, base="another-model")
    with pytest.raises(InvalidInputError, match="delta is"):
        QueryTower.load(wrong).merged(MiniLMEmbedder(cache_dir=tmp_path).model)
    absent = save_tower(tmp_path / "absent.safetensors", {"encoder.layer.9.output.dense": (torch.zeros(2, 1536),
                                                                                           torch.zeros(384, 2))},
                        scale=1.0, base=BUNDLED_BASE)
    with pytest.raises(InvalidInputError, match="no linear layer"):
        QueryTower.load(absent).merged(MiniLMEmbedder(cache_dir=tmp_path).model)


def test_the_config_setting_names_the_tower_the_embedder_gets(tmp_path: Path) -> None:
    assert query_tower_path(None, None) is None
    assert query_tower_path("auto", "/models/another") is None  # the bundled tower is MiniLM's only
    assert query_tower_path("auto", None) == (BUNDLED_TOWER if BUNDLED_TOWER.is_file() else None)
    assert query_tower_path(str(tmp_path / "t.safetensors"), "/models/another") == tmp_path / "t.safetensors"


def test_the_bundled_tower_is_minilms_and_the_default_for_the_bundled_model(tmp_path: Path) -> None:
    from agentmem import AgentMemory

    tower = QueryTower.load(BUNDLED_TOWER)
    assert tower.base == BUNDLED_BASE and len(tower.modules) == 12  # 6 linear layers in each of the top two
    assert {m.split(".")[2] for m in tower.modules} == {"4", "5"}
    with AgentMemory(tmp_path / "on") as on, AgentMemory(tmp_path / "off", query_tower=None) as off:
        assert on._store.embedder.query_tower.digest == tower.digest and off._store.embedder.query_tower is None
        for mem in (on, off):
            mem.remember("I'm still looking into counseling and mental health jobs.", user_id="u")
            mem.remember("The quarterly report is due to the finance team on Friday.", user_id="u")
        # the same stored vectors, another query vector: the tower is a query-side change only
        line = "I'm still looking into counseling and mental health jobs."
        np.testing.assert_array_equal(on._store.embedder.encode([line]), off._store.embedder.encode([line]))
        question = "Would she pursue a career in psychology?"
        assert float(on._store.embed_query(question) @ off._store.embed_query(question)) < 0.99
        for mem in (on, off):
            assert "counseling" in mem.recall(question, user_id="u", k=1)[0].text
