"""Token layout of a mounted context: ``[preamble][memory KV][question turn][answer turn]``.

Training must see exactly the layout the engine mounts at answer time, otherwise the prefix learns to serve a
prompt it will never meet. The layout is derived from the tokenizer's chat template when it has one (SmolLM2 and
Qwen2 use ChatML), so the preamble is the template's default system turn and a question is a user turn followed
by the assistant header. Each piece is tokenised on its own, as the engine does when it concatenates cached KV
with a fresh prompt.

Example:
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> _, tok = tiny_causal_lm("llama")
    >>> layout = PromptLayout.for_tokenizer(tok)
    >>> tok.decode(layout.question_ids("Hi?"))
    '<|im_start|>user\\nHi?<|im_end|>\\n<|im_start|>assistant\\n'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PromptLayout"]

_MARK_Q = "\x00QUESTION\x00"
_MARK_A = "\x00ANSWER\x00"


@dataclass(frozen=True)
class PromptLayout:
    """String pieces around the question and answer; ``preamble`` is the shared system turn.

    ``question_ids(q)`` = ``user_prefix + q + user_suffix`` (ends with the assistant header, where generation
    starts); ``answer_ids(a)`` = ``a + answer_suffix``; ``document_ids(d)`` = ``d + document_suffix``.
    """

    tokenizer: Any
    preamble: str
    user_prefix: str
    user_suffix: str
    answer_suffix: str
    document_suffix: str = "\n"

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> PromptLayout:
        """Derive the pieces from ``tokenizer.chat_template`` (plain ``User:/Assistant:`` lines without one)."""
        if not getattr(tokenizer, "chat_template", None):
            eos = tokenizer.eos_token or ""
            return cls(tokenizer, "", "User: ", "\nAssistant: ", eos + "\n")
        render = tokenizer.apply_chat_template
        pre = render([{"role": "user", "content": _MARK_Q}], tokenize=False, add_generation_prompt=True)
        head, tail = pre.split(_MARK_Q)
        full = render([{"role": "user", "content": _MARK_Q}, {"role": "assistant", "content": _MARK_A}],
                      tokenize=False)
        answer_tail = full.split(_MARK_A)[1]
        # The template's default system turn (if any) is everything before the user turn starts; it is the
        # preamble every mount shares, so it is not part of the question.
        starts = [m for m in ("<|im_start|>", "<|start_header_id|>", tokenizer.bos_token) if m and m in head]
        user_start = head.rfind(starts[0]) if starts else 0
        preamble, user_prefix = head[:user_start], head[user_start:]
        # ChatML closes a turn with "<|im_end|>\n"; the trailing newline belongs to the next turn's framing, and
        # the answer target should end on the end-of-turn token the model emits.
        answer_suffix = answer_tail.rstrip("\n") or answer_tail
        return cls(tokenizer, preamble, user_prefix, tail, answer_suffix)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def preamble_ids(self) -> list[int]:
        return self._ids(self.preamble)

    def question_ids(self, question: str) -> list[int]:
        return self._ids(self.user_prefix + question + self.user_suffix)

    def answer_ids(self, answer: str) -> list[int]:
        return self._ids(answer + self.answer_suffix)

    def document_ids(self, document: str) -> list[int]:
        return self._ids(document + self.document_suffix)

    def stop_ids(self) -> set[int]:
        """Token ids that end an answer turn (end-of-turn and end-of-sequence)."""
        stops = set(self._ids(self.answer_suffix)[:1])
        if self.tokenizer.eos_token_id is not None:
            stops.add(int(self.tokenizer.eos_token_id))
        return stops
