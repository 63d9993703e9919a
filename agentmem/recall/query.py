"""The query, parsed once: what every ranking stage reads about the question, computed before the first stage and
passed down (:func:`agentmem.recall.head.rank_candidates` parses it; the list question's session weight, the
re-ranking's speaker and time boosts, the learned order's features and its question-word cues all read it).

What is parsed, by the question's form only (no dataset's phrasing, no topic word list):

- ``wh``: the question word ("when", "what", "which", "who", "where", "why", "how"), or None (a yes/no question
  or a plain search string);
- ``asks_time``: a question about when something happened (:func:`agentmem.recall.temporal.asks_about_time`);
- ``is_list``: a question whose answer is a set of things (:func:`list_question`; what it changes:
  :mod:`agentmem.recall.multihop`);
- ``anchors``: the dates it names (:func:`agentmem.recall.temporal.date_anchors`; no stage ranks by them yet: a
  boost of the head entries dated on them had no held-out gain on either dev set, ``research/query_ablation.py``);
- ``words``: its word tokens as written, for matching the speakers it names (:meth:`QueryInfo.named_speakers`),
  which are known only once the head's rows are read.

Example:
    >>> q = parse_query("When did Muhammad play Fortnite on 30.12.2023?")
    >>> q.wh, q.asks_time, q.is_list, q.anchors
    ('when', True, False, (DateAnchor(year=2023, month=12, day=30),))
    >>> q.the_named_speaker(["Fahim Khan", "Muhhamed"])
    'Muhhamed'
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import lru_cache

from agentmem.erasure import Erasure
from agentmem.recall.temporal import DateAnchor, asks_about_time, date_anchors, event_date

_WH = ("when", "what", "which", "who", "whom", "whose", "where", "why", "how")
_TOKEN = re.compile(r"\w+")
# a name written another way ("Muhammad" / "Muhhamed", "Faheem" / "Fahim", "Elisa" / "Elise") is matched only when
# both are at least this long, start alike, differ in length by at most 2 and are this similar (difflib's ratio):
# "Carol" is not "Caroline", "Milan" not "Melanie", "Jon" not "John"
_FUZZY_MIN_LEN = 5
_FUZZY_RATIO = 0.7


# what/which + (one optional word) + a plural noun — not a verb ending in s (is, does, was, has) — or the
# counting / enumerating openings
_LIST = re.compile(r"^\s*(?:(?:what|which)\s+(?:\w+\s+)?\w+s\b(?<!\bis)(?<!\bdoes)(?<!\bwas)(?<!\bhas)"
                   r"|how many\b|in what ways\b|what are some\b)", re.IGNORECASE)


def list_question(query: str) -> bool:
    """Does the question ask for a set of things (by its form: a plural noun after *what* / *which*, or *how many*
    / *in what ways* / *what are some*)?

    Example:
        >>> [list_question(q) for q in ("How many times has John injured his ankle?", "When did Mel paint?")]
        [True, False]
    """
    return bool(_LIST.search(query))


@dataclass(frozen=True)
class QueryInfo:
    """One query as every ranking stage reads it (see the module docstring); build it with :func:`parse_query`.

    Example:
        >>> parse_query("What hobbies does Ann have?").is_list
        True
    """

    text: str
    wh: str | None
    asks_time: bool
    is_list: bool
    anchors: tuple[DateAnchor, ...]
    words: tuple[str, ...]

    def named_speakers(self, speakers: Iterable[str | None]) -> set[str]:
        """The ``speakers`` this query names: by their first name as a whole word (case-insensitive), or, for a
        capitalised query word that names no speaker exactly, by a close spelling of it (see ``_FUZZY_RATIO``).

        Example:
            >>> sorted(parse_query("what does caroline like?").named_speakers(["Caroline Smith", "Melanie", None]))
            ['Caroline Smith']
            >>> parse_query("What did Carol say?").named_speakers(["Caroline", "Carol"])
            {'Carol'}
        """
        firsts = {s: s.split()[0] for s in {s for s in speakers if s and s.strip()}}
        out = {s for s, first in firsts.items() if _names(self.text, first)}
        exact = {first.lower() for s, first in firsts.items() if s in out}
        for word in self.words:
            if word[:1].isupper() and word.lower() not in exact and len(word) >= _FUZZY_MIN_LEN:
                out.update(s for s, first in firsts.items() if _close(word.lower(), first.lower()))
        return out

    def the_named_speaker(self, speakers: Iterable[str | None]) -> str | None:
        """The one speaker this query names (None when it names none or several).

        Example:
            >>> parse_query("Did Ann and Bob go?").the_named_speaker(["Ann", "Bob"]) is None
            True
        """
        named = self.named_speakers(speakers)
        return next(iter(named)) if len(named) == 1 else None


@lru_cache(maxsize=65536)
def _names(text: str, name: str) -> bool:
    """Whether ``text`` holds ``name`` as a whole word, any case ("Mary-Jane" and "O'Brien" too)."""
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.IGNORECASE) is not None


def _close(word: str, name: str) -> bool:
    """Two spellings of one name (both lower-cased)."""
    return (len(name) >= _FUZZY_MIN_LEN and word[0] == name[0] and abs(len(word) - len(name)) <= 2
            and SequenceMatcher(None, word, name).ratio() >= _FUZZY_RATIO)


@lru_cache(maxsize=1024)  # a benchmark or an agent asks one question of many stores
def parse_query(text: str) -> QueryInfo:
    """Parse ``text`` once into the :class:`QueryInfo` every ranking stage reads.

    Example:
        >>> parse_query("Which cities has Jon visited since 2020?").anchors
        (DateAnchor(year=2020, month=None, day=None),)
    """
    words = tuple(_TOKEN.findall(text))
    lead = [w.lower() for w in words[:3]]  # "In what ways ...", "With who did ...": the question word comes early
    wh = next((w for w in lead if w in _WH), None)
    return QueryInfo(text=text, wh=wh, asks_time=asks_about_time(text), is_list=list_question(text),
                     anchors=date_anchors(text), words=words)


def forget_erased(_erasure: Erasure | None = None) -> None:
    """Empty the caches of the query parse and the time signals (:func:`parse_query`, the speaker-name matches,
    :func:`agentmem.recall.temporal.date_anchors` and ``event_date``): they hold speakers' names and entries'
    timestamps, which leave with an erased entry. An :meth:`AgentMemory.on_erase` listener; refilling costs little.

    Example:
        >>> _ = parse_query("Where is Bob?"); forget_erased(); parse_query.cache_info().currsize
        0
    """
    for cached in (parse_query, _names, date_anchors, event_date):
        cached.cache_clear()


def as_query(query: str | QueryInfo) -> QueryInfo:
    """``query`` as a :class:`QueryInfo` (parsed once per distinct text: :func:`parse_query` keeps the last ones).

    Example:
        >>> as_query("Where is Bob?") is as_query(as_query("Where is Bob?"))
        True
    """
    return query if isinstance(query, QueryInfo) else parse_query(query)


__all__ = ["QueryInfo", "as_query", "forget_erased", "list_question", "parse_query"]
