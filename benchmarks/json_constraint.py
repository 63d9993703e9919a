"""Which constrained-decoding library the server uses for ``response_format`` / forced tool calls (issue #39).

Each candidate that is importable (lm-format-enforcer, outlines-core through outlines, xgrammar) builds a logits
processor for one JSON schema over the bundled SmolLM2-135M's tokenizer, then the model answers one prompt
greedily on CPU with that processor, through a plain prefill + decode loop (the same ``(ids, scores) -> scores``
convention agentmem's engine uses, answer ids only). Reported per library: setup seconds (tokenizer index +
schema compile, first request), per-token milliseconds of decoding against the unconstrained loop, whether the
answer parses and validates against the schema, and the answer. Last printed line: JSON.

Run (candidates not installed are reported as missing):
    python benchmarks/json_constraint.py --tokens 48
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "days": {"type": "integer"},
                   "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
PROMPT = "What is the weather forecast for Oslo for the next 3 days? Answer in JSON."


def lmfe(tokenizer: Any, schema: dict) -> Any:
    from lmformatenforcer import JsonSchemaParser, TokenEnforcer
    from lmformatenforcer.integrations.transformers import build_token_enforcer_tokenizer_data

    enforcer = TokenEnforcer(build_token_enforcer_tokenizer_data(tokenizer), JsonSchemaParser(schema))

    def process(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        allowed = enforcer.get_allowed_tokens(ids[0].tolist()).allowed_tokens
        mask = torch.full_like(scores, float("-inf"))
        mask[:, allowed] = 0
        return scores + mask

    return process


def outlines_core(tokenizer: Any, schema: dict) -> Any:
    from outlines.backends.outlines_core import OutlinesCoreBackend
    from outlines.models.transformers import TransformerTokenizer
    from outlines_core import Index
    from outlines_core.json_schema import build_regex_from_schema

    wrapped = TransformerTokenizer(tokenizer)
    vocab = OutlinesCoreBackend.create_outlines_core_vocabulary(
        tokenizer.get_vocab(), tokenizer.eos_token_id, tokenizer.eos_token, wrapped.convert_token_to_string)
    from outlines.backends.outlines_core import OutlinesCoreLogitsProcessor

    proc = OutlinesCoreLogitsProcessor(Index(build_regex_from_schema(json.dumps(schema)), vocab), "torch")
    return lambda ids, scores: proc.process_logits(ids, scores)


def xgrammar(tokenizer: Any, schema: dict, vocab_size: int) -> Any:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema)))
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)

    def process(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if ids.shape[1]:
            matcher.accept_token(int(ids[0, -1]))
        matcher.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(scores, bitmask)
        return scores

    return process


def answer(model: Any, tokenizer: Any, processor: Any, tokens: int) -> tuple[str, float]:
    """Greedy answer with ``processor``; returns the text and the decode seconds per token."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)["input_ids"]
    out: list[int] = []
    with torch.no_grad():
        res = model(input_ids=prompt, use_cache=True)
        cache, logits = res.past_key_values, res.logits[:, -1:].float()[0]
        t0 = time.perf_counter()
        for _ in range(tokens):
            row = logits if processor is None else processor(torch.tensor([out], dtype=torch.long), logits)
            token = int(row.argmax())
            if token == tokenizer.eos_token_id:
                break
            out.append(token)
            res = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            cache, logits = res.past_key_values, res.logits[:, -1:].float()[0]
        per_token = (time.perf_counter() - t0) / max(1, len(out))
    return tokenizer.decode(out, skip_special_tokens=True), per_token


def valid(text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    from agentmem.kv.model import load_model

    model, tokenizer = load_model()
    torch.set_num_threads(1)
    text, base = answer(model, tokenizer, None, args.tokens)
    results: dict[str, Any] = {"unconstrained": {"ms_per_token": round(base * 1e3, 2), "valid": valid(text),
                                                 "answer": text}}
    builders = {"lm-format-enforcer": lambda: lmfe(tokenizer, SCHEMA),
                "outlines-core": lambda: outlines_core(tokenizer, SCHEMA),
                "xgrammar": lambda: xgrammar(tokenizer, SCHEMA, model.config.vocab_size)}
    for name, build in builders.items():
        try:
            t0 = time.perf_counter()
            processor = build()
            setup = time.perf_counter() - t0
        except ImportError as exc:
            results[name] = {"missing": str(exc)}
            continue
        text, per_token = answer(model, tokenizer, processor, args.tokens)
        results[name] = {"setup_s": round(setup, 3), "ms_per_token": round(per_token * 1e3, 2),
                         "valid": valid(text), "answer": text}
        print(name, results[name], flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
