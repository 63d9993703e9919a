"""Token layout of a mounted context, as the KV engine builds it: ``[preamble][entries][question][answer]``.

Training must see exactly the layout the engine mounts at answer time, otherwise the prefix learns to serve a
prompt it will never meet. So this is a thin adapter over :class:`agentmem.kv.prompt.PromptLayout` (memories sit
in the system block after a shared preamble, the question in the user turn): the document, when in context, is
one memory entry (``entry_ids``); a question is the engine's prompt suffix (``suffix_ids``); an answer is the
content ids plus the template's end-of-turn token (the teacher's distribution over "stop here" is trained too).

Example:
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> _, tok = tiny_causal_lm("llama")
    >>> layout = PromptLayout.for_tokenizer(tok)
    >>> tok.decode(layout.question_ids("Hi?"))
    '<|im_end|>\\n<|im_start|>user\\nHi?<|im_end|>\\n<|im_start|>assistant\\n'
"""

from __future__ import annotations

from typing import Any

from agentmem.kv.prompt import DEFAULT_SYSTEM_PROMPT
from agentmem.kv.prompt import PromptLayout as KvLayout

__all__ = ["PromptLayout"]

_MARK = "\u2063AGENTMEM-ANSWER-SLOT\u2063"


def _end_of_turn(tokenizer: Any) -> str:
    """Text the chat template puts after an assistant message (ChatML: ``<|im_end|>``), else the EOS token."""
    if getattr(tokenizer, "chat_template", None):
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARK}], tokenize=False)
            tail = text.split(_MARK, 1)[1].rstrip("\n")
            if tail:
                return tail
        except Exception:  # templates raise freely; the EOS token is a safe fallback
            pass
    return tokenizer.eos_token or ""


class PromptLayout:
    """What training and evaluation need from the engine's prompt layout (ids only, one piece at a time)."""

    def __init__(self, tokenizer: Any, kv_layout: KvLayout | None = None) -> None:
        self.tokenizer = tokenizer
        self.kv = kv_layout or KvLayout.from_tokenizer(tokenizer)
        self.end_of_turn = _end_of_turn(tokenizer)

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> PromptLayout:
        """The layout the default :class:`~agentmem.kv.KVEngine` uses for this tokenizer."""
        return cls(tokenizer, KvLayout.from_tokenizer(tokenizer, system_prompt))

    def preamble_ids(self) -> list[int]:
        return list(self.kv.preamble_ids)

    def document_ids(self, document: str) -> list[int]:
        """The document as one memory entry (what text mode would mount in place of the trained entry)."""
        return self.kv.entry_ids(document)

    def question_ids(self, question: str) -> list[int]:
        """Everything between the memories and the answer (the engine's suffix)."""
        return self.kv.suffix_ids(question)

    def answer_ids(self, answer: str, *, end: bool = True) -> list[int]:
        ids = self.kv._content_ids(answer)
        return ids + self._end_ids() if end else ids

    def _end_ids(self) -> list[int]:
        return self.kv._template_ids(self.end_of_turn)

    def stop_ids(self) -> set[int]:
        """Ids that end an answer: the end-of-turn token and EOS."""
        stops = set(self._end_ids()[:1])
        if self.tokenizer.eos_token_id is not None:
            stops.add(int(self.tokenizer.eos_token_id))
        return stops

    def identity(self) -> list[str]:
        """The strings that decide the layout (part of a training run's identity)."""
        kv = self.kv
        return [kv.preamble_text, kv.between_text, kv.after_text, kv.entry_prefix, kv.entry_suffix, self.end_of_turn]
