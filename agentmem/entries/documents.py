"""Long texts as memories: a document, a web page or a long tool result, split into parts that recall and mounting
can each use.

One memory per long text fails twice: the dense index embeds only a text's first ~256 word pieces (MiniLM's
window), so a question about its tenth page matches nothing but BM25; and its KV never fits a mount (2,048 tokens
by default), so it is dropped whenever it is recalled. Parts of at most ``max_words`` words (150: about 200 tokens of
either model) keep every passage searchable and mountable on its own, the way LangChain's text splitters, Letta's
archival passages and LMCache's KV chunks do. Cuts fall between paragraphs, else between sentences, else between
words, so a part reads as a passage.

Example:
    >>> parts = split_document("First paragraph. It has two sentences.\\n\\nSecond one.", max_words=6)
    >>> parts
    ['First paragraph. It has two sentences.', 'Second one.']
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from agentmem.errors import InvalidInputError
from agentmem.text import sentences

__all__ = ["document_of", "document_parts", "split_document"]

_PARAGRAPH = re.compile(r"\n\s*\n")


def split_document(text: str, max_words: int = 150) -> list[str]:
    """``text`` cut into consecutive parts of at most ``max_words`` words (whitespace-separated), in order.

    Example:
        >>> split_document("one two three four five", max_words=2)
        ['one two', 'three four', 'five']
    """
    if not isinstance(max_words, int) or isinstance(max_words, bool) or max_words < 1:
        raise InvalidInputError(f"max_words must be a positive integer, got {max_words!r}")
    parts: list[str] = []
    current: list[str] = []  # the pieces of the part being filled
    used = 0
    for paragraph_start, piece in _pieces(text, max_words):
        n = len(piece.split())
        if current and used + n > max_words:
            parts.append(_join(current))
            current, used = [], 0
        current.append(("\n\n" if paragraph_start and current else " ") + piece)
        used += n
    if current:
        parts.append(_join(current))
    return parts


def document_parts(text: str, max_words: int, *, title: str | None = None,
                   document_id: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """``text``'s parts (:func:`split_document`), each with the ``metadata["document"]`` that numbers it: ``id``
    (``document_id``, or a new uuid shared by the parts), ``part`` (from 1), ``parts`` and ``title``.

    Example:
        >>> [(text, info["part"], info["parts"]) for text, info in document_parts("a b c", 2, document_id="d")]
        [('a b', 1, 2), ('c', 2, 2)]
    """
    parts = split_document(text, max_words)
    document_id = document_id or str(uuid.uuid4())
    return [(part, {"id": document_id, "part": n, "parts": len(parts), "title": title})
            for n, part in enumerate(parts, start=1)]


def document_of(metadata: dict[str, Any] | None) -> str | None:
    """The id of the document a memory is a part of (its ``metadata["document"]``, :func:`document_parts`), or None.

    Example:
        >>> document_of({"document": {"id": "d", "part": 2}}), document_of({"document": "my notes"}), document_of(None)
        ('d', None, None)
    """
    document = (metadata or {}).get("document")
    found = document.get("id") if isinstance(document, dict) else None  # a caller's own "document" value: none
    return str(found) if found is not None else None


def _pieces(text: str, max_words: int) -> list[tuple[bool, str]]:
    """(starts a paragraph, text) pieces no longer than ``max_words``: whole paragraphs, else sentences, else runs of
    words."""
    pieces: list[tuple[bool, str]] = []
    for paragraph in (p.strip() for p in _PARAGRAPH.split(text)):
        if not paragraph:
            continue
        first = True
        units = [paragraph] if len(paragraph.split()) <= max_words else sentences(paragraph)
        for unit in units:
            words = unit.split()
            if len(words) <= max_words:  # kept as written (a list's line breaks included)
                pieces.append((first, unit.strip()))
                first = False
                continue
            for i in range(0, len(words), max_words):
                pieces.append((first, " ".join(words[i:i + max_words])))
                first = False
    return pieces


def _join(pieces: list[str]) -> str:
    return "".join(pieces).strip()
