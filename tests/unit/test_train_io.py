"""Trained-prefix bytes round-trip bit-exactly; staleness follows the document and the model."""

from __future__ import annotations

import pytest
import torch

from agentmem.errors import BlobCorruptedError, StaleEntryError
from agentmem.kv.testing import tiny_causal_lm
from agentmem.train import TrainedPrefix, TrainOptions, check_fresh, document_digest, is_stale, train_prefix
from agentmem.train import _kv

DOC = "[1 May 2023] Ann: My sister Mia runs a bakery in Bergen and I visit her every June.\n" * 2

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matmuls: see tests/conftest.py


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


def test_engine_codec_round_trip_and_mount_match_training(trained):
    """The facade path: engine bytes for the blob, record in metadata; mounted at its offset = what training saw."""
    from agentmem.kv import KVEngine, prefill, rotary_inv_freq
    from agentmem.kv.mount import assemble
    from agentmem.train import PromptLayout
    from agentmem.train.evaluate import mounted_context

    tp, model, tok = trained
    engine = KVEngine(model, tok)
    assert tp.record["preamble_digest"] == engine.layout.preamble_digest
    entry = engine.from_bytes(engine.to_bytes(tp.to_entry()))
    back = TrainedPrefix.from_entry(entry, tp.record)
    assert torch.equal(back.keys, tp.keys) and torch.equal(back.values, tp.values) and back.offset == tp.offset

    layout = PromptLayout.for_tokenizer(tok)
    suffix = layout.question_ids("Where does Mia run her bakery?")
    pre_k, pre_v = engine.preamble_kv()
    cache, spans = assemble(pre_k, pre_v, [entry], rotary_inv_freq(model), capacity=256)
    assert spans == [(tp.offset, tp.offset + tp.tokens)]  # mounted exactly where it was trained
    mounted = prefill(model, cache, suffix, logits_to_keep=0)
    ctx = mounted_context(model, layout.preamble_ids(), *tp.kv())
    hidden, _ = _kv.forward_hidden(model, torch.tensor([suffix]), _kv.cache_from(*ctx))
    seen_in_training = model.get_output_embeddings()(hidden)[0]
    torch.testing.assert_close(mounted, seen_in_training, atol=1e-4, rtol=1e-4)


def test_stale_on_preamble_change(trained):
    tp, _, _ = trained
    assert is_stale(tp.record, DOC, None, preamble_digest=tp.record["preamble_digest"]) is None
    assert "preamble" in is_stale(tp.record, DOC, None, preamble_digest="0" * 64)


def test_memory_kv_is_the_documents_kv_after_the_preamble(trained):
    """``memory_kv`` (the untrained baseline of benchmarks/trained_entry.py): the KV of the memory tokens alone, as
    the one-pass text context holds them after the preamble; mounted after the preamble it is that context again."""
    from agentmem.train import PromptLayout
    from agentmem.train.evaluate import context_kv, memory_kv, mounted_context

    _, model, tok = trained
    layout = PromptLayout.for_tokenizer(tok)
    pre, doc = layout.preamble_ids(), layout.document_ids(DOC)[:16]
    keys, values = memory_kv(model, pre, doc)
    assert keys.shape[2] == values.shape[2] == len(doc)
    text_k, text_v = context_kv(model, pre, doc)
    torch.testing.assert_close(keys, text_k[:, :, len(pre):], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(values, text_v[:, :, len(pre):], atol=1e-4, rtol=1e-4)
    mounted_k, _ = mounted_context(model, pre, keys, values)
    torch.testing.assert_close(mounted_k, text_k, atol=1e-4, rtol=1e-4)
