"""Logits processors that hold the local model's answer to a JSON schema, end it at a stop string, or bias tokens.

All follow the engine's convention (transformers' ``(ids, scores) -> scores``, ``ids`` the answer so far):

* :func:`json_schema_processor` allows, at each step, only the tokens that keep the answer a prefix of a JSON
  value valid under the schema, and the end-of-sequence token only once the value is complete. It is built on
  xgrammar (the ``server`` extra); benchmarks/json_constraint.py measured it against outlines-core and
  lm-format-enforcer on SmolLM2-135M on CPU (docs/server.md says why it was chosen).
* :func:`stop_processor` forces the end-of-sequence token as soon as the answer contains a stop string, so
  decoding ends there instead of running to ``max_new_tokens`` (the caller still cuts the string off the text).
* :func:`bias_processor` adds OpenAI's ``logit_bias`` to the logits (-100 in effect bans a token).

Example:
    >>> from agentmem.kv.engine import KVEngine
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> engine = KVEngine(*tiny_causal_lm("llama"))         # a tiny random model: unconstrained, it writes noise
    >>> tokenizer = engine.tokenizer
    >>> process = chain(json_schema_processor(tokenizer, {"type": "object"}), stop_processor(tokenizer, ["\\n\\n"]))
    >>> out = engine.generate("Answer in JSON.", [], logits_processor=process, max_new_tokens=6)
    >>> out.text[0]                                         # a JSON object starts, cut at 6 tokens here
    '{'
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from agentmem.errors import InvalidInputError

__all__ = ["bias_processor", "chain", "json_schema_processor", "stop_processor"]

Processor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@functools.lru_cache(maxsize=4)
def _compiler(tokenizer: Any, vocab_size: int) -> Any:
    """xgrammar's compiler over a tokenizer's vocabulary (built once per tokenizer and logits width; it caches the
    grammars it compiles)."""
    import xgrammar as xgr

    return xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size))


def _eos_id(tokenizer: Any) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    if not isinstance(eos, int):
        raise InvalidInputError("the model's tokenizer has no end-of-sequence token; constrained decoding needs one")
    return eos


def json_schema_processor(tokenizer: Any, schema: Mapping[str, Any]) -> Processor:
    """A processor holding one answer to ``schema`` (a new one per answer: it keeps the parse state).

    JSON is written compactly (no free whitespace): a small model left free to indent can loop on whitespace
    instead of closing the object. The grammar is compiled on the first step, when the logits width is known.

    Example:
        >>> from agentmem.kv.testing import tiny_tokenizer
        >>> tokenizer = tiny_tokenizer()
        >>> process = json_schema_processor(tokenizer, {"type": "object", "properties": {"n": {"type": "integer"}}})
        >>> callable(process)
        True
    """
    try:
        import xgrammar as xgr
    except ImportError as exc:  # pragma: no cover - the server extra brings it
        raise InvalidInputError("JSON-constrained answers need xgrammar: pip install 'agentmem[server]'") from exc
    text = json.dumps(dict(schema))
    state: dict[str, Any] = {"accepted": 0}

    def process(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if "matcher" not in state:
            try:
                grammar = _compiler(tokenizer, scores.shape[-1]).compile_json_schema(text, any_whitespace=False)
            except (RuntimeError, ValueError) as exc:
                raise InvalidInputError(f"json schema is not supported for constrained decoding: {exc}") from exc
            state["matcher"] = xgr.GrammarMatcher(grammar)
            state["mask"] = xgr.allocate_token_bitmask(1, scores.shape[-1])
        matcher = state["matcher"]
        for token in ids[0, state["accepted"]:].tolist():  # the ids chosen since the last step
            matcher.accept_token(int(token))
        state["accepted"] = ids.shape[-1]
        scores = scores.clone()
        matcher.fill_next_token_bitmask(state["mask"])
        xgr.apply_token_bitmask_inplace(scores, state["mask"].to(scores.device))
        return scores

    return process


def stop_processor(tokenizer: Any, stops: Sequence[str]) -> Processor:
    """A processor that ends the answer (end-of-sequence only) once its text contains one of ``stops``.

    Example:
        >>> from agentmem.kv.testing import tiny_tokenizer
        >>> tokenizer = tiny_tokenizer()
        >>> process = stop_processor(tokenizer, ["Observation:"])
        >>> scores = process(torch.tensor([tokenizer.encode("Observation:", add_special_tokens=False)]),
        ...                  torch.zeros(1, len(tokenizer)))
        >>> int(scores.argmax()) == tokenizer.eos_token_id    # only the end of the answer is left
        True
    """
    eos, wanted = _eos_id(tokenizer), [s for s in stops if s]

    def process(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        text = tokenizer.decode(ids[0].tolist(), skip_special_tokens=True) if ids.shape[-1] else ""
        if not any(s in text for s in wanted):
            return scores
        forced = torch.full_like(scores, float("-inf"))
        forced[..., eos] = 0.0
        return forced

    return process


def bias_processor(bias: Mapping[int, float], vocab_size: int) -> Processor:
    """A processor adding ``bias[token]`` to each named token's logit (OpenAI's ``logit_bias``, values checked by
    :func:`agentmem.validation.check_logit_bias`): -100 in effect bans the token, +100 in effect makes it the only
    choice. A token id outside the model's vocabulary (``vocab_size`` ids) is refused here, before decoding.

    Example:
        >>> process = bias_processor({1: -100.0, 2: 3.0}, vocab_size=4)
        >>> process(torch.tensor([[0]]), torch.zeros(1, 4))
        tensor([[   0., -100.,    3.,    0.]])
    """
    outside = sorted(t for t in bias if not 0 <= t < vocab_size)
    if outside:
        raise InvalidInputError(f"logit_bias names token ids the model does not have: {outside[:5]} (its vocabulary "
                                f"is 0..{vocab_size - 1})")
    tokens, values = torch.tensor(list(bias), dtype=torch.long), torch.tensor(list(bias.values()))

    def process(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        scores[..., tokens.to(scores.device)] += values.to(scores.device, scores.dtype)
        return scores

    return process


def chain(*processors: Processor | None) -> Processor | None:
    """The processors applied in order (None ones skipped); None when there is none.

    Example:
        >>> chain(None, None) is None
        True
    """
    given = [p for p in processors if p is not None]
    if not given:
        return None
    if len(given) == 1:
        return given[0]

    def process(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for p in given:
            scores = p(ids, scores)
        return scores

    return process
