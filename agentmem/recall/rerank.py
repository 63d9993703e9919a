"""Re-ranking the head of the fused list with what only the loaded rows tell: who spoke, and whether the
text dates the event.

- **Speaker**: a question that names one of the speakers found among the best candidates ("What did *Caroline*
  research?") is nearly always answered by that speaker's own words (96 % of the evidence turns of such LoCoMo
  questions). Their turns gain ``× (1 + speaker_boost)``. A query naming two speakers, or none, is left alone.
- **Time** (:mod:`agentmem.recall.temporal`): on a question about *when*, turns that carry a time expression gain
  ``× (1 + temporal_boost)``.

Both are multiplicative and ≥ 1, so a re-ranked head never falls below the unseen tail; on LoCoMo the head's
first 20 gave the same recall as its first 50. Chosen on held-out folds (research/notes/retrieval-lab-notes.md): recall@5 0.65 → 0.71.

Example:
    >>> head = [HeadEntry("a", 1.0, "Melanie", "Melanie: I paint"), HeadEntry("b", 0.8, "Caroline", "Caroline: I ran")]
    >>> [i for i, _ in rerank("What did Caroline do?", head, RetrievalParams())]
    ['b', 'a']
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from agentmem.recall.retrieval import RetrievalParams
from agentmem.recall.temporal import asks_about_time, mentions_time


class HeadEntry(NamedTuple):
    """One of the best candidates, with the row fields re-ranking reads."""

    id: str
    score: float
    speaker: str | None
    memory_line: str


def named_speakers(query: str, speakers: Iterable[str | None]) -> set[str]:
    """The speakers whose first name appears in ``query`` as a whole word (case-insensitive).

    Example:
        >>> sorted(named_speakers("what does caroline like?", ["Caroline Smith", "Melanie", None]))
        ['Caroline Smith']
    """
    out: set[str] = set()
    for speaker in {s for s in speakers if s and s.strip()}:
        first = speaker.split()[0]
        if re.search(rf"(?<!\w){re.escape(first)}(?!\w)", query, re.IGNORECASE):
            out.add(speaker)
    return out


def the_named_speaker(query: str, head: Sequence[HeadEntry]) -> str | None:
    """The one speaker of ``head`` that ``query`` names (None when it names none or several): whose turns the
    re-ranking lifts, and the learned head order's speaker features.

    Example:
        >>> the_named_speaker("what does Ann like?", [HeadEntry("a", 1.0, "Ann", "Ann: tea")])
        'Ann'
    """
    named = named_speakers(query, (h.speaker for h in head))
    return next(iter(named)) if len(named) == 1 else None


def rerank(query: str, head: Sequence[HeadEntry], params: RetrievalParams) -> list[tuple[str, float]]:
    """Boost the named speaker's turns and, for time questions, the turns that date an event; best first."""
    speaker = the_named_speaker(query, head) if params.speaker_boost else None
    timely = params.temporal_boost > 0 and asks_about_time(query)
    out: list[tuple[str, float]] = []
    for h in head:
        score = h.score
        if speaker is not None and h.speaker == speaker:
            score *= 1 + params.speaker_boost
        if timely and mentions_time(h.memory_line):
            score *= 1 + params.temporal_boost
        out.append((h.id, score))
    out.sort(key=lambda kv: (-kv[1], kv[0]))
    return out


__all__ = ["HeadEntry", "named_speakers", "rerank", "the_named_speaker"]
