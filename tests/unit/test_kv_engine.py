"""KVEngine end to end on tiny models: exactness of mounting, budgets, fallbacks, unsupported models."""

from __future__ import annotations

import logging

import pytest
import torch

from agentmem.errors import BlobCorruptedError, FingerprintMismatchError, InvalidInputError, UnsupportedModelError
from agentmem.kv.cache import cache_layers, new_dynamic_cache, stacked_from_cache
from agentmem.kv.engine import KVEngine
from agentmem.kv.fix import FixConfig, recompute_positions
from agentmem.kv.runner import prefill
from agentmem.kv.testing import tiny_causal_lm
from agentmem.kv.types import MemoryItem

MEMORIES = [
    "Caroline went to an LGBTQ support group on 7 May.",
    "Melanie ran a charity race for mental health.",
    "Caroline is researching adoption agencies.",
]
QUESTION = "What is Caroline researching?"


def _items(engine, texts=MEMORIES, blobs=True):
    entries = engine.encode_many(texts)
    if not blobs:
        return [MemoryItem(f"m{i}", t, lambda e=e: e) for i, (t, e) in enumerate(zip(texts, entries))]
    stored = [engine.to_bytes(e) for e in entries]
    return [MemoryItem(f"m{i}", t, lambda b=b: engine.from_bytes(b)) for i, (t, b) in enumerate(zip(texts, stored))]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def engine(request):
    return KVEngine(*tiny_causal_lm(request.param))


def test_one_mounted_entry_matches_text_reencoding(engine):
    items = _items(engine, MEMORIES[:1])
    kv, ids = engine.answer_logits(QUESTION, items, "adoption agencies", mode="kv")
    text, ids2 = engine.answer_logits(QUESTION, items, "adoption agencies", mode="text")
    assert ids == ids2 and kv.shape == (len(ids), len(engine.tokenizer))
    assert (kv - text).abs().max().item() <= 1e-4
    a = engine.generate(QUESTION, items, mode="kv", max_new_tokens=12)
    b = engine.generate(QUESTION, items, mode="text", max_new_tokens=12)
    assert a.token_ids == b.token_ids and len(a.token_ids) > 0
    assert a.mounted == ["m0"] and a.dropped == [] and a.fallbacks == []


def test_several_entries_differ_from_text_only_through_cross_attention(engine):
    items = _items(engine)
    kv, _ = engine.answer_logits(QUESTION, items, "adoption agencies", mode="kv")
    text, _ = engine.answer_logits(QUESTION, items, "adoption agencies", mode="text")
    # Entries encoded alone never saw each other, so logits are close but not equal...
    assert (kv - text).abs().max().item() > 1e-3
    # ...and recomputing every entry token in context recovers the text-mode cache exactly.
    prep = engine.prepare(QUESTION, items, mode="kv")
    ids = torch.tensor(engine.layout.preamble_ids + [t for m in MEMORIES for t in engine.layout.entry_ids(m)])
    recompute_positions(engine.model, prep.cache, ids, torch.arange(prep.spans[1][0], prep.spans[-1][1]))
    full = new_dynamic_cache()
    prefill(engine.model, full, ids)
    mounted_k, mounted_v = stacked_from_cache(prep.cache)
    text_k, text_v = stacked_from_cache(full)
    assert (mounted_k - text_k).abs().max().item() <= 1e-4
    assert (mounted_v - text_v).abs().max().item() <= 1e-4


@pytest.mark.parametrize("strategy", ["epic", "cacheblend"])
def test_kv_fix_strategies_run_and_only_touch_later_entries(engine, strategy):
    items = _items(engine)
    fixed = KVEngine(engine.model, engine.tokenizer, fix=FixConfig(strategy=strategy))
    plain = fixed.prepare(QUESTION, items, mode="kv")
    fix = fixed.prepare(QUESTION, items, mode="kv+fix")
    pk, _ = stacked_from_cache(plain.cache)
    fk, _ = stacked_from_cache(fix.cache)
    first_end = plain.spans[0][1]
    assert torch.equal(pk[..., :first_end, :], fk[..., :first_end, :])  # preamble + first entry were exact
    assert not torch.allclose(pk[-1, ..., first_end:, :], fk[-1, ..., first_end:, :])
    assert fix.timings["fix"] > 0
    result = fixed.generate(QUESTION, items, mode="kv+fix", max_new_tokens=4)
    assert result.mode == "kv+fix" and result.mounted == ["m0", "m1", "m2"]


def test_mounted_cache_has_the_models_gqa_shape(engine):
    prep = engine.prepare(QUESTION, _items(engine), mode="kv")
    config = engine.model.config
    head_dim = config.hidden_size // config.num_attention_heads
    layers = cache_layers(prep.cache)
    assert len(layers) == config.num_hidden_layers
    total = len(engine.layout.preamble_ids) + sum(len(engine.layout.entry_ids(m)) for m in MEMORIES)
    for k, v in layers:
        assert k.shape == v.shape == (1, config.num_key_value_heads, total, head_dim)
    assert prep.pending_ids == engine.layout.suffix_ids(QUESTION)


def test_budget_drops_what_does_not_fit_and_reports_it(engine):
    items = _items(engine)
    sizes = [len(engine.layout.entry_ids(m)) for m in MEMORIES]
    result = engine.generate(QUESTION, items, budget_tokens=sizes[0] + sizes[1], max_new_tokens=2)
    assert result.mounted == ["m0", "m1"] and result.dropped == ["m2"]
    assert any("dropped" in n for n in result.notes)
    result = engine.generate(QUESTION, items, budget_tokens=min(sizes) - 1, max_new_tokens=2)
    assert result.mounted == [] and result.dropped == ["m0", "m1", "m2"]
    # the best memory too long for the budget: the next ones that fit are still mounted, in their order
    result = engine.generate(QUESTION, items, budget_tokens=sizes[0] - 1, max_new_tokens=2)
    fits = [f"m{i}" for i in (1, 2) if sum(sizes[1:i + 1]) <= sizes[0] - 1]
    assert fits and result.mounted == fits and result.dropped == ["m0", *sorted({"m1", "m2"} - set(fits))]


def test_model_context_limit_is_never_overflowed(engine):
    items = _items(engine)
    pre, suf = len(engine.layout.preamble_ids), len(engine.layout.suffix_ids(QUESTION))
    first = len(engine.layout.entry_ids(MEMORIES[0]))
    small = KVEngine(engine.model, engine.tokenizer, position_margin=0)
    small.max_positions = pre + suf + first + 10  # room for the first entry and 10 new tokens
    result = small.generate(QUESTION, items, mode="kv", max_new_tokens=10)
    assert result.mounted == ["m0"] and result.dropped == ["m1", "m2"]
    assert result.prompt_tokens + result.max_new_tokens <= small.max_positions
    # Asking for more new tokens than fit: memories go first, then the allowance shrinks (noted), no crash.
    small.max_positions = pre + suf + 3
    result = small.generate(QUESTION, items, mode="text", max_new_tokens=50)
    assert result.mounted == [] and result.max_new_tokens == 3 and len(result.token_ids) <= 3
    assert any("reduced" in n for n in result.notes)


def test_foreign_and_corrupted_blobs_fall_back_to_text_with_a_reason(engine, caplog):
    entries = engine.encode_many(MEMORIES)
    foreign = KVEngine(*tiny_causal_lm(engine.model.config.model_type, seed=7))
    foreign_blob = foreign.to_bytes(foreign.encode(MEMORIES[1]))
    good = engine.to_bytes(entries[0])
    items = [
        MemoryItem("m0", MEMORIES[0], lambda: engine.from_bytes(good)),
        MemoryItem("m1", MEMORIES[1], lambda: engine.from_bytes(foreign_blob)),
        MemoryItem("m2", MEMORIES[2], lambda: engine.from_bytes(good[: len(good) // 2])),
    ]
    with caplog.at_level(logging.WARNING, logger="agentmem.kv.engine"):
        result = engine.generate(QUESTION, items, max_new_tokens=4)
    assert result.mounted == ["m0", "m1", "m2"]
    reasons = dict(result.fallbacks)
    assert set(reasons) == {"m1", "m2"}
    assert "FingerprintMismatchError" in reasons["m1"] and "BlobCorruptedError" in reasons["m2"]
    assert "m1" in caplog.text and "Melanie" not in caplog.text  # logged by id, without memory content
    # The fallback re-encodes the text, so the answer equals mounting freshly encoded entries.
    fresh = engine.generate(QUESTION, _items(engine), max_new_tokens=4)
    assert result.token_ids == fresh.token_ids
    with pytest.raises(FingerprintMismatchError):
        engine.generate(QUESTION, items[:2], max_new_tokens=4, strict=True)
    with pytest.raises(BlobCorruptedError):
        engine.generate(QUESTION, [items[2]], max_new_tokens=4, strict=True)


def test_entries_without_stored_kv_or_with_other_text_are_encoded_on_the_fly(engine):
    other = engine.encode("Something else entirely.")
    items = [MemoryItem("a", MEMORIES[0], None), MemoryItem("b", MEMORIES[1], lambda: other)]
    result = engine.generate(QUESTION, items, max_new_tokens=2)
    assert dict(result.fallbacks) == {"a": "no stored KV", "b": "stored KV token ids do not match the memory text"}


def test_mounting_never_modifies_stored_entries(engine):
    entries = engine.encode_many(MEMORIES)
    snapshots = [(e.keys.clone(), e.values.clone()) for e in entries]
    items = [MemoryItem(f"m{i}", t, lambda e=e: e) for i, (t, e) in enumerate(zip(MEMORIES, entries))]
    for mode in ("kv", "kv+fix"):
        engine.generate(QUESTION, items, mode=mode, max_new_tokens=3)
    for e, (k, v) in zip(entries, snapshots):
        assert torch.equal(e.keys, k) and torch.equal(e.values, v)


def test_timings_cover_every_stage(engine):
    result = engine.generate(QUESTION, _items(engine), max_new_tokens=3, retrieve_s=0.25)
    t = result.timings
    assert {"retrieve", "load", "mount", "fix", "prefill", "ttft", "decode", "total"} <= set(t)
    assert t["retrieve"] == 0.25 and t["ttft"] >= 0.25 + t["prefill"] and t["total"] >= t["ttft"]


def test_sampling_is_reproducible_with_a_seed(engine):
    items = _items(engine)
    a = engine.generate(QUESTION, items, max_new_tokens=8, do_sample=True, temperature=1.5, seed=3)
    b = engine.generate(QUESTION, items, max_new_tokens=8, do_sample=True, temperature=1.5, seed=3)
    assert a.token_ids == b.token_ids


def test_invalid_arguments_are_rejected(engine):
    with pytest.raises(InvalidInputError):
        engine.generate("  ", [], max_new_tokens=2)
    with pytest.raises(InvalidInputError):
        engine.generate(QUESTION, [], mode="fast")
    with pytest.raises(InvalidInputError):
        engine.encode("")


def test_gpt2_refuses_kv_modes_but_answers_in_text_mode():
    engine = KVEngine(*tiny_causal_lm("gpt2"))
    assert not engine.supports_kv
    items = [MemoryItem("m0", MEMORIES[0], None)]
    for mode in ("kv", "kv+fix"):
        with pytest.raises(UnsupportedModelError, match="absolute position"):
            engine.generate(QUESTION, items, mode=mode, max_new_tokens=2)
    with pytest.raises(UnsupportedModelError):
        engine.encode(MEMORIES[0])
    result = engine.generate(QUESTION, items, mode="text", max_new_tokens=4)
    assert result.mounted == ["m0"] and len(result.token_ids) <= 4


def test_a_memory_longer_than_the_context_is_rejected_at_encode(engine):
    small = KVEngine(engine.model, engine.tokenizer)
    small.max_positions = len(engine.layout.preamble_ids) + 20
    with pytest.raises(InvalidInputError, match="longer than the model's context"):
        small.encode("x" * 200)


@pytest.mark.parametrize("storage", [torch.float16, torch.bfloat16])
def test_half_precision_blobs_mount_without_a_separate_cast(engine, storage):
    half = KVEngine(engine.model, engine.tokenizer, storage_dtype=storage)
    entry = half.encode(MEMORIES[0])
    blob = half.to_bytes(entry)
    lazy = half.from_bytes(blob, cast=False)
    assert lazy.keys.dtype == storage
    eager = half.from_bytes(blob)
    assert eager.keys.dtype == torch.float32
    # The same entry twice: the second copy is re-rotated from the half-precision source straight into fp32.
    a = half.prepare(QUESTION, [MemoryItem(i, MEMORIES[0], lambda: lazy) for i in "mn"])
    b = half.prepare(QUESTION, [MemoryItem(i, MEMORIES[0], lambda: eager) for i in "mn"])
    assert a.fallbacks == [] and b.fallbacks == []
    ka, va = stacked_from_cache(a.cache)
    kb, vb = stacked_from_cache(b.cache)
    assert torch.allclose(ka, kb, atol=1e-6) and torch.equal(va, vb)
