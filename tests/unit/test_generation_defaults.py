"""Generation defaults come from the model's own generation_config (issue #39): sampling and repetition penalty
apply to ``generate`` / ``Session.send`` unless the call says otherwise."""

from __future__ import annotations

import re

import pytest

from agentmem import AgentMemory
from agentmem.kv.runner import Sampling
from agentmem.kv.testing import tiny_causal_lm


@pytest.fixture
def tiny():
    return tiny_causal_lm("llama", seed=0)


def test_sampling_reads_the_generation_config_and_calls_override_it(tiny):
    model, _ = tiny
    model.generation_config.update(do_sample=True, temperature=0.2, top_p=0.9, repetition_penalty=1.1)
    s = Sampling.for_model(model)
    assert (s.do_sample, s.temperature, s.top_p, s.repetition_penalty) == (True, 0.2, 0.9, 1.1)
    s = Sampling.for_model(model, do_sample=False, repetition_penalty=1.0, seed=3)
    assert (s.do_sample, s.temperature, s.repetition_penalty, s.seed) == (False, 0.2, 1.0, 3)


def test_generate_and_send_use_the_models_repetition_penalty(tiny, mem_path):
    model, tok = tiny
    with AgentMemory(mem_path, model=(model, tok)) as mem:
        plain = mem.generate("Tell me a long story.", user_id="u1", k=1, max_new_tokens=32).token_ids
        assert len(set(plain)) < len(plain)  # greedy decoding of the random model repeats ids
        model.generation_config.update(repetition_penalty=50.0)
        penalised = mem.generate("Tell me a long story.", user_id="u1", k=1, max_new_tokens=32).token_ids
        asked = mem.generate("Tell me a long story.", user_id="u1", k=1, max_new_tokens=32,
                             repetition_penalty=1.0).token_ids
        turn = mem.session("s", user_id="u1").send("Tell me a long story.", k=0, max_new_tokens=32,
                                                   remember=False).token_ids
    assert penalised != plain and asked == plain  # the model's setting applies; the call's own wins
    assert len(set(penalised)) > len(set(plain)) and len(set(turn)) > len(set(plain))


def test_logit_bias_bans_or_forces_tokens_and_bad_bias_is_refused_before_anything_runs(tiny, mem_path):
    from agentmem import InvalidInputError

    model, tok = tiny
    with AgentMemory(mem_path, model=(model, tok)) as mem:
        plain = mem.generate("Tell me a long story.", user_id="u1", k=1, max_new_tokens=16).token_ids
        banned = mem.generate("Tell me a long story.", user_id="u1", k=1, max_new_tokens=16,
                              logit_bias={t: -100 for t in set(plain)}).token_ids
        forced = mem.generate("Tell me a long story.", user_id="u1", k=1, max_new_tokens=4,
                              logit_bias={"87": 100}).token_ids  # JSON's string keys are token ids too
        assert banned and not set(banned) & set(plain) and forced == [87] * 4
        for bad, named in (({len(tok): -1}, "does not have"), ({5: 100.5}, "[-100, 100]"),
                           ({"five": 1}, "token ids"), ({"²": 1}, "token ids"),
                           ({"9" * 5000: 1}, "token ids"), ([5], "logit_bias")):
            with pytest.raises(InvalidInputError, match=re.escape(named)):
                mem.generate("Hi.", user_id="u1", max_new_tokens=2, logit_bias=bad)
