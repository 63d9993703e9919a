"""Model forwards on top of a cache: prefill, early-stopped prefill, the decode loop, token choice.

These are the low-level steps a session manager builds on: prefill new ids onto an existing cache and get logits,
then decode from that cache. They never touch cache internals (see :mod:`agentmem.kv.cache`).

Example:
    >>> from agentmem.kv.cache import cache_from_stacked
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> model, _ = tiny_causal_lm("llama")                      # 2 layers, 2 KV heads of 16 dims
    >>> keys = values = torch.zeros(2, 1, 2, 0, 16)             # [layers, batch, kv heads, tokens, head dim]
    >>> cache = cache_from_stacked(keys, values, capacity=1024)
    >>> logits = prefill(model, cache, [1, 2, 3])              # [1, vocab] for the last position
    >>> new_ids = decode(model, cache, logits, max_new_tokens=4, eos_ids={2})
    >>> len(new_ids) <= 4, cache.get_seq_length() >= 3
    (True, True)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "LogitsProcessor", "Sampling", "decode", "forward_prefix_layers", "next_token", "prefill", "processed", "stop_ids",
]


def _ids_tensor(token_ids: Sequence[int] | torch.Tensor, device) -> torch.Tensor:
    ids = torch.as_tensor(token_ids, dtype=torch.long, device=device)
    return ids.unsqueeze(0) if ids.dim() == 1 else ids


def _device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def prefill(
    model,
    cache,
    token_ids: Sequence[int] | torch.Tensor,
    *,
    position_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    logits_to_keep: int = 1,
) -> torch.Tensor:
    """Run ``token_ids`` on top of ``cache`` (appended in place); return the last ``logits_to_keep`` logits.

    Positions default to continuing after the cache. Returns ``[n, vocab]`` for batch 1, else ``[B, n, vocab]``.
    ``logits_to_keep=0`` keeps logits for every new position.
    """
    ids = _ids_tensor(token_ids, _device(model))
    out = model(
        input_ids=ids,
        cache=cache,
        use_cache=True,
        position_ids=position_ids,
        attention_mask=attention_mask,
        logits_to_keep=logits_to_keep,
    )
    logits = out.logits
    return logits[0] if logits.shape[0] == 1 else logits


class _StopForward(Exception):
    pass


def _decoder_layers(model) -> torch.nn.ModuleList:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__}: cannot find the decoder layer list")
    return layers


@torch.no_grad()
def forward_prefix_layers(model, cache, token_ids: Sequence[int] | torch.Tensor, last_layer: int) -> None:
    """Fill ``cache`` for layers ``0..last_layer`` only, skipping the rest of the network.

    Used to measure, cheaply, how far mounted KV are from in-context KV at an early layer (CacheBlend-style token
    selection): the cost is ``(last_layer + 1) / num_layers`` of a full prefill.
    """
    layers = _decoder_layers(model)

    def stop(_module, _args, _output):
        raise _StopForward

    handle = layers[last_layer].register_forward_hook(stop)
    try:
        model(input_ids=_ids_tensor(token_ids, _device(model)), cache=cache, use_cache=True, logits_to_keep=1)
    except _StopForward:
        pass
    finally:
        handle.remove()


@dataclass(frozen=True)
class Sampling:
    """Greedy by default; ``do_sample=True`` samples with temperature / top-k / top-p from ``seed``.

    ``repetition_penalty`` > 1 makes ids the answer already holds less likely (transformers' rule: positive logits
    divided, negative ones multiplied). It sees the answer's own ids only: the prompt is mounted KV, not ids.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0

    @classmethod
    def for_model(cls, model: Any, **given: Any) -> Sampling:
        """The model's own generation settings (its ``generation_config``: sampling, temperature, top-p / top-k,
        repetition penalty), each overridden by a ``given`` value that is not None.

        Example:
            >>> from transformers import GenerationConfig
            >>> from agentmem.kv.testing import tiny_causal_lm
            >>> model, _ = tiny_causal_lm("llama")
            >>> model.generation_config = GenerationConfig(do_sample=True, temperature=0.2, top_p=0.9)
            >>> s = Sampling.for_model(model, temperature=0.7, seed=1)   # the given temperature wins
            >>> s.do_sample, s.temperature, s.top_p, s.seed
            (True, 0.7, 0.9, 1)
        """
        config = getattr(model, "generation_config", None)  # a model without one decodes greedily

        def own(name: str, neutral: Any) -> Any:
            value = getattr(config, name, None)
            return neutral if value is None else value

        defaults = dict(do_sample=bool(own("do_sample", False)), temperature=float(own("temperature", 1.0)),
                        top_k=int(own("top_k", 0)), top_p=float(own("top_p", 1.0)),
                        repetition_penalty=float(own("repetition_penalty", 1.0)))
        return cls(**{**defaults, **{k: v for k, v in given.items() if v is not None}})

    def generator(self, device) -> torch.Generator | None:
        if not self.do_sample:
            return None
        gen = torch.Generator(device=device)
        if self.seed is None:
            gen.seed()  # fresh entropy for this generator only; the global RNG is left alone
        else:
            gen.manual_seed(self.seed)
        return gen


def next_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None,
               previous: Sequence[int] = ()) -> int:
    """Pick the next id from a ``[vocab]`` (or ``[1, vocab]``) logit row; ``previous`` are the answer's ids so
    far (for the repetition penalty)."""
    row = logits.reshape(-1, logits.shape[-1])[-1].float()
    if sampling.repetition_penalty != 1.0 and len(previous):
        from transformers import RepetitionPenaltyLogitsProcessor

        penalty = RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty)
        row = penalty(torch.tensor([list(previous)], dtype=torch.long, device=row.device), row[None])[0]
    if not sampling.do_sample:
        return int(row.argmax())
    row = row / max(sampling.temperature, 1e-5)
    if sampling.top_k > 0:
        kth = torch.topk(row, min(sampling.top_k, row.numel())).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = row.softmax(-1)
    if sampling.top_p < 1.0:
        ids, kept = nucleus(probs, sampling.top_p)
        return int(ids[torch.multinomial(kept, 1, generator=generator)])
    return int(torch.multinomial(probs, 1, generator=generator))


# How many of the most probable ids top-p sampling looks at before sorting the whole vocabulary: a sort of 49k
# logits and a draw over all of them cost about 6 ms a token on CPU (a batched decode step of 16 answers paid
# ~90 ms for it, issue #40); the nucleus of a chat model's next token almost always lies within the first few.
NUCLEUS_SCAN = 256


def nucleus(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-p's kept ids and their probabilities, most probable first: the fewest ids whose probability mass
    reaches ``top_p`` (at least one). Looks in the :data:`NUCLEUS_SCAN` most probable ids first, and sorts the
    whole ``[vocab]`` row only when their mass falls short of ``top_p``.

    Example:
        >>> nucleus(torch.tensor([0.1, 0.6, 0.3]), 0.8)
        (tensor([1, 2]), tensor([0.6000, 0.3000]))
    """
    size = probs.shape[-1]
    for k in dict.fromkeys((min(NUCLEUS_SCAN, size), size)):
        values, ids = probs.topk(k)  # sorted, most probable first
        keep = values.cumsum(-1) - values < top_p  # a prefix: always keeps the top id
        if not keep[-1] or k == size:  # the nucleus ends within these k
            return ids[keep], values[keep]
    raise AssertionError("unreachable: the last scan covers the whole vocabulary")


# A logits processor in transformers' convention: ``(input_ids [1, T], scores [1, vocab]) -> scores``. Here
# ``input_ids`` are the answer's ids so far (the mounted prompt is KV, not ids). Used to constrain decoding, e.g.
# to a grammar for tool calls.
LogitsProcessor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def processed(logits: torch.Tensor, processor: LogitsProcessor | None, ids: Sequence[int]) -> torch.Tensor:
    """``logits`` (a ``[vocab]``/``[1, vocab]`` row) after ``processor``; unchanged without one.

    Example:
        >>> row = processed(torch.tensor([[1.0, -2.0, 3.0]]), lambda ids, scores: scores.clamp(max=0), [5, 7])
        >>> row
        tensor([[ 0., -2.,  0.]])
    """
    if processor is None:
        return logits
    row = logits.reshape(-1, logits.shape[-1])[-1:].float()
    ids_t = torch.tensor([list(ids)], dtype=torch.long, device=row.device)
    return processor(ids_t, row)


def stop_ids(model, tokenizer) -> set[int]:
    """End-of-sequence ids from the tokenizer and the model's generation config."""
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    for source in (getattr(tokenizer, "eos_token_id", None), getattr(config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, Iterable):
            ids.update(int(i) for i in source)
    return ids


@torch.no_grad()
def decode(
    model,
    cache,
    first_logits: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_ids: set[int] | frozenset[int] = frozenset(),
    sampling: Sampling = Sampling(),
    first_token: int | None = None,
    on_token: Callable[[int], None] | None = None,
    generator: torch.Generator | None = None,
    logits_processor: LogitsProcessor | None = None,
    cancel: threading.Event | None = None,
) -> list[int]:
    """Generate up to ``max_new_tokens`` ids from ``first_logits`` (the prefill's last row), appending to ``cache``.

    Stops after an id in ``eos_ids`` (not included in the result). ``first_token`` lets a caller that already
    picked the first id (to time TTFT) pass it in, with the ``generator`` it drew from so sampling continues the
    same random stream. The last id's KV is not appended (no forward is needed for it). ``logits_processor``
    reshapes every step's logits before the choice (see :data:`LogitsProcessor`). Once ``cancel`` is set (e.g. the
    client hung up), the loop stops before its next model step: at most the step already running is spent.
    """
    if max_new_tokens <= 0:
        return []
    device = _device(model)
    gen = generator if generator is not None else sampling.generator(device)
    out: list[int] = []
    if first_token is not None:
        token = first_token
    else:
        token = next_token(processed(first_logits, logits_processor, out), sampling, gen, out)
    while True:
        if token in eos_ids or (cancel is not None and cancel.is_set()):
            break
        out.append(token)
        if on_token is not None:
            on_token(token)
        if len(out) >= max_new_tokens:
            break
        logits = model(
            input_ids=torch.tensor([[token]], device=device), cache=cache, use_cache=True, logits_to_keep=1
        ).logits
        token = next_token(processed(logits, logits_processor, out), sampling, gen, out)
    return out
