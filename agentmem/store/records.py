"""Input validation and the ``MemoryRecord`` ⇄ catalog-row mapping (no I/O)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from agentmem.errors import InvalidInputError
from agentmem.store.catalog import EntryRow
from agentmem.types import KINDS, Hit, KvInfo, MemoryRecord, utc_from_epoch


def check_text(text: Any, what: str = "text") -> str:
    if not isinstance(text, str):
        raise InvalidInputError(f"{what} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise InvalidInputError(f"{what} is empty; there is nothing to remember")
    return text


def check_id(value: Any, what: str, *, required: bool) -> str | None:
    if value is None:
        if required:
            raise InvalidInputError(f"{what} is required")
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{what} must be a non-empty string, got {value!r}")
    return value


def check_kind(kind: Any) -> str:
    if kind not in KINDS:
        raise InvalidInputError(f"unknown kind {kind!r}; use one of {', '.join(KINDS)}")
    return kind


def check_kinds(kinds: Iterable[str] | None) -> list[str] | None:
    if kinds is None:
        return None
    if isinstance(kinds, str):
        kinds = [kinds]
    return [check_kind(k) for k in kinds]


def check_tags(tags: Iterable[str] | None) -> list[str]:
    if tags is None:
        return []
    if isinstance(tags, str):
        raise InvalidInputError("tags must be a list of strings, not a single string")
    out = []
    for t in tags:
        if not isinstance(t, str) or not t.strip():
            raise InvalidInputError(f"every tag must be a non-empty string, got {t!r}")
        out.append(t)
    return out


def check_ttl(ttl: float | int | timedelta | None) -> float | None:
    if ttl is None:
        return None
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        raise InvalidInputError(f"ttl must be seconds or a timedelta, got {ttl!r}")
    if seconds <= 0:
        raise InvalidInputError(f"ttl must be positive, got {seconds} s")
    return float(seconds)


def check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise InvalidInputError(f"k must be a positive integer, got {k!r}")
    return k


def check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidInputError(f"metadata must be a dict, got {type(metadata).__name__}")
    try:
        # round-trip so what is stored is exactly what will be read back
        return json.loads(json.dumps(dict(metadata), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"metadata must be JSON-serialisable: {exc}") from exc


def format_timestamp(ts: datetime | str | None) -> str | None:
    if ts is None:
        return None
    if isinstance(ts, str):
        return ts.strip() or None
    if isinstance(ts, datetime):
        if ts.tzinfo is not None:
            ts = ts.astimezone(timezone.utc)
        return ts.strftime("%-d %B %Y, %H:%M")
    raise InvalidInputError(f"timestamp must be a datetime or a string, got {type(ts).__name__}")


def memory_line(text: str, *, kind: str, speaker: str | None, role: str | None, occurred_at: str | None) -> str:
    """The line that is embedded, indexed and encoded: who said it and when travel with the text."""
    who = speaker or (role.capitalize() if role else None)
    if kind == "tool":
        who = f"Tool {speaker}" if speaker else "Tool result"
    head = " ".join(p for p in (f"[{occurred_at}]" if occurred_at else None, f"{who}:" if who else None) if p)
    return f"{head} {text}" if head else text


def to_record(row: EntryRow, *, text: str | None = None, memory_text: str | None = None) -> MemoryRecord:
    return MemoryRecord(**_record_fields(row, text, memory_text))


def to_hit(row: EntryRow, score: float, scores: dict[str, float], *, text: str | None = None,
           memory_text: str | None = None) -> Hit:
    return Hit(**_record_fields(row, text, memory_text), score=score, scores=scores)


def _record_fields(row: EntryRow, text: str | None, memory_text: str | None) -> dict[str, Any]:
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
    )


def message_fields(message: Any) -> tuple[str, str, str | None]:
    """(role, content, name) of a chat message given as a dict or a LangChain message (duck-typed)."""
    if isinstance(message, Mapping):
        role, content, name = message.get("role"), message.get("content"), message.get("name")
    else:
        role = {"human": "user", "ai": "assistant"}.get(getattr(message, "type", None), getattr(message, "type", None))
        content, name = getattr(message, "content", None), getattr(message, "name", None)
    if isinstance(content, Sequence) and not isinstance(content, str):
        # content blocks (LangChain / OpenAI): keep the text parts
        content = "\n".join(b.get("text", "") if isinstance(b, Mapping) else str(b) for b in content)
    if role not in ("user", "assistant", "system", "tool"):
        raise InvalidInputError(f"message role must be user, assistant, system or tool, got {role!r}")
    return role, check_text(content, "message content"), name
