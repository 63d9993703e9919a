"""Model fingerprints: stable across processes, different whenever KV would differ."""

from __future__ import annotations

import subprocess
import sys

import torch

from agentmem.kv.fingerprint import ModelFingerprint, model_fingerprint
from agentmem.kv.testing import CHATML_TEMPLATE, tiny_causal_lm

_CHILD = """
from agentmem.kv.fingerprint import model_fingerprint
from agentmem.kv.testing import tiny_causal_lm
print(model_fingerprint(*tiny_causal_lm("llama")).digest)
"""


def test_fingerprint_is_stable_across_processes():
    here = model_fingerprint(*tiny_causal_lm("llama")).digest
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True, timeout=120,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},  # a different hash seed must not matter
    )
    assert out.stdout.strip().splitlines()[-1] == here


def test_round_trip_through_dict_and_json():
    fp = model_fingerprint(*tiny_causal_lm("qwen2"))
    assert ModelFingerprint.from_dict(fp.to_dict()) == fp
    assert ModelFingerprint.from_json(fp.to_json()).digest == fp.digest
    assert fp.num_kv_heads == 2 and fp.num_attention_heads == 4 and fp.head_dim == 16 and fp.num_layers == 3


def test_fingerprint_changes_with_dtype_weights_and_tokenizer():
    model, tok = tiny_causal_lm("llama")
    base = model_fingerprint(model, tok)
    assert model_fingerprint(model, tok) == base  # deterministic in-process

    # same weights in another precision: only the dtype differs, and blobs convert (cast) instead of re-encoding
    bf16 = model_fingerprint(*tiny_causal_lm("llama", dtype=torch.bfloat16))
    assert bf16.differences(base) == ["dtype"]
    assert base.convertible_to(bf16) and bf16.convertible_to(base)
    assert not model_fingerprint(*tiny_causal_lm("llama", seed=3)).convertible_to(base)
    assert model_fingerprint(*tiny_causal_lm("llama", seed=3)).differences(base) == ["weights_digest"]

    other_template = tiny_causal_lm("llama", chat_template=CHATML_TEMPLATE.replace("assistant", "bot"))
    assert model_fingerprint(*other_template).differences(base) == ["tokenizer_digest"]

    tok2 = tiny_causal_lm("llama")[1]
    tok2.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    assert model_fingerprint(model, tok2).differences(base) == ["tokenizer_digest"]


def test_in_place_weight_update_invalidates_the_cached_digest():
    model, tok = tiny_causal_lm("llama")
    before = model_fingerprint(model, tok).weights_digest
    with torch.no_grad():
        next(model.parameters()).add_(1e-3)
    assert model_fingerprint(model, tok).weights_digest != before
