"""Export and import memories as JSON Lines: one record per line with its version history.

Only the public :class:`~agentmem.AgentMemory` API is used, so a file moves between stores with different
backends, models or encryption keys. ``export_records`` writes a user's current entries (those a newer memory
superseded are left out; each entry's own earlier versions travel in its ``history``). ``import_records`` is
all-or-nothing: every line is validated before anything is written, the entries are written in one batch, their
versions are replayed (``add`` then each ``update`` with its reason), and if any step fails every entry it wrote is
erased again. What does not travel: ids, ``created_at`` and the times of history events (a new store makes its
own), KV blobs (re-encoded by the target store's model), and ``merge`` / ``supersede`` events (they name entries of
the old store).

Example:
    >>> mem.update(rec.id, text="I moved to Paris.").version        # mem: a store holding two memories of u1
    2
    >>> with open("u1.jsonl", "w") as out:
    ...     for line in export_records(mem, ["u1"]):
    ...         _ = out.write(line + "\\n")
    >>> with AgentMemory("./other", kv_encoding="off") as other, open("u1.jsonl") as lines:
    ...     done, texts = import_records(other, lines), [r.text for r in other.list(user_id="u1")]
    >>> done, texts
    ({'imported': 2, 'updates': 1, 'expired_skipped': 0, 'events_not_replayed': 0}, ['I moved to Paris.', ...])
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from agentmem.errors import InvalidInputError
from agentmem.memory import AgentMemory
from agentmem.types import json_ready

__all__ = ["export_records", "import_records"]

_PAGE = 500
_REPLAYED = ("add", "update", "restore")  # the events that write a version (a restore of version n writes one)
_WRITE_OUTCOME = ("event", "superseded_ids", "matched_id")  # what a remember() did: not part of the entry


class _Version(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int
    op: str
    text: str
    at: datetime | None = None
    reason: str | None = None
    related_id: str | None = None


class _Record(BaseModel):
    """One exported line; unknown fields are an error (a typo must not be silently dropped)."""

    model_config = ConfigDict(extra="forbid")
    id: str | None = None
    text: str
    memory_text: str | None = None  # derived again by the target store
    user_id: str
    session_id: str | None = None
    kind: str = "turn"
    role: str | None = None
    speaker: str | None = None
    occurred_at: str | None = None
    tags: list[str] = []
    metadata: dict[str, Any] = {}
    created_at: datetime | None = None
    expires_at: datetime | None = None
    version: int = 1
    status: str = "active"
    superseded_by: str | None = None
    seen_count: int = 1
    history: list[_Version] = []


def export_records(mem: AgentMemory, user_ids: Iterable[str]) -> Iterator[str]:
    """JSON lines of the users' current entries, oldest first, each with its ``history``.

    Example:
        >>> lines = list(export_records(mem, ["u1"]))
        >>> len(lines), json.loads(lines[0])["text"], json.loads(lines[0])["history"][0]["op"]
        (2, 'I moved to Lyon last May.', 'add')
    """
    for user in user_ids:
        offset = 0
        while page := mem.list(user_id=user, limit=_PAGE, offset=offset):
            offset += len(page)
            for rec in page:
                if rec.status != "active":
                    continue
                data = json_ready(rec)
                data.pop("kv", None)  # where the blob lives and which model made it belong to this store
                for key in _WRITE_OUTCOME:
                    data.pop(key, None)
                data["history"] = json_ready(mem.history(rec.id))
                yield json.dumps(data, ensure_ascii=False)


def _parse(lines: Iterable[str]) -> list[tuple[int, _Record]]:
    records: list[tuple[int, _Record]] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = _Record.model_validate_json(line)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'line'}: {e['msg']}" for e in exc.errors())
            raise InvalidInputError(f"line {n}: {problems}") from None
        if rec.status != "active":
            raise InvalidInputError(f"line {n}: only active entries import (status {rec.status!r})")
        if rec.id is not None and rec.id in seen:
            raise InvalidInputError(f"line {n}: entry id {rec.id!r} appears twice")
        seen.add(rec.id or f"#{n}")
        chain = _chain(rec)
        if chain[0].op != "add" or chain[-1].text != rec.text:
            raise InvalidInputError(f"line {n}: the history must start with 'add' and its last add/update text "
                                    "must be the entry's text")
        records.append((n, rec))
    return records


def _chain(rec: _Record) -> list[_Version]:
    """The versions an import replays: add, then each update or restore that wrote a new version (a ``restore`` of
    a superseded entry keeps its version: not replayed); the record alone when it has no history."""
    chain: list[_Version] = []
    for v in rec.history:
        if v.op in _REPLAYED and (not chain or v.version > chain[-1].version):
            chain.append(v)
    return chain or [_Version(version=1, op="add", text=rec.text)]


def _remember_item(rec: _Record, now: datetime) -> dict[str, Any] | None:
    """remember() arguments for the record's first version; None when it has expired."""
    ttl = None
    if rec.expires_at is not None:
        expires = rec.expires_at if rec.expires_at.tzinfo else rec.expires_at.replace(tzinfo=timezone.utc)
        ttl = (expires - now).total_seconds()
        if ttl <= 0:
            return None
    return dict(text=_chain(rec)[0].text, user_id=rec.user_id, session_id=rec.session_id, kind=rec.kind,
                role=rec.role, speaker=rec.speaker, timestamp=rec.occurred_at, tags=rec.tags,
                metadata=rec.metadata, ttl=ttl)


def import_records(mem: AgentMemory, lines: Iterable[str]) -> dict[str, int]:
    """Import exported JSON lines all-or-nothing; returns what was done.

    Raises :class:`~agentmem.InvalidInputError` naming the line for a malformed record (nothing is written);
    a failure while writing erases every entry this import wrote before it is re-raised.

    Example:
        >>> import_records(mem, ['{"text": "I live in Lyon.", "user_id": "alice"}'])
        {'imported': 1, 'updates': 0, 'expired_skipped': 0, 'events_not_replayed': 0}
        >>> import_records(mem, ['{"text": "I live in Rome.", "user_id": "bob"}', '{"txt": "typo", "user_id": "bob"}'])
        Traceback (most recent call last):
        agentmem.errors.InvalidInputError: line 2: ...
        >>> mem.list(user_id="bob")
        []
    """
    records = _parse(lines)
    now = datetime.now(timezone.utc)
    live = [(rec, item) for _, rec in records if (item := _remember_item(rec, now)) is not None]
    written = mem.remember_many([item for _, item in live], consolidate=False) if live else []
    updates = 0
    try:
        for (rec, _), new in zip(live, written):
            for step in _chain(rec)[1:]:
                mem.update(new.id, text=step.text, reason=step.reason, timestamp=rec.occurred_at)
                updates += 1
    except Exception:  # any failure, typed or not, must not leave half an import behind
        for new in written:  # all-or-nothing: what this import wrote goes again, with its history
            mem.forget(new.id)
        raise
    skipped = sum(len(rec.history) - len(_chain(rec)) for rec, _ in live if rec.history)
    return {"imported": len(written), "updates": updates, "expired_skipped": len(records) - len(live),
            "events_not_replayed": skipped}
