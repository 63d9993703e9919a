"""Tiny, deterministic causal LMs for fast tests: no download, built in well under a second.

The models are randomly initialised from a fixed seed, so their outputs are meaningless but reproducible; they
exercise exactly the code paths of their real families (Llama: RoPE + GQA; Qwen2: RoPE + GQA + q/k/v bias;
GPT-2: learned absolute positions, which KV mounting must refuse).

Example:
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> model, tokenizer = tiny_causal_lm("llama")
    >>> len(tokenizer), model.config.num_hidden_layers
    (259, 2)
"""

from __future__ import annotations

import functools
from typing import Literal

import torch

__all__ = ["CHATML_TEMPLATE", "tiny_causal_lm", "tiny_tokenizer"]

# A ChatML template, like SmolLM2's and Qwen2's, so prompt-layout code sees a realistic template.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


@functools.lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    # Byte-level BPE with no merges: every byte is one token, so any text round-trips and ids are predictable.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str()


def tiny_tokenizer(chat_template: str | None = CHATML_TEMPLATE):
    """A byte-level tokenizer (256 byte tokens + 3 ChatML specials = 259 ids), built in memory.

    Pass ``chat_template=None`` to get a tokenizer without a template (exercises the plain-prompt fallback).
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        bos_token=_SPECIALS[0],
        eos_token=_SPECIALS[1],
        pad_token=_SPECIALS[2],
        unk_token=_SPECIALS[2],
    )
    tok.chat_template = chat_template
    return tok


def tiny_causal_lm(
    arch: Literal["llama", "qwen2", "gpt2"] = "llama",
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.float32,
    chat_template: str | None = CHATML_TEMPLATE,
):
    """Return ``(model, tokenizer)``: a 2-layer, hidden-64 random model of ``arch`` in eval mode.

    Llama and Qwen2 use grouped-query attention (4 query heads, 2 KV heads, head dim 16). The seed fixes the
    weights; the global RNG state is left untouched.

    Example:
        >>> model, tok = tiny_causal_lm("qwen2", seed=1)
        >>> model.config.num_key_value_heads
        2
    """
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tokenizer = tiny_tokenizer(chat_template)
    vocab = len(tokenizer)
    ids = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    # A larger init than the usual 0.02 makes logits peaked, so greedy decoding is not decided by float noise.
    common = dict(vocab_size=vocab, initializer_range=0.1, tie_word_embeddings=False, **ids)
    if arch == "llama":
        config = LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common,
        )
        cls = LlamaForCausalLM
    elif arch == "qwen2":
        config = Qwen2Config(
            hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            use_sliding_window=False, **common,
        )
        cls = Qwen2ForCausalLM
    elif arch == "gpt2":
        config = GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=512, **common)
        cls = GPT2LMHeadModel
    else:
        raise ValueError(f"unknown tiny arch {arch!r}; use 'llama', 'qwen2' or 'gpt2'")

    # fork_rng keeps callers' random streams unchanged; the seed alone decides the weights.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
        # Sharpen the output head so greedy decoding has clear winners (random heads give near-uniform logits,
        # where float noise alone could flip an argmax and make exactness tests flaky).
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(8.0)
    model = model.to(dtype).eval()
    return model, tokenizer
