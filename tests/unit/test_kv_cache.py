"""The cache adapter: buffered caches behave like DynamicCache for the model, and grow/crop correctly."""

from __future__ import annotations

import torch

from agentmem.kv.cache import (
    cache_from_layers,
    cache_from_stacked,
    cache_layers,
    cache_length,
    crop_cache,
    new_dynamic_cache,
    stacked_from_cache,
)
from agentmem.kv.mount import plan_mount
from agentmem.kv.rope import rerotate_keys
from agentmem.kv.runner import Sampling, decode, prefill
from agentmem.kv.testing import tiny_causal_lm


def test_buffered_cache_decodes_like_a_stock_dynamic_cache():
    model, tok = tiny_causal_lm("llama")
    ids = tok("The quick brown fox", add_special_tokens=False).input_ids
    stock = new_dynamic_cache()
    logits = prefill(model, stock, ids)
    expected = decode(model, stock, logits, max_new_tokens=12)

    warm = new_dynamic_cache()
    prefill(model, warm, ids[:-1])
    keys, values = stacked_from_cache(warm)
    buffered = cache_from_stacked(keys, values, capacity=len(ids) + 2)  # too small on purpose: must grow
    logits2 = prefill(model, buffered, ids[-1:])
    assert torch.allclose(logits, logits2, atol=1e-5)
    assert decode(model, buffered, logits2, max_new_tokens=12) == expected
    assert cache_length(buffered) == cache_length(stock)


def test_layers_round_trip_and_crop():
    model, tok = tiny_causal_lm("qwen2")
    cache = new_dynamic_cache()
    prefill(model, cache, tok("abcdefgh", add_special_tokens=False).input_ids)
    layers = cache_layers(cache)
    rebuilt = cache_from_layers([(k.clone(), v.clone()) for k, v in layers])
    assert cache_length(rebuilt) == 8 and len(rebuilt.layers) == 3
    keys, values = stacked_from_cache(cache)
    buffered = cache_from_stacked(keys, values)
    crop_cache(buffered, 5)
    crop_cache(rebuilt, 5)
    assert cache_length(buffered) == cache_length(rebuilt) == 5
    for (a, _), (b, _) in zip(cache_layers(buffered), cache_layers(rebuilt)):
        assert torch.equal(a, b)
    # After a crop, new tokens overwrite the dropped slots.
    prefill(model, buffered, [1, 2])
    assert cache_length(buffered) == 7


def test_zero_copy_adoption_writes_into_the_given_buffers():
    keys = torch.zeros(2, 1, 2, 10, 16)
    values = torch.zeros_like(keys)
    cache = cache_from_stacked(keys, values, length=3, copy=False)
    model, _ = tiny_causal_lm("llama")
    prefill(model, cache, [5, 6])
    assert cache_length(cache) == 5
    assert keys[..., 3:5, :].abs().sum() > 0 and keys[..., 5:, :].abs().sum() == 0


def test_plan_mount_keeps_what_fits_in_relevance_order():
    plan = plan_mount([10, 10, 10], preamble_len=5, suffix_len=5, max_new_tokens=10, max_positions=45)
    assert plan.keep == [0, 1] and plan.drop == [2] and plan.memory_tokens == 20
    # a memory too long for the budget is dropped; the shorter ones after it are still mounted, in order
    plan = plan_mount([10, 1, 1], preamble_len=5, suffix_len=5, max_new_tokens=0, max_positions=100, budget_tokens=5)
    assert plan.keep == [1, 2] and plan.drop == [0] and plan.memory_tokens == 2
    plan = plan_mount([4, 3, 1], preamble_len=5, suffix_len=5, max_new_tokens=0, max_positions=100, budget_tokens=5)
    assert plan.keep == [0, 2] and plan.drop == [1]  # best first: the first memory is never given up for later ones
    plan = plan_mount([], preamble_len=5, suffix_len=5, max_new_tokens=100, max_positions=50, margin=4)
    assert plan.max_new_tokens == 36 and plan.notes


def test_sampling_respects_top_k():
    model, tok = tiny_causal_lm("llama")
    cache = new_dynamic_cache()
    logits = prefill(model, cache, tok("hi", add_special_tokens=False).input_ids)
    top = int(logits.argmax())
    out = decode(model, cache, logits, max_new_tokens=1, sampling=Sampling(do_sample=True, top_k=1, seed=0))
    assert out == [top]


def test_removing_a_span_equals_encoding_without_it():
    from agentmem.kv.cache import remove_cache_span, rerotate_cache
    from agentmem.kv.rope import rotary_inv_freq

    model, tok = tiny_causal_lm("llama")
    inv = rotary_inv_freq(model)
    a, b = [5, 6, 7, 8], [9, 10, 11]
    # Layer-0 keys depend only on token and position, so removing a span and re-rotating the tail must equal
    # encoding the sequence without that span.
    full = new_dynamic_cache()
    prefill(model, full, a + [1, 2, 3] + b)
    keys, values = stacked_from_cache(full)
    for cache in (cache_from_stacked(keys, values), cache_from_layers([(k, v) for k, v in cache_layers(full)])):
        remove_cache_span(cache, 4, 7, inv)
        short = new_dynamic_cache()
        prefill(model, short, a + b)
        assert cache_length(cache) == 7
        assert torch.allclose(cache_layers(cache)[0][0], cache_layers(short)[0][0], atol=1e-5)
        rerotate_cache(cache, 4, 7, 3, inv)
        assert torch.allclose(cache_layers(cache)[0][0][..., 4:, :], cache_layers(full)[0][0][..., 7:, :], atol=1e-5)


def test_placing_on_a_helper_thread_writes_the_same_bytes(monkeypatch):
    import threading

    from agentmem.kv import mount as mount_mod
    from agentmem.kv.types import EncodedEntry

    torch.manual_seed(0)
    layers, heads, dim, pre = 8, 4, 64, 5
    inv = 1.0 / (10000 ** (torch.arange(dim // 2, dtype=torch.float32) / (dim // 2)))
    pre_k, pre_v = torch.randn(layers, 1, heads, pre, dim), torch.randn(layers, 1, heads, pre, dim)
    entries = [
        EncodedEntry(token_ids=torch.arange(n), keys=torch.randn(layers, heads, n, dim),
                     values=torch.randn(layers, heads, n, dim), offset=pre, fingerprint="f", preamble_digest="p")
        for n in (300, 250, 7, 200)
    ]
    threads: list[str] = []
    write = mount_mod.Mount._write

    def spy(self, jobs):
        threads.append(threading.current_thread().name)
        return write(self, jobs)

    monkeypatch.setattr(mount_mod.Mount, "_write", spy)
    monkeypatch.setattr(mount_mod, "_idle_cpus", lambda: 1)  # as if torch left a CPU free
    split, split_spans = mount_mod.assemble(pre_k, pre_v, entries, inv, capacity=800)
    assert any(name.startswith("agentmem-mount") for name in threads)  # the helper really placed entries

    monkeypatch.setenv("AGENTMEM_MOUNT_THREADS", "1")
    threads.clear()
    single, single_spans = mount_mod.assemble(pre_k, pre_v, entries, inv, capacity=800)
    assert threads == [threading.current_thread().name]
    assert split_spans == single_spans == [(5, 305), (305, 555), (555, 562), (562, 762)]
    for (k1, v1), (k2, v2) in zip(cache_layers(split), cache_layers(single)):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)
    # And the placement itself is right: entry 1's values sit at its span, its keys moved by 300 positions.
    (k0, v0) = cache_layers(split)[3]
    assert torch.equal(v0[0, :, 305:555], entries[1].values[3])
    moved = rerotate_keys(entries[1].keys[3], 300, inv, start=pre)
    assert (k0[0, :, 305:555] - moved).abs().max().item() <= 1e-6


def test_a_forked_child_gets_its_own_helper_thread(monkeypatch):
    import multiprocessing

    from agentmem.kv import mount as mount_mod

    monkeypatch.setattr(mount_mod, "_idle_cpus", lambda: 1)
    parent_pool = mount_mod._helper_thread()
    assert parent_pool.submit(lambda: 7).result(timeout=10) == 7  # the parent's thread exists
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:  # the child must not wait on the parent's (absent) thread
        assert pool.apply_async(_use_helper_in_child).get(timeout=60) == 42


def _use_helper_in_child() -> int:
    from agentmem.kv import mount as mount_mod

    mount_mod._idle_cpus = lambda: 1
    return mount_mod._helper_thread().submit(lambda: 42).result(timeout=20)
