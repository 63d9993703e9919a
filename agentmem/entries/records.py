"""The ``MemoryRecord`` ⇄ catalog-row mapping (no I/O). Input checks live in :mod:`agentmem.validation`."""

from __future__ import annotations

import re
from typing import Any

from agentmem.ports.catalog import EntryRecord
from agentmem.types import Hit, KvInfo, MemoryRecord, utc_from_epoch


def memory_line(text: str, *, kind: str, speaker: str | None, role: str | None, occurred_at: str | None) -> str:
    """The line that is indexed (BM25) and encoded (KV): who said it and when travel with the text.

    Example:
        >>> memory_line("I moved to Lyon.", kind="turn", speaker="Ana", role="user", occurred_at="5 May 2026, 09:02")
        '[5 May 2026, 09:02] Ana: I moved to Lyon.'
    """
    who = speaker or (role.capitalize() if role else None)
    if kind == "tool":
        who = f"Tool {speaker}" if speaker else "Tool result"
    head = " ".join(p for p in (f"[{occurred_at}]" if occurred_at else None, f"{who}:" if who else None) if p)
    return f"{head} {text}" if head else text


def embedding_line(text: str, *, kind: str, speaker: str | None, role: str | None) -> str:
    """The line whose vector the dense index holds: the memory line without its time. A time stamp is noise to a
    sentence embedder (it moved a short memory's cosine to its question by up to 0.1 from one minute to the next),
    and time questions are matched from ``occurred_at`` and the lexical index; without it recall@5 / @10 rose
    0.7666 / 0.8421 -> 0.7797 / 0.8500 on LoCoMo dev and 0.5980 / 0.6991 -> 0.6074 / 0.7022 on REALTALK dev
    (research/notes/retrieval-lab-notes.md, round 3 session 5).

    Example:
        >>> embedding_line("I moved to Lyon.", kind="turn", speaker="Ana", role="user")
        'Ana: I moved to Lyon.'
    """
    return memory_line(text, kind=kind, speaker=speaker, role=role, occurred_at=None)


def own_text(text: str, *, kind: str, speaker: str | None) -> str:
    """The text whose vector a row keeps for ``Hit.score`` (:mod:`agentmem.recall.calibration`): the memory's own
    text, without who said it or when; a tool result's with its tool's name in front, in words.

    A person's name says who spoke. A tool's name says what its result is about ("search_flights"), and an agent's
    transcript keeps it on the call, not in the result. Read without it, tool results stored from a transcript
    scored >= 0.5 for the questions they answer 0.71 of the time, against 0.83 for the same outputs stored as one
    line naming the tool; read with it, 0.83 (research/tool_message_scores.py, on tool outputs written after the
    score's fit; research/notes/scores.md). Only the vector reads the name: the word overlap reads the result's own
    words (:func:`overlap_leaves_out`), since a verb of the name ("get_") would make "How do I get to the airport?"
    overlap every ``get_*`` result.

    Example:
        >>> own_text('called with {"to": "LIS"}, returned: TP751 at 10:40', kind="tool", speaker="search_flights")
        'search flights: called with {"to": "LIS"}, returned: TP751 at 10:40'
        >>> own_text("I moved to Lyon.", kind="turn", speaker="Ana")
        'I moved to Lyon.'
    """
    if kind == "tool" and speaker:
        return f"{' '.join(_NAME_WORDS.findall(speaker))}: {text}"
    return text


def overlap_leaves_out(kind: str, speaker: str | None) -> str | None:
    """The name the score's word overlap leaves out of the query: a person's (every turn of a speaker would match
    it; what they said is what answers); not a tool's, which its result does not say (leaving ``get_weather`` out
    took "weather" from "What's the weather in Oslo?", so its result matched on "Oslo" alone).

    Example:
        >>> overlap_leaves_out("turn", "Caroline"), overlap_leaves_out("tool", "get_weather")
        ('Caroline', None)
    """
    return None if kind == "tool" else speaker


_NAME_WORDS = re.compile(r"[^\W_]+")  # a tool's name in words: get_weather -> get weather, calendar.list -> ...


def to_record(row: EntryRecord, *, text: str | None = None, memory_text: str | None = None) -> MemoryRecord:
    return MemoryRecord(**_record_fields(row, text, memory_text))


def to_hit(row: EntryRecord, score: float, scores: dict[str, float], *, text: str | None = None,
           memory_text: str | None = None, contradicted_by: str | None = None) -> Hit:
    return Hit(**_record_fields(row, text, memory_text), score=score, scores=scores, contradicted_by=contradicted_by)


def _record_fields(row: EntryRecord, text: str | None, memory_text: str | None) -> dict[str, Any]:
    kv = None
    if row.kv_path and row.kv_fingerprint:
        kv = KvInfo(path=row.kv_path, tokens=row.kv_tokens or 0, fingerprint=row.kv_fingerprint,
                    dtype=row.kv_dtype or "", kb_version=row.kb_version)
    return dict(
        id=row.id, text=row.text if text is None else text,
        memory_text=row.memory_text if memory_text is None else memory_text,
        user_id=row.user_id, session_id=row.session_id, kind=row.kind, role=row.role, speaker=row.speaker,
        occurred_at=row.occurred_at, tags=row.tags, metadata=dict(row.metadata_json or {}),
        created_at=utc_from_epoch(row.created_at), expires_at=utc_from_epoch(row.expires_at), kv=kv,
        version=row.version or 1, status=row.status or "active", superseded_by=row.superseded_by,
        seen_count=row.seen_count or 1,
    )
