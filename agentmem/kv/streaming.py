"""Turn the decoder's per-token callback into text pieces, as soon as each piece is printable.

A token may hold half of a UTF-8 character (byte-level BPE), and a tokenizer's decode of one id alone may differ
from its decode in context (leading spaces, merges). So the whole reply so far is decoded after each id and only
the new suffix is emitted, held back while it ends in an incomplete character (U+FFFD).

Example:
    >>> pieces = []
    >>> stream = TextStream(tokenizer, pieces.append)
    >>> for token_id in tokenizer.encode("héllo", add_special_tokens=False):
    ...     stream.push(token_id)
    >>> stream.flush(); "".join(pieces)
    'héllo'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["TextStream", "text_callback"]


class TextStream:
    """Feeds ``on_text`` the text each new token adds (``push`` is a decoder ``on_token`` callback)."""

    def __init__(self, tokenizer: Any, on_text: Callable[[str], None]) -> None:
        self._tok = tokenizer
        self._on_text = on_text
        self._ids: list[int] = []
        self._sent = 0  # characters of the decoded reply already emitted

    def push(self, token_id: int) -> None:
        """Add one generated id; emit the text it completes (nothing while a character is incomplete)."""
        self._ids.append(int(token_id))
        text = self._tok.decode(self._ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # the rest of a multi-byte character is in the next token
            return
        self._emit(text)

    def flush(self) -> None:
        """Emit whatever is left (an incomplete last character included) once decoding has ended."""
        if self._ids:
            self._emit(self._tok.decode(self._ids, skip_special_tokens=True))

    def _emit(self, text: str) -> None:
        if len(text) > self._sent:
            piece, self._sent = text[self._sent:], len(text)
            self._on_text(piece)


def text_callback(tokenizer: Any, on_text: Callable[[str], None] | None) -> tuple[Callable[[int], None] | None,
                                                                                    Callable[[], None]]:
    """``(on_token, flush)`` for a decoder call: both no-ops when ``on_text`` is None.

    Example:
        >>> on_token, flush = text_callback(tokenizer, print)
        >>> ids = decode(model, cache, logits, max_new_tokens=32, on_token=on_token); flush()
    """
    if on_text is None:
        return None, lambda: None
    stream = TextStream(tokenizer, on_text)
    return stream.push, stream.flush
