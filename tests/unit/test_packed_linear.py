"""Linear layers with packed bfloat16 weights: same outputs as nn.Linear, gradients intact, weight changes followed."""

from __future__ import annotations

import copy
import io

import pytest
import torch

from agentmem.kv import load_model, prepack_linear_layers
from agentmem.kv.packed_linear import PrepackedLinear, packed_linear_available
from agentmem.kv.testing import tiny_causal_lm


def _linears(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2's q/k/v projections carry a bias
def test_packed_model_gives_the_same_logits_bit_for_bit(arch: str) -> None:
    model, _ = tiny_causal_lm(arch)
    model = model.to(torch.bfloat16).eval()
    reference = copy.deepcopy(model)
    packed = prepack_linear_layers(model)
    kinds = {type(m) for m in _linears(model)}
    if packed_linear_available():
        assert packed == len(_linears(model)) > 0 and kinds == {PrepackedLinear}
    else:  # a CPU without native bfloat16 (or a torch without oneDNN's ops): nothing is touched
        assert packed == 0 and kinds == {torch.nn.Linear}
    ids = torch.randint(3, model.config.vocab_size, (2, 11))
    with torch.inference_mode():
        for _ in range(2):  # the second call uses the cached packed weights
            assert torch.equal(model(ids).logits, reference(ids).logits)


def test_gradients_flow_through_the_unpacked_path() -> None:
    layer = torch.nn.Linear(32, 8, dtype=torch.bfloat16)
    reference = copy.deepcopy(layer)
    prepack_linear_layers(layer)
    x = torch.randn(4, 32, dtype=torch.bfloat16, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    layer(x).float().sum().backward()
    reference(x_ref).float().sum().backward()
    assert torch.equal(x.grad, x_ref.grad)
    assert torch.equal(layer.weight.grad, reference.weight.grad)


def test_a_weight_changed_in_place_or_replaced_is_used_at_once() -> None:
    layer = torch.nn.Linear(32, 8, dtype=torch.bfloat16)
    prepack_linear_layers(layer)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    with torch.inference_mode():
        layer(x)  # packs the weight as it is now
    with torch.no_grad():
        layer.weight.mul_(-2)
    with torch.inference_mode():
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
    layer.weight = torch.nn.Parameter(torch.randn(8, 32, dtype=torch.bfloat16))
    with torch.inference_mode():
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_float32_input_takes_nn_linear_forward() -> None:
    layer = torch.nn.Linear(32, 8)
    prepack_linear_layers(layer)
    x = torch.randn(3, 32)
    with torch.inference_mode():
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
    assert getattr(layer, "_packed", None) is None  # nothing was packed for a float32 layer


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_load_model_packs_a_bfloat16_cpu_model_only(tmp_path, dtype: str) -> None:
    tiny, tokenizer = tiny_causal_lm("llama")
    tiny.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, _ = load_model(tmp_path, device="cpu", dtype=dtype)
    packed = dtype == "bfloat16" and packed_linear_available()
    assert {type(m) for m in _linears(model)} == {PrepackedLinear if packed else torch.nn.Linear}
    assert model.lm_head.weight is model.model.embed_tokens.weight or not model.config.tie_word_embeddings


def test_a_used_packed_model_can_be_copied_and_saved() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(32, 8, dtype=torch.bfloat16))
    prepack_linear_layers(model)
    x = torch.randn(2, 32, dtype=torch.bfloat16)
    with torch.inference_mode():
        expected = model(x)  # packs (where available): an opaque oneDNN tensor that cannot be pickled
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for clone in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
        with torch.inference_mode():
            assert torch.equal(clone(x), expected)
    with torch.inference_mode():
        assert torch.equal(model(x), expected)  # the original keeps its packed copy
