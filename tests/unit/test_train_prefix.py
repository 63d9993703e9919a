"""Trained KV entries on a tiny random Llama: only the prefix learns, loss falls, resume is exact."""

from __future__ import annotations

import pytest
import torch

from agentmem.errors import InvalidInputError, UnsupportedModelError
from agentmem.kv.testing import tiny_causal_lm
from agentmem.train import PromptLayout, TrainOptions, make_data, train_prefix
from agentmem.train import _kv

DOC = ("[8 May 2023] Ann: I moved to Oslo in May 2021 and adopted a cat named Pixel.\n"
       "[8 May 2023] Bob: Nice! I started pottery classes last week.\n") * 2
OPTS = TrainOptions(samples=6, batch_size=3, question_tokens=6, answer_tokens=8, chunk_tokens=64, checkpoint_every=2)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matmuls: see tests/conftest.py


@pytest.fixture(scope="module")
def tiny():
    model, tok = tiny_causal_lm("llama", seed=0)
    # Self-study data does not depend on the prefix size or the optimiser: make it once for the module.
    data = make_data(model, PromptLayout.for_tokenizer(tok), DOC, seed=0, options=OPTS, progress=False)
    return model, tok, data


def _train(model, tok, data=None, **kw):
    args = dict(tokens=16, steps=8, seed=0, lr=2e-2, options=OPTS, progress=False, data=data)
    args.update(kw)
    return train_prefix(model, tok, DOC, **args)


def test_only_kv_learns_and_weights_stay_bit_identical(tiny):
    model, tok, data = tiny
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [p.requires_grad for p in model.parameters()]
    seen_grads: list[str] = []
    hooks = [p.register_hook(lambda g, n=n: seen_grads.append(n)) for n, p in model.named_parameters()
             if p.requires_grad]
    try:
        tp = _train(model, tok, data, steps=3)
    finally:
        for h in hooks:
            h.remove()
    assert seen_grads == []  # no weight ever received a gradient
    assert all(p.grad is None for p in model.parameters())
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [p.requires_grad for p in model.parameters()] == flags  # caller's flags restored
    # ... and the prefix did change (it is what was trained)
    layout = PromptLayout.for_tokenizer(tok)
    pre = _kv.encode(model, torch.tensor(layout.preamble_ids()))
    k0, _ = _kv.encode(model, torch.tensor(layout.document_ids(DOC)[:16]), pre)
    assert not torch.equal(tp.keys, k0)
    assert tp.keys.shape == (2, 2, 16, 16) and tp.values.shape == tp.keys.shape


def test_untrained_prefix_is_the_real_kv_of_the_first_tokens_after_the_preamble(tiny):
    model, tok, data = tiny
    tp = _train(model, tok, data, steps=0)
    layout = PromptLayout.for_tokenizer(tok)
    preamble, doc = layout.preamble_ids(), layout.document_ids(DOC)
    # The same KV the engine would store for these tokens: encoded in one pass right after the preamble.
    with torch.no_grad():
        cache = model(torch.tensor([preamble + doc[:16]]), use_cache=True).past_key_values
    k = torch.stack([layer.keys[0, :, len(preamble):] for layer in cache.layers])
    v = torch.stack([layer.values[0, :, len(preamble):] for layer in cache.layers])
    torch.testing.assert_close(tp.keys, k, atol=1e-5, rtol=0)
    torch.testing.assert_close(tp.values, v, atol=1e-5, rtol=0)
    assert tp.offset == len(preamble) > 0 and tp.token_ids == doc[:16]
    assert tp.record["frozen_first_token"] is False  # the preamble holds the attention sink


def test_loss_decreases(tiny):
    model, tok, data = tiny
    losses = _train(model, tok, data, steps=12).record["losses"]
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3


def test_first_slot_can_stay_frozen_and_record_is_complete(tiny):
    model, tok, data = tiny
    opts = TrainOptions(**{**OPTS.__dict__, "freeze_first": True})
    tp0 = _train(model, tok, data, steps=0, options=opts)
    tp = _train(model, tok, data, steps=2, options=opts)
    assert torch.equal(tp.keys[:, :, :1], tp0.keys[:, :, :1])
    assert not torch.equal(tp.keys[:, :, 1:], tp0.keys[:, :, 1:])
    assert tp.record["frozen_first_token"] is True
    rec = tp.record
    for key in ("steps", "losses", "document_sha256", "tokens", "seed", "lr", "model_fingerprint",
                "wall_seconds", "created_at", "offset"):
        assert key in rec
    assert rec["steps"] == 2 and rec["tokens"] == 16 and rec["seed"] == 0


def test_resume_continues_identically(tiny, tmp_path):
    model, tok, data = tiny
    ckpt = tmp_path / "run.safetensors"
    full = _train(model, tok, data, steps=7)
    # Interrupt after 3 steps (callback), then resume to 7 from the checkpoint.
    part = _train(model, tok, data, steps=7, checkpoint_path=ckpt, callback=lambda step, loss: step < 3)
    assert part.record["steps"] == 3 and part.record["stopped_early"] == "callback"
    resumed = _train(model, tok, data, steps=7, checkpoint_path=ckpt)
    assert torch.equal(resumed.keys, full.keys) and torch.equal(resumed.values, full.values)
    assert resumed.record["losses"] == full.record["losses"]
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporaries


def test_ctrl_c_saves_a_checkpoint(tiny, tmp_path):
    model, tok, data = tiny
    ckpt = tmp_path / "run.safetensors"

    def interrupt(step, loss):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _train(model, tok, data, steps=5, checkpoint_path=ckpt, callback=interrupt)
    resumed = _train(model, tok, data, steps=5, checkpoint_path=ckpt)
    assert torch.equal(resumed.keys, _train(model, tok, data, steps=5).keys)


def test_checkpoint_of_another_run_is_not_resumed(tiny, tmp_path):
    model, tok, data = tiny
    ckpt = tmp_path / "run.safetensors"
    _train(model, tok, data, steps=2, checkpoint_path=ckpt, seed=1)
    fresh = _train(model, tok, data, steps=2, checkpoint_path=ckpt, seed=0)
    assert torch.equal(fresh.keys, _train(model, tok, data, steps=2, seed=0).keys)


def test_rejects_unsupported_inputs(tiny):
    model, tok, data = tiny
    with pytest.raises(InvalidInputError):
        train_prefix(model, tok, "short", tokens=64, steps=1, progress=False)
    with pytest.raises(InvalidInputError):
        train_prefix(model, tok, "   ", tokens=4, steps=1, progress=False)
    gpt2, gtok = tiny_causal_lm("gpt2")
    with pytest.raises(UnsupportedModelError):
        train_prefix(gpt2, gtok, DOC, tokens=8, steps=1, progress=False)
