"""Turn the decoder's per-token callback into text pieces, as soon as each piece is printable.

A token may hold half of a UTF-8 character (byte-level BPE), and a tokenizer's decode of one id alone may differ
from its decode in context (leading spaces, merges). So the whole reply so far is decoded after each id and only
the new suffix is emitted, held back while it ends in an incomplete character (U+FFFD).

Example:
    >>> from agentmem.kv.testing import tiny_tokenizer
    >>> tokenizer = tiny_tokenizer()
    >>> pieces = []
    >>> stream = TextStream(tokenizer, pieces.append)
    >>> for token_id in tokenizer.encode("héllo", add_special_tokens=False):
    ...     stream.push(token_id)
    >>> stream.flush(); "".join(pieces)
    'héllo'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["StopCut", "TextStream", "cut_at_stop", "text_callback"]


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
        >>> from agentmem.kv.testing import tiny_tokenizer
        >>> tokenizer = tiny_tokenizer()
        >>> pieces = []
        >>> on_token, flush = text_callback(tokenizer, pieces.append)
        >>> for token_id in tokenizer.encode("Lyon.", add_special_tokens=False):
        ...     on_token(token_id)          # what a decoder calls per chosen id
        >>> flush(); "".join(pieces)
        'Lyon.'
    """
    if on_text is None:
        return None, lambda: None
    stream = TextStream(tokenizer, on_text)
    return stream.push, stream.flush


class StopCut:
    """Streams text up to the first stop string; holds back a tail that could still become one.

    Example:
        >>> cut = StopCut(["END"])
        >>> cut.feed("hello E") + cut.feed("ND more") + cut.rest()
        'hello '
    """

    def __init__(self, stop: Sequence[str] | None) -> None:
        self.stops = [s for s in (stop or []) if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.buffer = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The part of ``piece`` that can be emitted now ("" once a stop string was seen)."""
        if self.stopped:
            return ""
        self.buffer += piece
        cut = min((i for i in (self.buffer.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, out, self.buffer = True, self.buffer[:cut], ""
            return out
        if self.hold <= 0:
            out, self.buffer = self.buffer, ""
            return out
        out, self.buffer = self.buffer[: -self.hold], self.buffer[-self.hold:]
        return out

    def rest(self) -> str:
        """What is still held back, once the text has ended."""
        out, self.buffer = ("" if self.stopped else self.buffer), ""
        return out

    def streaming(self, on_text: Callable[[str], None] | None) -> tuple[Callable[[str], None] | None,
                                                                          Callable[[], None]]:
        """``(on_text, flush)``: a callback passing ``on_text`` the text before the first stop string, and the
        call that hands it the held-back tail at the end (both pass through when there are no stop strings)."""
        if on_text is None or not self.stops:
            return on_text, lambda: None

        def feed(piece: str) -> None:
            text = self.feed(piece)
            if text:
                on_text(text)

        def flush() -> None:
            text = self.rest()
            if text:
                on_text(text)

        return feed, flush


def cut_at_stop(text: str, stop: Sequence[str] | None) -> str:
    """``text`` up to its first stop string (all of it when none occurs).

    Example:
        >>> cut_at_stop("one. two.", ["."])
        'one'
    """
    if not stop:
        return text
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]
