"""The prompt layout: a shared preamble, one line per memory, then the question — as token ids.

Every entry is encoded right after the same preamble tokens and every prompt starts with them, so mounted entries
share one attention sink instead of each carrying its own (the APE idea). The layout is derived from the
tokenizer's chat template by rendering it with sentinel strings and splitting, so any template works; memories sit
in the system block, the question in the user turn, then the generation prompt. ChatML, for example, gives::

    preamble:  <|im_start|>system\\nYou are a helpful assistant. Relevant memories:\\n
    entry:     - {memory text}\\n
    suffix:    <|im_end|>\\n<|im_start|>user\\n{question}<|im_end|>\\n<|im_start|>assistant\\n

Sequences are always built by concatenating separately tokenized pieces, so KV mode and text mode see the very
same ids. Memory and question text are tokenized with ``split_special_tokens=True``: a memory that contains
"<|im_end|>" stays literal text and cannot close the system block.

Example:
    >>> from agentmem.kv.testing import tiny_tokenizer
    >>> tokenizer = tiny_tokenizer()
    >>> layout = PromptLayout.from_tokenizer(tokenizer)
    >>> ids = layout.preamble_ids + layout.entry_ids("Alice likes tea.") + layout.suffix_ids("What does Alice like?")
    >>> tokenizer.decode(ids).endswith("What does Alice like?<|im_end|>\\n<|im_start|>assistant\\n")
    True
"""

from __future__ import annotations

import functools
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_SYSTEM_PROMPT", "PromptLayout"]

_ENTRY_MEMO_SIZE = 4096  # memory lines whose ids stay memoised per layout
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Relevant memories:\n"
_SYS = "\u2063AGENTMEM-SYSTEM-SLOT\u2063"
_USER = "\u2063AGENTMEM-USER-SLOT\u2063"


def render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> str | None:
    """The chat template applied to ``messages`` with the generation prompt, or None if the template refuses them."""
    try:
        out = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:  # templates raise freely (e.g. "system role not supported"); we just try the next shape
        return None
    return out if isinstance(out, str) else None


# transformers' fast tokenizers set the backend's ``encode_special_tokens`` switch on every call that passes
# ``split_special_tokens`` (tokenization_utils_tokenizers.py): state of the tokenizer, not of the call. Two threads
# tokenizing at once, one user content (split) and one template piece (not split), could each run with the other's
# setting, and a template's <|im_end|> came out as literal characters (a wrong reply under concurrent session turns,
# issue #40; tests/unit/test_kv_prompt.py). Every encode of a layout holds this lock; tokenizing takes microseconds.
_ENCODE_LOCK = threading.Lock()


@dataclass(frozen=True)
class PromptLayout:
    """Text pieces around memories and question; ``kind`` is ``system``, ``user`` or ``plain``."""

    tokenizer: Any = field(repr=False, compare=False)
    preamble_text: str
    between_text: str  # after the last memory, before the question
    after_text: str  # after the question, through the generation prompt
    entry_prefix: str = "- "
    entry_suffix: str = "\n"
    kind: str = "system"

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> PromptLayout:
        """Derive the layout from the chat template; falls back to a plain format without one."""
        if getattr(tokenizer, "chat_template", None):
            text = render_chat(tokenizer, [{"role": "system", "content": _SYS}, {"role": "user", "content": _USER}])
            if text and text.count(_SYS) == 1 and text.count(_USER) == 1 and text.index(_SYS) < text.index(_USER):
                head, rest = text.split(_SYS)
                between, after = rest.split(_USER)
                return cls(tokenizer, head + system_prompt, between, after, kind="system")
            # Templates without a system role: memories open the user turn, the question follows them.
            text = render_chat(tokenizer, [{"role": "user", "content": _USER}])
            if text and text.count(_USER) == 1:
                head, after = text.split(_USER)
                return cls(tokenizer, head + system_prompt, "\nQuestion: ", after, kind="user")
        bos = getattr(tokenizer, "bos_token", None) if _adds_bos(tokenizer) else None
        return cls(tokenizer, (bos or "") + system_prompt, "\nQuestion: ", "\nAnswer:", kind="plain")

    # -- token ids -------------------------------------------------------------------------------------------
    def template_ids(self, text: str) -> list[int]:
        """Ids of a template piece; special-token strings in it (``<|im_start|>``) become special tokens."""
        if not text:
            return []
        with _ENCODE_LOCK:
            return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=False).input_ids)

    def content_ids(self, text: str) -> list[int]:
        """Ids of user-supplied content: special-token strings stay literal text (no prompt-structure injection)."""
        if not text:
            return []
        with _ENCODE_LOCK:
            return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids)

    # Older private names, kept for callers that used them.
    _template_ids = template_ids
    _content_ids = content_ids

    @property
    def preamble_ids(self) -> list[int]:
        # A copy: callers may append to it.
        return list(self._cached("_preamble", lambda: self.template_ids(self.preamble_text)))

    @property
    def preamble_digest(self) -> str:
        """sha256 of the preamble ids: stored with every entry, since KV encoded after another preamble differ."""
        return self._cached(
            "_preamble_digest", lambda: hashlib.sha256(",".join(map(str, self.preamble_ids)).encode()).hexdigest()
        )

    def entry_ids(self, text: str) -> list[int]:
        """Ids of one memory line (``- {text}\\n``), tokenized on its own.

        Memoised per text (bounded LRU): every mount plans with these ids and checks them against the stored
        ones, and re-tokenizing 19 entries cost ~14 ms per call at 2,048 memory tokens. The ids depend only on
        the text and this layout's tokenizer, which is fixed for the layout's lifetime (the engine fingerprints it).
        """
        memo = self._cached("_entry_memo", lambda: functools.lru_cache(maxsize=_ENTRY_MEMO_SIZE)(self._entry_tuple))
        return list(memo(text))  # a copy: callers may append to it

    def forget_entry_texts(self) -> None:
        """Empty the :meth:`entry_ids` memo: it is keyed by memory text, so an erased memory must not stay in it
        (``AgentMemory.forget`` calls this through ``KVBank.forget_erased``). It cannot drop one text; refilling
        costs one tokenisation per mounted entry.

        Example:
            >>> layout = PromptLayout(None, "", "", "")
            >>> layout.forget_entry_texts()  # nothing memoised yet: a no-op
        """
        memo = self.__dict__.get("_entry_memo")
        if memo is not None:
            memo.cache_clear()

    def _entry_tuple(self, text: str) -> tuple[int, ...]:
        prefix, suffix = self._template_tuple(self.entry_prefix), self._template_tuple(self.entry_suffix)
        return (*prefix, *self.content_ids(text), *suffix)

    def _template_tuple(self, text: str) -> tuple[int, ...]:
        """Ids of a fixed template piece, tokenized once per layout."""
        pieces = self._cached("_template_memo", dict)
        if text not in pieces:
            pieces[text] = tuple(self.template_ids(text))
        return pieces[text]

    def suffix_ids(self, question: str) -> list[int]:
        """Ids after the memories: close the memory block, the question, the generation prompt."""
        before, after = self._template_tuple(self.between_text), self._template_tuple(self.after_text)
        return [*before, *self.content_ids(question), *after]

    def prompt_ids(self, entries: list[list[int]], question: str) -> list[int]:
        """The full text-mode prompt: preamble + entries (in order) + suffix."""
        ids = list(self.preamble_ids)
        for e in entries:
            ids.extend(e)
        return ids + self.suffix_ids(question)

    def _cached(self, name: str, make):
        value = self.__dict__.get(name)
        if value is None:
            value = make()
            object.__setattr__(self, name, value)  # frozen dataclass: memoise without mutating fields
        return value


def _adds_bos(tokenizer: Any) -> bool:
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    try:
        return list(tokenizer("a").input_ids[:1]) == [bos]
    except Exception:
        return False
