"""Time-aware recall: which queries ask about time, and which memories say when something happened.

A question such as "When did Caroline go to the support group?" is answered by the turn that *dates* the event
("I went yesterday", "last May", "in 2022"), which the memory's own date then pins down. Such turns are a small
share of a conversation (about 10 % of LoCoMo's turns), so lifting them for time questions moves the answer up
without flooding the list. Measured in research/notes/retrieval-lab-notes.md: recall@5 +0.010 on the held-out folds.

Example:
    >>> asks_about_time("When did she move to Lyon?"), asks_about_time("Where does she live?")
    (True, False)
    >>> mentions_time("[8 May 2023, 13:56] Caroline: I went there yesterday")
    True
"""

from __future__ import annotations

import re

# "when ...", "how long", "what year / month / day / date / time", or a relative-time word anywhere
_TIME_QUESTION = re.compile(
    r"^\s*(when|how long|what (year|month|day|date|time))\b|\b(before|after|last (year|month|week)|ago|since)\b",
    re.IGNORECASE,
)
# expressions that date an event inside the text itself (the memory line's leading "[date]" is left out)
_TIME_EXPRESSION = re.compile(
    r"\b(yesterday|today|tonight|tomorrow|ago|recently"
    r"|last (week|weekend|month|year|night|monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
    r"|next (week|month|year)|this (morning|week|weekend|month|year)|(19|20)\d\d"
    r"|january|february|march|april|may|june|july|august|september|october|november|december)\b",
    re.IGNORECASE,
)


def asks_about_time(query: str) -> bool:
    """True for questions about when something happened (or how it sits in time).

    Example:
        >>> asks_about_time("What did she do after the race?")
        True
    """
    return _TIME_QUESTION.search(query) is not None


def mentions_time(memory_line: str) -> bool:
    """True when a memory's text (after its leading ``[date]`` stamp, if any) carries a time expression.

    Example:
        >>> mentions_time("[8 May 2023] Caroline: see you soon")
        False
    """
    body = memory_line.split("] ", 1)[1] if memory_line.startswith("[") and "] " in memory_line else memory_line
    return _TIME_EXPRESSION.search(body) is not None


__all__ = ["asks_about_time", "mentions_time"]
