"""Top-p sampling's nucleus (agentmem.kv.runner.nucleus), which every decode step of a sampled answer draws from,
batched or alone: the same ids as sorting the whole vocabulary, whether the nucleus lies within the first
NUCLEUS_SCAN ids (the fast path) or reaches past them (the whole row is sorted)."""

from __future__ import annotations

import pytest
import torch

from agentmem.kv.runner import NUCLEUS_SCAN, Sampling, next_token, nucleus


def _sorted_nucleus(probs: torch.Tensor, top_p: float) -> set[int]:
    values, order = probs.sort(descending=True)
    return set(order[values.cumsum(-1) - values < top_p].tolist())


@pytest.mark.parametrize("spread", [8.0, 2.0, 0.05])  # peaked (a few ids) ... nearly flat (thousands of ids)
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.999])
def test_the_nucleus_is_the_one_a_full_sort_keeps(spread, top_p):
    gen = torch.Generator().manual_seed(7)
    for _ in range(20):
        probs = (torch.randn(5000, generator=gen) * spread).softmax(-1)
        ids, kept = nucleus(probs, top_p)
        assert set(ids.tolist()) == _sorted_nucleus(probs, top_p)
        assert torch.equal(kept, probs[ids]) and bool((kept[:-1] >= kept[1:]).all())  # most probable first


def test_a_nucleus_wider_than_the_scan_is_found_whole():
    probs = torch.linspace(2.0, 1.0, 4 * NUCLEUS_SCAN)[torch.randperm(4 * NUCLEUS_SCAN)]  # nearly flat, no ties
    probs = probs / probs.sum()
    ids, _ = nucleus(probs, 0.9)
    assert len(ids) > NUCLEUS_SCAN and set(ids.tolist()) == _sorted_nucleus(probs, 0.9)


def test_a_sampled_token_comes_from_the_nucleus_and_a_seed_repeats_it():
    logits = torch.randn(1, 3000, generator=torch.Generator().manual_seed(1)) * 4
    sampling = Sampling(do_sample=True, temperature=0.7, top_p=0.8, seed=5)
    allowed = _sorted_nucleus((logits[0] / 0.7).softmax(-1), 0.8)
    draws = [next_token(logits, sampling, torch.Generator().manual_seed(5)) for _ in range(3)]
    assert draws[0] in allowed and draws == [draws[0]] * 3
