"""The KV engine on the real embedded SmolLM2-135M-Instruct (slow: loads the model)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from agentmem.kv import KVEngine, MemoryItem, load_model, model_fingerprint, rerotate_keys, rotary_inv_freq
from agentmem.kv.cache import new_dynamic_cache, stacked_from_cache
from agentmem.kv.model import EMBEDDED_GGUF_FILE, embedded_model_dir
from agentmem.kv.runner import prefill

pytestmark = pytest.mark.slow

MEMORIES = [
    "[8 May 2023] Caroline: I went to an LGBTQ support group yesterday and it was so powerful.",
    "[25 May 2023] Melanie: I ran a charity race for mental health last Saturday.",
    "[9 June 2023] Caroline: I'm researching adoption agencies, I want to give kids a loving home.",
    "[20 July 2023] Melanie: We went camping at the beach with the kids and roasted marshmallows.",
]
QUESTION = "What is Caroline researching?"


@pytest.fixture(scope="module")
def smol():
    if not (embedded_model_dir() / EMBEDDED_GGUF_FILE).exists():
        pytest.skip("embedded SmolLM2 not installed")
    return load_model()


@pytest.fixture(scope="module")
def engine(smol):
    return KVEngine(*smol)


def test_architecture_is_what_the_engine_expects(engine):
    fp = engine.fingerprint
    assert (fp.model_type, fp.num_layers, fp.num_attention_heads, fp.num_kv_heads, fp.head_dim) == (
        "llama", 30, 9, 3, 64
    )
    assert engine.supports_kv and engine.layout.kind == "system"


@pytest.mark.parametrize("delta", [1, 45, 400])
def test_rerotation_equals_encoding_at_the_new_offset_in_every_layer(smol, delta):
    model, tok = smol
    ids = tok("Caroline went to the LGBTQ support group and felt accepted.", add_special_tokens=False).input_ids

    def keys_at(first):
        cache = new_dynamic_cache()
        prefill(model, cache, ids, position_ids=torch.arange(first, first + len(ids))[None])
        return stacked_from_cache(cache)[0]

    moved = rerotate_keys(keys_at(14), delta, rotary_inv_freq(model), start=14)
    target = keys_at(14 + delta)
    per_layer = (moved - target).abs().amax(dim=(1, 2, 3, 4))
    assert per_layer.shape == (30,)
    assert per_layer.max().item() <= 1e-4, per_layer


def test_one_mounted_entry_matches_text_and_greedy_tokens(engine):
    entry = engine.encode(MEMORIES[2])
    blob = engine.to_bytes(entry)
    items = [MemoryItem("m2", MEMORIES[2], lambda: engine.from_bytes(blob))]
    kv, _ = engine.answer_logits(QUESTION, items, "adoption agencies", mode="kv")
    text, _ = engine.answer_logits(QUESTION, items, "adoption agencies", mode="text")
    assert (kv - text).abs().max().item() <= 1e-4
    a = engine.generate(QUESTION, items, mode="kv", max_new_tokens=24)
    b = engine.generate(QUESTION, items, mode="text", max_new_tokens=24)
    assert a.token_ids == b.token_ids and a.text == b.text and a.text.strip()


def test_kv_fix_moves_several_entries_closer_to_text(engine):
    entries = engine.encode_many(MEMORIES)
    items = [MemoryItem(f"m{i}", t, lambda e=e: e) for i, (t, e) in enumerate(zip(MEMORIES, entries))]
    ref = engine.answer_logits(QUESTION, items, "adoption agencies", mode="text")[0].log_softmax(-1)

    def kl(mode):
        logp = engine.answer_logits(QUESTION, items, "adoption agencies", mode=mode)[0].log_softmax(-1)
        return (ref.exp() * (ref - logp)).sum(-1).mean().item()

    plain, fixed = kl("kv"), kl("kv+fix")
    assert plain > 1e-4  # entries encoded apart really differ from text...
    assert fixed < plain  # ...and recomputing a few tokens in context brings them closer


@pytest.mark.parametrize("storage", [torch.float32, torch.float16, torch.bfloat16])
def test_store_load_round_trip_on_smollm2(smol, storage):
    engine = KVEngine(*smol, storage_dtype=storage)
    entry = engine.encode(MEMORIES[0])
    back = engine.from_bytes(engine.to_bytes(entry))
    assert torch.equal(back.keys, entry.keys.to(storage).float())
    assert torch.equal(back.values, entry.values.to(storage).float())


_FP_CHILD = """
from agentmem.kv import load_model, model_fingerprint
print(model_fingerprint(*load_model()).digest)
"""


def test_fingerprint_is_stable_across_processes_and_changes_with_dtype(smol):
    here = model_fingerprint(*smol)
    out = subprocess.run([sys.executable, "-c", _FP_CHILD], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == here.digest
    half = model_fingerprint(*load_model(dtype=torch.bfloat16))
    assert half.digest != here.digest and "dtype" in half.differences(here)


_LOAD_CHILD = """
import sys, time
t = time.perf_counter()
from agentmem.kv import load_model
model, tok = load_model(cache_dir=sys.argv[1])
print(time.perf_counter() - t, model.config.num_hidden_layers)
"""


def test_conversion_is_cached_atomically_and_reloads_fast(tmp_path):
    first = subprocess.run(
        [sys.executable, "-c", _LOAD_CHILD, str(tmp_path)], capture_output=True, text=True, check=True, timeout=600
    )
    models = list((tmp_path / "models").iterdir())
    assert len(models) == 1 and (models[0] / "model.safetensors").exists()
    assert not [p for p in (tmp_path / "models").iterdir() if p.name.startswith(".")]  # no leftover temp dir
    start = time.perf_counter()
    second = subprocess.run(
        [sys.executable, "-c", _LOAD_CHILD, str(tmp_path)], capture_output=True, text=True, check=True, timeout=300
    )
    load_s, layers = second.stdout.split()
    assert layers == "30"
    assert float(load_s) < float(first.stdout.split()[0])  # no second conversion
    assert time.perf_counter() - start < 120
