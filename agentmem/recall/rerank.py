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

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from agentmem.recall.query import QueryInfo, as_query
from agentmem.recall.retrieval import RetrievalParams
from agentmem.recall.temporal import mentions_time


class HeadEntry(NamedTuple):
    """One of the best candidates, with the row fields re-ranking reads: ``text`` is the entry's own text and
    ``occurred_at`` its timestamp as stored (the ``memory_line`` is what was indexed and encoded; ranking never parses it).

    Example:
        >>> HeadEntry("a", 1.0, "Ann", "[1 May 2023] Ann: hi", text="hi").body
        'hi'
    """

    id: str
    score: float
    speaker: str | None
    memory_line: str
    text: str | None = None
    occurred_at: str | None = None

    @property
    def body(self) -> str:
        """The entry's own text (its memory line where the caller gave none)."""
        return self.memory_line if self.text is None else self.text


def named_speakers(query: str | QueryInfo, speakers: Iterable[str | None]) -> set[str]:
    """The speakers ``query`` names (:meth:`agentmem.recall.query.QueryInfo.named_speakers`).

    Example:
        >>> sorted(named_speakers("what does caroline like?", ["Caroline Smith", "Melanie", None]))
        ['Caroline Smith']
    """
    return as_query(query).named_speakers(speakers)


def the_named_speaker(query: str | QueryInfo, head: Sequence[HeadEntry]) -> str | None:
    """The one speaker of ``head`` that ``query`` names (None when it names none or several): whose turns the
    re-ranking lifts, and the learned head order's speaker features.

    Example:
        >>> the_named_speaker("what does Ann like?", [HeadEntry("a", 1.0, "Ann", "Ann: tea")])
        'Ann'
    """
    return as_query(query).the_named_speaker(h.speaker for h in head)


def rerank(query: str | QueryInfo, head: Sequence[HeadEntry], params: RetrievalParams) -> list[tuple[str, float]]:
    """Boost the named speaker's turns and, for time questions, the turns that date an event; best first."""
    info = as_query(query)
    speaker = info.the_named_speaker(h.speaker for h in head) if params.speaker_boost else None
    timely = params.temporal_boost > 0 and info.asks_time
    out: list[tuple[str, float]] = []
    for h in head:
        score = h.score
        if speaker is not None and h.speaker == speaker:
            score *= 1 + params.speaker_boost
        if timely and mentions_time(h.body):
            score *= 1 + params.temporal_boost
        out.append((h.id, score))
    out.sort(key=lambda kv: (-kv[1], kv[0]))
    return out


__all__ = ["HeadEntry", "named_speakers", "rerank", "the_named_speaker"]
