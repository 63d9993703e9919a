"""Question-text cues and a widened head for the learned head order (:mod:`agentmem.recall.learned_rank`), measured
by ``research/learned_ablation.py`` (research/notes/retrieval-lab-notes.md, sessions 9 and 10).

- ``overlap``: the share of the question's content words (function words and the speakers' names left out) that
  the turn repeats, by a crude stem (:func:`stem`: "painting" meets "paints"); ``rare_overlap`` the same weighted
  by how few head entries hold the word (a word in every head entry tells nothing about any one of them).
- ``session_first``: 1 / (1 + the head entries above this one from its session): the session boost fills a head
  with one session's turns, and a multi-hop answer is spread over sessions.
- ``session_mass``: the share of the head from the entry's session.
- ``list_first``: a list question (``QueryInfo.is_list``, :mod:`agentmem.recall.query`) × ``session_first``.

:func:`widen` moves the best ``reserve`` of the dense and turn-context pools into the head: a turn deep in the fused
order but near the top of one pool is often the other half of a multi-hop answer.

Example:
    >>> question_words("What did Caroline paint?", ["Caroline"])
    ['paint']
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Sequence
from functools import lru_cache

import numpy as np

from agentmem.erasure import Erasure
from agentmem.text import content_words
from agentmem.recall.query import QueryInfo, as_query
from agentmem.recall.rerank import HeadEntry
from agentmem.recall.retrieval import Candidates, best_first
from agentmem.text import STOPWORDS

CUES = ("overlap", "rare_overlap", "session_first", "session_mass", "list_first")

_WORD = re.compile(r"[a-z0-9]+")
_STEM = 5  # prefix length (after a plural / -ing / -ed is cut) that stands in for a stemmer: cheap, rarely wrong


@lru_cache(maxsize=65536)  # a conversation's vocabulary is small and recurs in every head: stem each word once
def stem(word: str) -> str:
    """A crude stem: -ing / -ed / a plural s cut, then the first 5 letters.

    Example:
        >>> [stem(w) for w in ("painting", "paints", "painted", "lakes", "lake", "glass")]
        ['paint', 'paint', 'paint', 'lake', 'lake', 'glass']
    """
    if word.endswith("ing") and len(word) > 5:
        word = word[:-3]
    elif word.endswith("ed") and len(word) > 4:
        word = word[:-2]
    elif word.endswith("s") and not word.endswith("ss") and len(word) > 3:
        word = word[:-1]
    return word[:_STEM]


# a turn recurs in the heads of many questions of its conversation: tokenised once (0.4 -> 0.15 ms a question)
@lru_cache(maxsize=4096)
def _stems(text: str) -> frozenset[str]:
    return frozenset(stem(w) for w in content_words(text))


def forget_erased(_erasure: Erasure | None = None) -> None:
    """Empty the word and text caches of this module (:func:`stem`, the turns' stems): they are keyed by memory
    text, so an erased memory's words would stay in the process until the caches turned over. An
    :meth:`AgentMemory.on_erase` listener; the caches cannot drop one text, and refilling them costs a few ms.

    Example:
        >>> _ = _stems("Ann: I paint birds"); forget_erased(); _stems.cache_info().currsize
        0
    """
    _stems.cache_clear()
    stem.cache_clear()


def question_words(query: str | QueryInfo, speakers: Iterable[str | None]) -> list[str]:
    """The question's content words as stems, the speakers' first names left out.

    Example:
        >>> question_words("Would Ann go hiking with Bob?", ["Ann", "Bob"])
        ['go', 'hik']
    """
    skip = {stem(s.split()[0].lower()) for s in speakers if s and s.strip()}
    out: list[str] = []
    for w in _WORD.findall(as_query(query).text.lower()):
        s = stem(w)
        if w not in STOPWORDS and s not in skip and s not in out:
            out.append(s)
    return out


def cues(query: str | QueryInfo, bodies: Sequence[str], sessions: Sequence[str | None], speakers: Iterable[str | None],
         listed: bool) -> np.ndarray:
    """One row of ``CUES`` per head entry (``bodies``: the entries' own texts, best first).

    Example:
        >>> cues("Which birds did Ann paint?", ["Ann: I paint birds", "Ann: hi"], ["s1", "s1"], ["Ann"], True)
        array([[1. , 1. , 1. , 1. , 1. ],
               [0. , 0. , 0.5, 1. , 0.5]])
    """
    words = question_words(query, speakers)
    stems = [_stems(b) for b in bodies]
    n = len(bodies)
    # rarity within the head: a word most head entries repeat is what put them there, not what tells them apart
    idf = {w: math.log(1 + n / (1 + sum(w in s for s in stems))) for w in words}
    total_idf = sum(idf.values()) or 1.0
    seen: dict[str | None, int] = {}
    mass: dict[str | None, int] = {}
    for s in sessions:
        mass[s] = mass.get(s, 0) + 1
    rows = []
    for s, held in zip(sessions, stems):
        hits = [w for w in words if w in held]
        first = 1.0 / (1 + seen.get(s, 0)) if s is not None else 1.0  # no session: never a repeat
        seen[s] = seen.get(s, 0) + 1
        rows.append((len(hits) / len(words) if words else 0.0, sum(idf[w] for w in hits) / total_idf, first,
                     mass[s] / n if s is not None else 1.0 / n, float(listed) * first))
    return np.asarray(rows, dtype=np.float64).reshape(n, len(CUES))


def cue_columns(query: str | QueryInfo, head: Sequence[HeadEntry], order: Sequence[tuple[str, float]], cands: Candidates
                ) -> np.ndarray:
    """The ``CUES`` of ``order``'s entries (the re-ranked head), to stand beside the library's features.

    Example:
        >>> h = [HeadEntry("a", 1.0, "Ann", "[1 May 2023] Ann: hi", text="hi")]
        >>> cue_columns("hi?", h, [("a", 1.0)], Candidates({"a": 0.5}, {})).shape
        (1, 5)
    """
    query = as_query(query)
    by_id = {h.id: h for h in head}
    bodies = [by_id[i].body for i, _ in order]
    sessions = [getattr(cands.places.get(i), "session_id", None) for i, _ in order]
    return cues(query, bodies, sessions, {h.speaker for h in head}, query.is_list)


def widen(ranked: Sequence[tuple[str, float]], cands: Candidates, depth: int, reserve: int
          ) -> tuple[list[tuple[str, float]], int]:
    """``ranked`` (best first) with the best ``reserve`` of the dense and of the turn-context pools moved up to
    follow its first ``depth``, and the head's new depth.

    Example:
        >>> ranked = [("a", 3.0), ("b", 2.0), ("c", 1.0), ("d", 0.5)]
        >>> widen(ranked, Candidates({"d": 0.9, "a": 0.8}, {}), 1, reserve=1)
        ([('a', 3.0), ('d', 0.5), ('b', 2.0), ('c', 1.0)], 2)
        >>> widen(ranked, Candidates({"a": 0.9}, {}), 1, reserve=1)   # already in the head: nothing moves
        ([('a', 3.0), ('b', 2.0), ('c', 1.0), ('d', 0.5)], 1)
    """
    top = {i for i, _ in ranked[:depth]}
    moved = {i for pool in (cands.dense, cands.turn_context) for i, _ in best_first(pool)[:reserve]} - top
    return move_up(ranked, depth, moved)


def move_up(ranked: Sequence[tuple[str, float]], depth: int, moved: Collection[str]
            ) -> tuple[list[tuple[str, float]], int]:
    """``ranked`` with the ``moved`` ids found below its first ``depth`` moved up to follow them, and the new depth.

    Example:
        >>> move_up([("a", 3.0), ("b", 2.0), ("c", 1.0)], 1, {"c"})
        ([('a', 3.0), ('c', 1.0), ('b', 2.0)], 2)
    """
    if not moved:
        return list(ranked), depth
    # one pass over the rest: the moved ids keep their fused order (the re-ranking sorts the head by score anyway)
    extra, rest = [], []
    for kv in ranked[depth:]:
        (extra if kv[0] in moved else rest).append(kv)
    return list(ranked[:depth]) + extra + rest, depth + len(extra)


__all__ = ["CUES", "cue_columns", "cues", "forget_erased", "move_up", "question_words", "stem", "widen"]
