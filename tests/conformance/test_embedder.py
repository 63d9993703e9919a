"""One conformance suite for every Embedder: the bundled MiniLM on each of its query paths (int8 feed-forward ONNX
graph, float ONNX graph, no ONNX, the bundled query tower) and an ``encode``-only embedder, which the store embeds
queries with too."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from agentmem.factory import query_encoder
from agentmem.ports import Embedder, QueryEmbedder
from agentmem.embed.query_tower import BUNDLED_TOWER
from agentmem.embed.minilm import MiniLMEmbedder as MiniLM

KINDS = ["minilm-int8-queries", "minilm-float-queries", "minilm-no-onnx", "minilm-query-tower", "encode-only"]

DOCS = [
    "Caroline moved to Boston last spring and rents a flat near the harbour.",
    "Melanie bakes sourdough bread every Sunday morning.",
    "The quarterly report is due to the finance team on Friday.",
]
QUERIES = [("Where does Caroline live?", 0), ("What does Melanie bake?", 1), ("When is the report due?", 2)]


class EncodeOnly:
    """A third-party embedder with only the base port: ``dim`` and ``encode`` (here: MiniLM's batch path)."""

    def __init__(self, inner: MiniLM) -> None:
        self._inner = inner

    @property
    def dim(self) -> int:
        return self._inner.dim

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        return self._inner.encode(texts, batch_size=batch_size)


@pytest.fixture(params=KINDS)
def embedder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Embedder:
    cache: Path = tmp_path_factory.getbasetemp() / "embedder-cache"  # one ONNX build per session, not per test
    if request.param == "minilm-int8-queries":
        return MiniLM(cache_dir=cache)
    if request.param == "minilm-float-queries":
        return MiniLM(cache_dir=cache, int8_queries=False)
    if request.param == "minilm-no-onnx":
        return MiniLM(cache_dir=cache, onnx_queries=False)
    if request.param == "minilm-query-tower":  # the default: search queries through the bundled tuned tower
        assert BUNDLED_TOWER.is_file(), "the package ships its query tower"
        return MiniLM(cache_dir=cache, query_tower=BUNDLED_TOWER)
    return EncodeOnly(MiniLM(cache_dir=cache))


def _assert_unit_rows(vecs: np.ndarray, rows: int, dim: int) -> None:
    assert vecs.dtype == np.float32 and vecs.shape == (rows, dim)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_is_an_embedder_with_a_positive_width(embedder: Embedder) -> None:
    assert isinstance(embedder, Embedder) and isinstance(embedder.dim, int) and embedder.dim > 0


def test_encode_of_no_texts_is_an_empty_matrix(embedder: Embedder) -> None:
    _assert_unit_rows(embedder.encode([]), 0, embedder.dim)


def test_encode_gives_unit_rows_independent_of_the_batch(embedder: Embedder) -> None:
    texts = DOCS + [q for q, _ in QUERIES]  # 6 texts: more than the short-input path takes
    batch = embedder.encode(texts, batch_size=4)
    _assert_unit_rows(batch, len(texts), embedder.dim)
    alone = np.stack([embedder.encode([t])[0] for t in texts])
    np.testing.assert_allclose(alone, batch, atol=2e-4)  # a row does not depend on its neighbours in the batch
    np.testing.assert_array_equal(embedder.encode(texts[:2]), embedder.encode(texts[:2]))  # deterministic


def test_a_query_vector_is_unit_and_finds_its_document(embedder: Embedder) -> None:
    docs = embedder.encode(DOCS)
    for query, expected in QUERIES:
        q = query_encoder(embedder)(query)
        _assert_unit_rows(q[None, :], 1, embedder.dim)
        assert int(np.argmax(docs @ q)) == expected, query


def test_the_query_path_stays_in_the_stored_vectors_space(embedder: Embedder) -> None:
    # a query embedder may take its own path (int8 weights, a query prompt, a tower tuned for questions), but its
    # vectors must rank documents as the stored side's own vector of the same text would: same nearest document,
    # and in the same space (a tuned tower moves a question to cosine ~0.7-0.9 of its plain vector; an unrelated
    # vector of this space would be ~0.1)
    docs = embedder.encode(DOCS)
    for query, _ in QUERIES:
        via_query, via_encode = query_encoder(embedder)(query), embedder.encode([query])[0]
        assert float(via_query @ via_encode) > 0.6
        assert int(np.argmax(docs @ via_query)) == int(np.argmax(docs @ via_encode))
    query = QUERIES[0][0]
    if isinstance(embedder, QueryEmbedder):  # the store takes the embedder's own query path ...
        np.testing.assert_array_equal(query_encoder(embedder)(query), embedder.encode_query(query))
    else:  # ... and the base port's query is exactly its encode row
        np.testing.assert_array_equal(query_encoder(embedder)(query), embedder.encode([query])[0])
