"""Token layout of a multi-turn conversation on top of the KV engine's single-question layout.

A session's prompt at turn *t* is::

    [preamble][memories mounted for turn t][turn 1] ... [turn t-1][turn t: user message + generation prompt]

where each finished turn is ``opener + user message + after_user + reply``. The pieces come from the tokenizer's
chat template (rendered with sentinel strings, like :class:`agentmem.kv.PromptLayout`), so for ChatML::

    first opener:  <|im_end|>\\n<|im_start|>user\\n        (closes the system block that holds the memories)
    next opener:   <|im_end|>\\n<|im_start|>user\\n        (closes the previous assistant reply)
    after_user:    <|im_end|>\\n<|im_start|>assistant\\n

Every piece is tokenized on its own and sequences are concatenations of pieces, so a reused cache, a rebuilt one
and a from-scratch text re-encoding all see exactly the same ids. User text is tokenized with
``split_special_tokens=True`` (a message containing ``<|im_end|>`` cannot close its turn); replies are kept as the
ids the model generated.

Example:
    >>> from agentmem.kv.prompt import PromptLayout
    >>> from agentmem.kv.testing import tiny_tokenizer
    >>> tokenizer = tiny_tokenizer()
    >>> chat = ChatLayout.from_prompt_layout(PromptLayout.from_tokenizer(tokenizer))
    >>> ids = chat.user_turn_ids("Hello!", first=True)         # opener + message + assistant prompt
    >>> tokenizer.decode(ids).endswith("Hello!<|im_end|>\\n<|im_start|>assistant\\n")
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentmem.kv.prompt import render_chat

__all__ = ["ChatLayout"]

_S = "\u2063AGENTMEM-S\u2063"
_U1 = "\u2063AGENTMEM-U1\u2063"
_A1 = "\u2063AGENTMEM-A1\u2063"
_U2 = "\u2063AGENTMEM-U2\u2063"


def _between(text: str, first: str, second: str) -> str | None:
    if text.count(first) != 1 or text.count(second) != 1:
        return None
    i, j = text.index(first) + len(first), text.index(second)
    return text[i:j] if i <= j else None


@dataclass(frozen=True)
class ChatLayout:
    """The three template pieces around conversation turns, as text and (cached) token ids."""

    prompt: Any = field(repr=False, compare=False)  # the engine's PromptLayout: the one place text becomes ids
    first_open_text: str  # closes the memory block, opens the first user message (= PromptLayout.between_text)
    next_open_text: str  # closes an assistant reply, opens the next user message
    after_user_text: str  # closes a user message, opens the assistant reply (= PromptLayout.after_text)

    @classmethod
    def from_prompt_layout(cls, layout: Any) -> ChatLayout:
        """Derive the multi-turn pieces from the engine's layout and its tokenizer's chat template."""
        tok = layout.tokenizer
        next_open: str | None = None
        if layout.kind in ("system", "user") and getattr(tok, "chat_template", None):
            head = [{"role": "system", "content": _S}] if layout.kind == "system" else []
            text = render_chat(tok, head + [
                {"role": "user", "content": _U1}, {"role": "assistant", "content": _A1},
                {"role": "user", "content": _U2},
            ])
            if text is not None:
                next_open = _between(text, _A1, _U2)
        if next_open is None:  # plain prompts (and templates that refuse the probe): "...reply\nQuestion: ..."
            next_open = layout.between_text
        return cls(layout, layout.between_text, next_open, layout.after_text)

    # -- ids ----------------------------------------------------------------------------------------------
    def _template_ids(self, text: str) -> list[int]:
        # Template pieces may hold special tokens (<|im_start|>): the tokenizer recognises them.
        return self.prompt.template_ids(text)

    def content_ids(self, text: str) -> list[int]:
        """User-supplied text: special-token strings stay literal (no prompt-structure injection)."""
        return self.prompt.content_ids(text)

    def _cached(self, name: str, text: str) -> list[int]:
        value = self.__dict__.get(name)
        if value is None:
            value = self._template_ids(text)
            object.__setattr__(self, name, value)  # frozen dataclass: memoise without mutating fields
        return list(value)

    @property
    def first_open_ids(self) -> list[int]:
        return self._cached("_first_open", self.first_open_text)

    @property
    def next_open_ids(self) -> list[int]:
        return self._cached("_next_open", self.next_open_text)

    @property
    def after_user_ids(self) -> list[int]:
        return self._cached("_after_user", self.after_user_text)

    @property
    def openers_match(self) -> bool:
        """Whether dropping the oldest turns leaves a valid prefix as is (ChatML, Llama 3: yes)."""
        return self.first_open_ids == self.next_open_ids

    def opener_ids(self, first: bool) -> list[int]:
        return self.first_open_ids if first else self.next_open_ids

    def user_turn_ids(self, text: str, *, first: bool) -> list[int]:
        """Opener + user message + the assistant generation prompt."""
        return self.opener_ids(first) + self.content_ids(text) + self.after_user_ids

    def turn_ids(self, user: str, reply_ids: list[int], *, first: bool) -> list[int]:
        """A whole finished turn (what a rebuild re-encodes)."""
        return self.user_turn_ids(user, first=first) + list(reply_ids)
