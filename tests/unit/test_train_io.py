"""Trained-prefix bytes round-trip bit-exactly; staleness follows the document and the model."""

from __future__ import annotations

import pytest
import torch

from agentmem.errors import BlobCorruptedError, StaleEntryError
from agentmem.kv.testing import tiny_causal_lm
from agentmem.train import TrainedPrefix, TrainOptions, check_fresh, document_digest, is_stale, train_prefix
from agentmem.train import _kv

DOC = "[1 May 2023] Ann: My sister Mia runs a bakery in Bergen and I visit her every June.\n" * 2

@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny matmuls gain nothing from a second thread, and on a shared 2-core box an OpenMP team waiting for a
    # descheduled thread makes them ~40x slower.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)



@pytest.fixture(scope="module")
def trained():
    model, tok = tiny_causal_lm("llama", seed=0)
    opts = TrainOptions(samples=2, batch_size=2, question_tokens=4, answer_tokens=4, chunk_tokens=64)
    return train_prefix(model, tok, DOC, tokens=12, steps=2, seed=3, options=opts, progress=False), model, tok


def test_bytes_round_trip_is_bit_exact(trained):
    tp, _, _ = trained
    back = TrainedPrefix.from_bytes(tp.to_bytes())
    assert torch.equal(back.keys, tp.keys) and torch.equal(back.values, tp.values)
    assert back.keys.dtype == tp.keys.dtype
    assert back.token_ids == tp.token_ids and back.offset == tp.offset
    assert back.record == tp.record
    # (the header's metadata order is not fixed by safetensors, so compare contents, not raw bytes)
    assert TrainedPrefix.from_bytes(back.to_bytes()).record == tp.record


def test_garbage_is_a_corrupted_blob(trained):
    tp, _, _ = trained
    blob = tp.to_bytes()
    for bad in (b"", b"not safetensors", blob[: len(blob) // 2]):
        with pytest.raises(BlobCorruptedError):
            TrainedPrefix.from_bytes(bad)


def test_stale_on_document_or_model_change(trained):
    tp, model, tok = trained
    fp = tp.record["model_fingerprint"]
    assert fp == _kv.model_fingerprint(model, tok)
    assert tp.record["document_sha256"] == document_digest(DOC)
    assert is_stale(tp.record, DOC, fp) is None
    check_fresh(tp.record, DOC, fp)

    assert "document changed" in is_stale(tp.record, DOC + " edited", fp)
    other, other_tok = tiny_causal_lm("llama", seed=1)  # same architecture, different weights
    other_fp = _kv.model_fingerprint(other, other_tok)
    assert other_fp != fp
    assert "model changed" in is_stale(tp.record, DOC, other_fp)
    with pytest.raises(StaleEntryError):
        check_fresh(tp.record, DOC, other_fp)
    with pytest.raises(StaleEntryError):
        check_fresh(tp.record, "a different manual", None)
