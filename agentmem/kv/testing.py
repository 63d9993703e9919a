"""Tiny, deterministic causal LMs for fast tests: no download, built in well under a second.

The models are randomly initialised from a fixed seed, so their outputs are meaningless but reproducible; they
exercise exactly the code paths of their real families (Llama: RoPE + GQA; Qwen2: RoPE + GQA + q/k/v bias; Qwen3,
Mistral, Phi-3, Gemma 2/3, scaled RoPE: see :data:`TINY_ARCHS`; GPT-2: learned absolute positions, which KV
mounting must refuse).

Example:
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> model, tokenizer = tiny_causal_lm("llama")
    >>> len(tokenizer), model.config.num_hidden_layers
    (259, 2)
"""

from __future__ import annotations

import functools
import torch

__all__ = ["CHATML_TEMPLATE", "CHATML_TOOLS_TEMPLATE", "TINY_ARCHS", "tiny_causal_lm", "tiny_tokenizer"]

# A ChatML template, like SmolLM2's and Qwen2's, so prompt-layout code sees a realistic template.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The same ChatML with tool definitions in the system turn, the way Qwen2.5's template renders them.
CHATML_TOOLS_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] }}"
    "{% if loop.first and message['role'] == 'system' and tools %}"
    "{{ '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>' }}"
    "{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags.' }}"
    "{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
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


# Tiny configs per family: (config class, model class, config fields). Llama/Qwen2 keep their historical sizes
# (other tests pin outputs to them). Every family uses grouped-query attention (4 query heads, 2 KV heads).
_GQA = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512)
_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
_FAMILIES: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_hidden_layers=2, rope_parameters=_ROPE)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        num_hidden_layers=3, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        use_sliding_window=False)),
    # q/k RMSNorm per head before RoPE: the cached keys are normed, then rotated
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_hidden_layers=2, head_dim=16, rope_parameters=_ROPE,
                                                      use_sliding_window=False)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_hidden_layers=2, sliding_window=None,
                                                            rope_parameters=_ROPE)),
    # Mistral v0.1-style sliding window attention: refused for KV mounting
    "mistral-sliding": ("MistralConfig", "MistralForCausalLM", dict(num_hidden_layers=2, sliding_window=32,
                                                                    rope_parameters=_ROPE)),
    # partial rotary: only the first half of each head's dims carry position
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(
        num_hidden_layers=2, rope_parameters={**_ROPE, "partial_rotary_factor": 0.5}, pad_token_id=None)),
    # attention logit soft-capping + alternating sliding-window layers: refused (sliding layers)
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        num_hidden_layers=2, head_dim=16, sliding_window=32, rope_parameters=_ROPE, attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0, query_pre_attn_scalar=16)),
    # sliding layers with their own RoPE base (local 10k, global 1M): refused (per-layer-type RoPE)
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        num_hidden_layers=2, head_dim=16, sliding_window=32, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": dict(_ROPE),
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}})),
    # scaled RoPE, static in the sequence length: re-rotation stays exact
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(num_hidden_layers=2, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "yarn": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_hidden_layers=2, use_sliding_window=False, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128})),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, n_positions=512)),
}
TINY_ARCHS = tuple(_FAMILIES)


def tiny_causal_lm(
    arch: str = "llama",
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.float32,
    chat_template: str | None = CHATML_TEMPLATE,
):
    """Return ``(model, tokenizer)``: a 2-3 layer, hidden-64 random model of ``arch`` in eval mode.

    ``arch`` is one of :data:`TINY_ARCHS`: llama, qwen2, qwen3 (q/k norm), mistral, mistral-sliding (sliding
    window), phi3 (partial rotary), gemma2 (soft-capping, sliding-window layers), gemma3 (per-layer-type RoPE),
    llama3 / yarn (scaled RoPE), gpt2 (learned positions). RoPE families use grouped-query attention (4 query
    heads, 2 KV heads, head dim 16). The seed fixes the weights; the global RNG state is left untouched.

    Example:
        >>> model, tok = tiny_causal_lm("qwen2", seed=1)
        >>> model.config.num_key_value_heads
        2
    """
    import transformers

    if arch not in _FAMILIES:
        raise ValueError(f"unknown tiny arch {arch!r}; use one of {', '.join(TINY_ARCHS)}")
    config_name, model_name, fields = _FAMILIES[arch]
    tokenizer = tiny_tokenizer(chat_template)
    ids = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    # A larger init than the usual 0.02 makes logits peaked, so greedy decoding is not decided by float noise.
    common = dict(vocab_size=len(tokenizer), initializer_range=0.1, tie_word_embeddings=False, **ids)
    sizes = {} if arch == "gpt2" else dict(_GQA)
    merged = {**common, **sizes, **fields}
    if merged.get("pad_token_id") is None:
        merged["pad_token_id"] = tokenizer.pad_token_id
    config = getattr(transformers, config_name)(**merged)
    cls = getattr(transformers, model_name)

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
