"""Plain text helpers shared by several parts: the function words every text match of the library ignores (BM25's
query, :func:`agentmem.backends.sqlite.catalog.fts_query`; the local consolidation's word overlap,
:mod:`agentmem.consolidate.local`; the head's question-word cues, :mod:`agentmem.recall.head_cues`; the topic
detector of :mod:`agentmem.sessions.topic`) and the content words they leave. One set, so all agree on what a
content word is. Likewise one sentence splitter (:func:`sentences`), for the consolidation's statement rules and
the parts of a long document.

Example:
    >>> sorted(w for w in "where did the dog go".split() if w not in STOPWORDS)
    ['dog', 'go']
    >>> sorted(content_words("I live in Lyon, and I love it!"))
    ['live', 'love', 'lyon']
"""

from __future__ import annotations

import re

# Function words carry no topic; dropping them keeps BM25's OR-query from matching everything.
STOPWORDS: frozenset[str] = frozenset(
    """a an the and or but if of at by for with about against between into through during before after above below
    to from up down in out on off over under again further then once here there when where why how all any both each
    few more most other some such no nor not only own same so than too very s t can will just don should now is are
    was were be been being have has had having do does did doing i me my myself we our ours you your yours he him his
    she her hers it its they them their what which who whom this that these those am would could shall might must
    ever also yet""".split()
)

_WORD = re.compile(r"[a-z0-9]+")
# between two sentences: whitespace after an end mark (. ! ? … and the full-width ！ ？ 。), the mark kept
_SENTENCE_BREAK = re.compile(r"(?<=[.!?\u2026\uff01\uff1f\u3002])\s+")


def sentences(text: str) -> list[str]:
    """``text``'s sentences, each with its end mark (none for a blank text).

    Example:
        >>> sentences("Hey! How are you?  I moved to Lyon."), sentences("  ")
        (['Hey!', 'How are you?', 'I moved to Lyon.'], [])
    """
    return [s.strip() for s in _SENTENCE_BREAK.split(text.strip()) if s.strip()]


def content_words(text: str) -> set[str]:
    """Lower-cased words that carry content (stopwords dropped).

    Example:
        >>> sorted(content_words("Where did the dog go?"))
        ['dog', 'go']
    """
    return {w for w in _WORD.findall(text.lower()) if w not in STOPWORDS}


__all__ = ["STOPWORDS", "content_words"]
