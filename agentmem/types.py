"""Value objects returned by the public API."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, is_dataclass
from datetime import datetime, timezone
from typing import Any, Literal

Kind = Literal["turn", "tool", "knowledge", "trained", "profile"]
# profile: facts about the user and standing instructions (preferences, constraints) that apply to every request:
# mounted with every answer whatever it asks, like Letta's core memory (MemoryConfig.mount_profile_max)
KINDS: tuple[str, ...] = ("turn", "tool", "knowledge", "trained", "profile")


def utc_from_epoch(seconds: float | None) -> datetime | None:
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        # an expiry beyond year 9999 (written before ttl had an upper bound) must not break every read
        return datetime.max.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class KvInfo:
    """Where an entry's KV blob lives and which model made it."""

    path: str
    tokens: int
    fingerprint: str
    dtype: str
    kb_version: str | None = None


@dataclass(frozen=True)
class MemoryRecord:
    """One stored memory entry.

    ``text`` is what the caller remembered; ``memory_text`` is the line that is indexed and
    encoded to KV (it keeps who said it and when, because temporal questions depend on it; its vector leaves the
    time out). Records returned by
    ``remember`` / ``remember_many`` also say what the write did (``event``, as mem0's ``add()``):

    >>> rec = mem.remember("I take 10 mg of amlodipine daily.", user_id="u1")
    >>> rec.event, rec.superseded_ids, rec.matched_id, rec.memory_text.endswith("] I take 10 mg of amlodipine daily.")
    ('ADD', (), None, True)
    """

    id: str
    text: str
    memory_text: str
    user_id: str
    session_id: str | None
    kind: str
    role: str | None
    speaker: str | None
    occurred_at: str | None
    tags: tuple[str, ...]
    metadata: dict[str, Any]
    created_at: datetime
    expires_at: datetime | None
    kv: KvInfo | None = None
    version: int = 1
    status: str = "active"  # "superseded" (see superseded_by) or "deleted" (retracted by consolidation)
    superseded_by: str | None = None
    seen_count: int = 1  # how many times the same statement was remembered (merged into this one)
    # what the write that returned this record did (None on records read back by get / list / recall):
    # "ADD" a new entry; "UPDATE" a new entry that superseded ``superseded_ids``; "NOOP" the same statement again,
    # counted on the existing entry ``matched_id`` (this record is that entry)
    event: Literal["ADD", "UPDATE", "NOOP"] | None = None
    superseded_ids: tuple[str, ...] = ()
    matched_id: str | None = None


@dataclass(frozen=True)
class MemoryVersion:
    """One event in an entry's history (``mem.history(id)``): ``op`` is add, update, supersede, merge, delete or
    restore; ``text`` is what the entry said then; ``related_id`` names the entry that superseded it, if any."""

    version: int
    op: str
    text: str
    at: datetime
    reason: str | None = None
    related_id: str | None = None


@dataclass(frozen=True)
class Hit(MemoryRecord):
    """A recalled entry and how likely it answers the query.

    ``score`` is in [0, 1] and reads the same whatever the store holds (one memory or 100,000; conversation turns,
    tool results or documents): it is computed from the query and this memory alone — their cosine and the share of
    the query's content words the memory holds — by a model fitted on two conversation datasets and small stores of
    facts, preferences, tool outputs and documents (:mod:`agentmem.recall.calibration`). A memory that answers the
    query scores about 0.5 or more, an unrelated one 0.3 or less, so ``recall(..., min_score=0.5)`` keeps what
    answers and ``MemoryConfig.mount_min_score`` (0.3) mounts what may answer, not what is unrelated. Hits come in
    rank order, which uses more signals (the memory's neighbours and session, BM25 against the store, a learned head
    order), so a later hit can score higher than an earlier one. ``scores`` keeps the parts: ``text_dense`` (the cosine the score reads: the
    memory's own text, without the time and speaker of its line), ``dense`` (the memory line's cosine, which the
    ranking reads), ``overlap`` (share of the query's content words), ``lexical`` (BM25, when the query's words matched), ``context`` (the turn's context-vector
    cosine, when among the nearest), ``rank`` (the ranking score the order follows) and ``stands_for`` (for a memory
    recalled in the place of an older version it superseded: that version's score; a mount holds it when that score
    clears the threshold). ``contradicted_by`` is the id of a newer recalled memory that states another value of the
    same thing ("My doctor changed my dose to 40 mg." for "I take 20 mg."): recall's conflict
    check ranks this one behind it but keeps it, and its score (how well it matches the query) stays as high, so a
    caller that filters by ``min_score`` can also drop what a newer memory contradicts (a mount leaves it out:
    :attr:`MountChoice.contradicted`). None where no recalled memory contradicts it (and with consolidation off).

    >>> recital = mem.remember("My daughter's piano recital is on the 14th of May.", user_id="u1")
    >>> hits = mem.recall("When is my daughter's piano recital?", user_id="u1")
    >>> hits[0].id == recital.id, hits[0].score >= 0.5, hits[-1].score < 0.3     # mem's other two memories
    (True, True, True)
    """

    score: float = 0.0
    scores: dict[str, float] = field(default_factory=dict)
    contradicted_by: str | None = None


@dataclass(frozen=True)
class MountChoice:
    """What the mount policy chose for a query (:meth:`agentmem.AgentMemory.mount_choice`): the hits to mount, in rank
    order, the recalled hits left out because they score below ``threshold`` (the higher of
    ``MemoryConfig.mount_min_score`` and the caller's ``min_score``), and those left out because a newer recalled
    memory of the same speaker contradicts them (``contradicted``: the consolidation's conflict check, with
    consolidation on; the newer one is mounted only if it scores over the threshold itself), so a tool such as the
    inspector can say why a memory was not mounted.

    >>> choice = mem.mount_choice("What is my dog called?", user_id="u1")      # mem: two memories of u1
    >>> [h.text for h in choice.mounted], [(h.text, h.score < choice.threshold) for h in choice.below_threshold]
    (['My dog is called Rex.'], [('I moved to Lyon last May.', True)])
    """

    mounted: list[Hit]
    below_threshold: list[Hit]
    threshold: float
    contradicted: list[Hit] = field(default_factory=list)


def json_ready(value: Any) -> Any:
    """A value object (or a dict / list of them) as JSON-ready data: dataclasses as dicts, datetimes as ISO 8601.

    Example:
        >>> json_ready({"at": datetime(2023, 5, 8, tzinfo=timezone.utc), "tags": ("a",)})
        {'at': '2023-05-08T00:00:00+00:00', 'tags': ['a']}
    """
    if is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value
