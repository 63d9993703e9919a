"""Time-aware recall: which queries ask about time, which memories say when something happened, which dates a
query names, and when a memory happened (from the entry's own ``occurred_at``, never from its memory line).

A question such as "When did Caroline go to the support group?" is answered by the turn that *dates* the event
("I went yesterday", "last May", "in 2022"), which the memory's own date then pins down. Such turns are a small
share of a conversation (about 10 % of LoCoMo's turns), so lifting them for time questions moves the answer up
without flooding the list. Measured in research/notes/retrieval-lab-notes.md: recall@5 +0.010 on the held-out folds.

Everything here reads plain text or the entry's fields: a memory's *text* (what the user remembered, not the line
recall embeds, which may carry a ``[date]`` stamp and a speaker), and its ``occurred_at`` (any timestamp string a
user gave, parsed by ``dateutil``), so no part depends on one dataset's line or date format.

Example:
    >>> asks_about_time("When did she move to Lyon?"), asks_about_time("Where does she live?")
    (True, False)
    >>> mentions_time("I went there yesterday"), mentions_time("see you soon")
    (True, False)
    >>> date_anchors("What did Kevin watch on 10.01.2024?")
    (DateAnchor(year=2024, month=1, day=10),)
    >>> event_date("1:56 pm on 8 May, 2023"), event_date("29.12.2023, 00:51:12")
    (datetime.date(2023, 5, 8), datetime.date(2023, 12, 29))
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from functools import lru_cache

from dateutil import parser as date_parser

# "when ...", "how long", "what year / month / day / date / time", or a relative-time word anywhere
_TIME_QUESTION = re.compile(
    r"^\s*(when|how long|what (year|month|day|date|time))\b|\b(before|after|last (year|month|week)|ago|since)\b",
    re.IGNORECASE,
)
# expressions that date an event inside the text itself
_TIME_EXPRESSION = re.compile(
    r"\b(yesterday|today|tonight|tomorrow|ago|recently"
    r"|last (week|weekend|month|year|night|monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
    r"|next (week|month|year)|this (morning|week|weekend|month|year)|(19|20)\d\d"
    r"|january|february|march|april|may|june|july|august|september|october|november|december)\b",
    re.IGNORECASE,
)

_MONTHS = {m: n for n, names in enumerate((
    ("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",), ("june", "jun"),
    ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"), ("october", "oct"), ("november", "nov"),
    ("december", "dec")), start=1) for m in names}
# a month name as a name is written (capitalised: "may" / "march" in lower case are verbs), an optional day before
# ("3 May", "the 10th of February") or after ("May 3rd"), and an optional year
_MONTH = "|".join(sorted((m.capitalize() for m in _MONTHS), key=len, reverse=True))
_ORD = r"(?:st|nd|rd|th)?"
_NAMED_DATE = re.compile(
    rf"(?:\b(?P<d1>\d{{1,2}}){_ORD}\s+(?:of\s+)?)?\b(?P<month>{_MONTH})\b\.?(?:\s+(?P<d2>\d{{1,2}}){_ORD}\b)?"
    rf"(?:,?\s+(?P<year>(?:19|20)\d\d)\b)?")
# numeric dates: day.month.year (dots: day first, as written wherever dots are used), month/day/year (slashes:
# dateutil's default, month first), and ISO year-month-day; a four-digit year only ("11/22/63" is a book)
_DOTTED = re.compile(r"\b(?P<d>\d{1,2})\.(?P<m>\d{1,2})\.(?P<y>(?:19|20)\d\d)\b")
_SLASHED = re.compile(r"\b(?P<m>\d{1,2})/(?P<d>\d{1,2})/(?P<y>(?:19|20)\d\d)\b")
_ISO = re.compile(r"\b(?P<y>(?:19|20)\d\d)-(?P<m>\d{1,2})-(?P<d>\d{1,2})\b")
_YEAR = re.compile(r"\b(?:19|20)\d\d\b")


@dataclass(frozen=True)
class DateAnchor:
    """A date a query names, as precise as it was written: a day, a month (of a year, or of any year) or a year.

    Example:
        >>> DateAnchor(2023, 5, None).holds(date(2023, 5, 8)), DateAnchor(None, 5, 3).holds(date(2022, 5, 3))
        (True, True)
    """

    year: int | None
    month: int | None
    day: int | None

    def holds(self, when: date) -> bool:
        """Whether ``when`` falls within this anchor (every field it names agrees)."""
        return ((self.year is None or when.year == self.year) and (self.month is None or when.month == self.month)
                and (self.day is None or when.day == self.day))


def asks_about_time(query: str) -> bool:
    """True for questions about when something happened (or how it sits in time).

    Example:
        >>> asks_about_time("What did she do after the race?")
        True
    """
    return _TIME_QUESTION.search(query) is not None


def mentions_time(text: str) -> bool:
    """True when a memory's text carries an expression that dates an event (pass the entry's text, not its memory
    line: the line's ``[date]`` stamp, or a speaker called June, would count).

    Example:
        >>> mentions_time("we met two years ago"), mentions_time("we met at the park")
        (True, False)
    """
    return _TIME_EXPRESSION.search(text) is not None


def _anchor(year: int | None, month: int | None, day: int | None) -> DateAnchor | None:
    """The anchor, or None when it names no real date (a 31st of February, a 13th month)."""
    if month is not None and not 1 <= month <= 12:
        return None
    if day is not None:
        try:
            date(year or 2000, month or 1, day)  # 2000: a leap year, so "29 February" with no year stands
        except ValueError:
            return None
    return DateAnchor(year, month, day)


@lru_cache(maxsize=4096)
def date_anchors(query: str) -> tuple[DateAnchor, ...]:
    """The dates ``query`` names, in order of appearance: numeric dates, month names (with a day and year where
    given), and bare years not part of either.

    Example:
        >>> date_anchors("Who did Maria have dinner with on May 3, 2023?")
        (DateAnchor(year=2023, month=5, day=3),)
        >>> date_anchors("Where did Joanna travel in July 2022, and where in 2023?")
        (DateAnchor(year=2022, month=7, day=None), DateAnchor(year=2023, month=None, day=None))
    """
    found: list[tuple[int, DateAnchor]] = []
    taken: list[range] = []
    for pattern in (_ISO, _DOTTED, _SLASHED):
        for m in pattern.finditer(query):
            anchor = _anchor(int(m["y"]), int(m["m"]), int(m["d"]))
            taken.append(range(m.start(), m.end()))  # a date that does not exist is no year either
            if anchor is not None:
                found.append((m.start(), anchor))
    for m in _NAMED_DATE.finditer(query):
        if any(m.start() in r for r in taken):
            continue
        day = m["d1"] or m["d2"]
        anchor = _anchor(int(m["year"]) if m["year"] else None, _MONTHS[m["month"].lower()],
                         int(day) if day else None)
        if anchor is not None:
            found.append((m.start(), anchor))
            taken.append(range(m.start(), m.end()))
    for m in _YEAR.finditer(query):
        if not any(m.start() in r for r in taken):
            found.append((m.start(), DateAnchor(int(m.group()), None, None)))
    return tuple(a for _, a in sorted(found, key=lambda kv: kv[0]))


_PROBES = (datetime(2000, 1, 1), datetime(2001, 2, 2))


@lru_cache(maxsize=65536)  # a store's turns share few timestamps, and each recurs in many heads
def event_date(occurred_at: str | None) -> date | None:
    """The calendar date of an entry's ``occurred_at`` (any form a user or dataset writes; dotted dates day first),
    or None when it holds no date.

    Example:
        >>> event_date("8 May 2023, 13:56"), event_date("2024-01-06T16:43:00"), event_date("in 2 weeks")
        (datetime.date(2023, 5, 8), datetime.date(2024, 1, 6), None)
    """
    if not occurred_at or not any(c.isdigit() for c in occurred_at):
        return None
    dayfirst = _DOTTED.search(occurred_at) is not None
    try:  # parsed against two different defaults: a field the text does not name comes out differently
        one, two = (date_parser.parse(occurred_at, default=d, fuzzy=True, dayfirst=dayfirst).date() for d in _PROBES)
    except (ValueError, OverflowError):
        return None
    return one if one == two else None


def happened_within(occurred_at: str | None, anchors: tuple[DateAnchor, ...], days: int = 0) -> bool:
    """Whether an entry's ``occurred_at`` falls within one of a query's date ``anchors``, or ``days`` either side
    of one (what happened on the 10th is told on the 11th, a plan for the 16th on the 15th).

    Example:
        >>> happened_within("10.01.2024, 21:03:00", date_anchors("What did Kevin watch on 10.01.2024?"))
        True
        >>> happened_within("12.01.2024, 00:56:22", date_anchors("What did Kevin watch on 10.01.2024?"), days=2)
        True
        >>> happened_within("8 May 2023, 13:56", date_anchors("Where was she in June 2023?"))
        False
    """
    when = event_date(occurred_at) if anchors else None
    if when is None:
        return False
    return any(a.holds(when + timedelta(days=d)) for d in range(-days, days + 1) for a in anchors)


__all__ = ["DateAnchor", "asks_about_time", "date_anchors", "event_date", "happened_within", "mentions_time"]
