"""Every check on caller input, in one place, run before anything is written (no I/O).

Each public entry point of :class:`agentmem.AgentMemory` calls these first, so a bad argument raises
:class:`~agentmem.errors.InvalidInputError` naming the field, and never a raw ``TypeError`` from deep inside
SQLite, Chroma, a tokenizer or torch after part of a write has happened.

Example:
    >>> check_id("u1", "user_id", required=True)
    'u1'
    >>> check_id("a\\u200bb", "user_id", required=True)
    Traceback (most recent call last):
    ...
    agentmem.errors.InvalidInputError: user_id must be printable: U+200B (format character) at position 1 is invisible or reorders text
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from agentmem.errors import InvalidInputError, SecretDetectedError
from agentmem.types import KINDS

MAX_TEXT_CHARS = 1_000_000
"""Longest text one entry (or query, or trained document) may hold: ~1 MB of prose. Longer texts are rejected
up front; 8 MB took 25 s to scan, embed and index, and a memory that long is a document to split, not a memory."""
MAX_ID_CHARS = 256
"""Longest user / session / entry id, speaker or tag (the audit log's limit for identifiers)."""
MAX_TIMESTAMP_CHARS = 64
MAX_METADATA_DEPTH = 32
MAX_METADATA_BYTES = 1_000_000
MAX_TTL_SECONDS = 100 * 366 * 86_400
"""A ttl above ~100 years is refused: expiry times must stay representable as datetimes (year <= 9999)."""
MAX_LIST_LIMIT = 2**62  # SQLite integers are 64-bit signed
MAX_NEW_TOKENS = 1_000_000
MAX_LOGIT_BIAS = 1024  # token ids one request may bias: a bound on the per-step work, ample for banning words
ROLES = ("user", "assistant", "system", "tool")
"""Roles an entry may carry; the role is stored as given, so only these fixed words are accepted."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_UNPRINTABLE = {"Cc": "control character", "Cf": "format character", "Cs": "lone surrogate",
                "Co": "private-use character", "Cn": "unassigned code point", "Zl": "line separator",
                "Zp": "paragraph separator", "Zs": "space other than ' '"}
"""Unicode categories an identifier may not hold: each is invisible, reorders text (bidi controls are Cf) or
renders as something else, so two ids that look alike could name different users (or the audit log could not
record the id, after the erase it is recording has happened)."""
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _check_unicode(value: str, what: str) -> None:
    """Lone surrogates cannot be encoded to UTF-8: SQLite, Chroma and the tokenizer would each fail differently."""
    if _SURROGATE.search(value):
        raise InvalidInputError(f"{what} contains a lone surrogate (\\ud800-\\udfff); pass valid Unicode text")


def check_text(text: Any, what: str = "text", *, max_chars: int = MAX_TEXT_CHARS) -> str:
    """A non-empty, encodable string of at most ``max_chars`` characters.

    Example:
        >>> check_text("I moved to Lyon.")
        'I moved to Lyon.'
    """
    if not isinstance(text, str):
        raise InvalidInputError(f"{what} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise InvalidInputError(f"{what} is empty (nothing but whitespace)" if text else f"{what} is empty")
    if len(text) > max_chars:
        raise InvalidInputError(f"{what} has {len(text):,} characters; the limit is {max_chars:,} (split it)")
    _check_unicode(text, what)
    return text


def check_id(value: Any, what: str, *, required: bool) -> str | None:
    """An identifier (user / session / entry id, tag, speaker): the one id rule of every entry point.

    A non-blank string of at most :data:`MAX_ID_CHARS` characters, every one printable: no control, format
    (zero-width, bidi overrides such as U+202E), private-use, unassigned, separator or non-ASCII space character
    (``str.isprintable`` plus surrogates). The REST API, MCP, ``agentmem keys add`` and the audit log apply this
    same rule, so an id accepted by one is never refused by another after something was written.

    Example:
        >>> check_id(None, "session_id", required=False) is None
        True
        >>> check_id("Ann Lee", "speaker", required=True)
        'Ann Lee'
    """
    if value is None:
        if required:
            raise InvalidInputError(f"{what} is required")
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{what} must be a non-empty string, got {_short(value)}")
    if len(value) > MAX_ID_CHARS:
        raise InvalidInputError(f"{what} is {len(value)} characters long; the limit is {MAX_ID_CHARS}")
    _check_unicode(value, what)
    if _CONTROL.search(value):
        raise InvalidInputError(f"{what} must not contain control characters (tab, newline, NUL, ...)")
    if not value.isprintable():
        at, char = next((n, c) for n, c in enumerate(value) if not c.isprintable())
        category = unicodedata.category(char)
        raise InvalidInputError(f"{what} must be printable: U+{ord(char):04X} ({_UNPRINTABLE.get(category, category)})"
                                f" at position {at} is invisible or reorders text")
    return value


def check_session_id(value: Any, *, required: bool, scanner: Any = None) -> str | None:
    """A session id: the id rule, then ``scanner``'s secret scan (a :class:`~agentmem.security.SecretScanner`).

    An id is a key: a redacted one would file entries under a session the caller never named (and their later
    ``forget`` of it would miss them), so a secret in a session id is refused under either policy, not redacted.

    Example:
        >>> check_session_id("chat-2024-05-01", required=True)
        'chat-2024-05-01'
    """
    check_id(value, "session_id", required=required)
    found = sorted({f.type for f in scanner.scan(value)}) if value is not None and scanner is not None else []
    if found:
        raise SecretDetectedError(f"session_id must not hold a secret (found: {', '.join(found)}); an id cannot be "
                                  "redacted, so use another one")
    return value


def check_entry_id(value: Any, what: str = "entry_id") -> str:
    """One entry id (a string, not a list of them).

    Example:
        >>> check_entry_id("6c35237b-5975-4064-8467-f8d115fe42ee")
        '6c35237b-5975-4064-8467-f8d115fe42ee'
    """
    return check_id(value, what, required=True) or ""


def check_entry_ids(values: Any, what: str = "entry_ids") -> list[str]:
    """A list of entry ids.

    Example:
        >>> check_entry_ids(["a", "b"])
        ['a', 'b']
    """
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise InvalidInputError(f"{what} must be a list of entry ids, got {type(values).__name__}")
    return [check_entry_id(v, f"{what}[{n}]") for n, v in enumerate(values)]


def check_content_parts(content: Any, what: str = "content") -> Any:
    """Chat message content as given, once its content parts are sound: every part's ``text`` is a string.

    OpenAI and LangChain content may be a list of parts (``{"type": "text", "text": "..."}``, images, ...); the
    text parts are joined later, and a ``text`` that is a number or a list would fail there as a ``TypeError``.

    Example:
        >>> check_content_parts([{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}])[0]["text"]
        'hi'
        >>> check_content_parts([{"type": "text", "text": 5}], "messages[0].content")
        Traceback (most recent call last):
        ...
        agentmem.errors.InvalidInputError: messages[0].content[0].text must be a string, got 5
    """
    if isinstance(content, Sequence) and not isinstance(content, (str, bytes)):
        for n, part in enumerate(content):
            if isinstance(part, Mapping) and "text" in part and not isinstance(part["text"], str):
                raise InvalidInputError(f"{what}[{n}].text must be a string, got {_short(part['text'])}")
    return content


def check_messages(messages: Any) -> Sequence[Any]:
    """A list of chat messages (dicts or LangChain messages) whose content parts are sound.

    Example:
        >>> len(check_messages([{"role": "user", "content": "I like tea."}]))
        1
    """
    if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence):
        raise InvalidInputError("messages must be a list of chat messages")
    for n, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else getattr(message, "content", None)
        check_content_parts(content, f"messages[{n}].content")
    return messages


def check_speaker(value: Any) -> str | None:
    """Who said it: None or a short single-line name.

    Example:
        >>> check_speaker("Caroline")
        'Caroline'
    """
    return check_id(value, "speaker", required=False)


def check_role(role: Any) -> str | None:
    """None or one of :data:`ROLES`.

    Example:
        >>> check_role("user")
        'user'
    """
    if role is not None and role not in ROLES:
        raise InvalidInputError(f"role must be one of {', '.join(ROLES)} (or None), got {_short(role)}")
    return role


def check_kind(kind: Any) -> str:
    """One of :data:`agentmem.types.KINDS`.

    Example:
        >>> check_kind("knowledge")
        'knowledge'
    """
    if not isinstance(kind, str) or kind not in KINDS:
        raise InvalidInputError(f"unknown kind {_short(kind)}; use one of {', '.join(KINDS)}")
    return kind


def check_kinds(kinds: Any) -> list[str] | None:
    """None, one kind, or a list of kinds.

    Example:
        >>> check_kinds("tool")
        ['tool']
    """
    if kinds is None:
        return None
    if isinstance(kinds, str):
        kinds = [kinds]
    if isinstance(kinds, Mapping) or not isinstance(kinds, Iterable):
        raise InvalidInputError(f"kinds must be a kind or a list of kinds, got {type(kinds).__name__}")
    return [check_kind(k) for k in kinds]


def check_tags(tags: Any) -> list[str]:
    """A list of tags (short single-line strings); None is no tags.

    Example:
        >>> check_tags(["profile"])
        ['profile']
    """
    if tags is None:
        return []
    if isinstance(tags, str):
        raise InvalidInputError("tags must be a list of strings, not a single string")
    if isinstance(tags, Mapping) or not isinstance(tags, Iterable):
        raise InvalidInputError(f"tags must be a list of strings, got {type(tags).__name__}")
    out = []
    for t in tags:
        if not isinstance(t, str) or not t.strip():
            raise InvalidInputError(f"every tag must be a non-empty string, got {_short(t)}")
        out.append(check_id(t, "tag", required=True) or "")
    return out


def check_ttl(ttl: Any) -> float | None:
    """Seconds to live (a positive number or a timedelta of at most ~100 years); None is forever.

    Example:
        >>> check_ttl(timedelta(hours=1))
        3600.0
    """
    if ttl is None:
        return None
    try:
        seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
    except OverflowError as exc:  # pragma: no cover - total_seconds() returns a float for every timedelta
        raise InvalidInputError(f"ttl is out of range: {exc}") from exc
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        raise InvalidInputError(f"ttl must be seconds or a timedelta, got {_short(ttl)}")
    if seconds <= 0:
        raise InvalidInputError(f"ttl must be positive, got {seconds} s")
    if seconds > MAX_TTL_SECONDS:
        raise InvalidInputError(f"ttl must be at most {MAX_TTL_SECONDS:,} s (~100 years); omit it to keep forever")
    return float(seconds)


def check_k(k: Any, what: str = "k") -> int:
    """A positive integer.

    Example:
        >>> check_k(5)
        5
    """
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise InvalidInputError(f"{what} must be a positive integer, got {_short(k)}")
    if k > MAX_LIST_LIMIT:
        raise InvalidInputError(f"{what} must be at most {MAX_LIST_LIMIT}, got {k}")
    return k


def check_stop(stop: Any) -> list[str]:
    """Stop strings: None, or a list of up to 4 non-empty strings (the OpenAI limit).

    Example:
        >>> check_stop(["\\n\\n"])
        ['\\n\\n']
    """
    if stop is None:
        return []
    if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise InvalidInputError(f"stop must be a list of up to 4 non-empty strings, got {_short(stop)}")
    return list(stop)


def check_logit_bias(bias: Any) -> dict[int, float]:
    """OpenAI's ``logit_bias``: None, or a mapping of token ids (ints, or their decimal strings as JSON sends
    them) to numbers in [-100, 100]. Whether each id is in the model's vocabulary is checked where the model is
    known (:func:`agentmem.kv.constrain.bias_processor`).

    Example:
        >>> check_logit_bias({"2": -100, 7: 5.5})
        {2: -100.0, 7: 5.5}
    """
    if bias is None:
        return {}
    if not isinstance(bias, Mapping) or len(bias) > MAX_LOGIT_BIAS:
        raise InvalidInputError(f"logit_bias must map up to {MAX_LOGIT_BIAS} token ids to numbers, got {_short(bias)}")
    out: dict[int, float] = {}
    for token, value in bias.items():
        # a key JSON sent is ASCII digits, at most 18 of them (every vocabulary is far smaller): int() would refuse
        # "²" and a 5,000-digit string with a ValueError, not a typed error
        if isinstance(token, bool) or not (isinstance(token, int) or (
                isinstance(token, str) and token.isascii() and token.isdigit() and len(token) <= 18)):
            raise InvalidInputError(f"logit_bias keys must be token ids (non-negative integers), got {_short(token)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise InvalidInputError(f"logit_bias values must be numbers in [-100, 100], got {_short(value)} "
                                    f"for token {token}")
        out[int(token)] = float(value)
    return out


def check_score(value: Any, what: str = "min_score") -> float | None:
    """A score threshold: None, or a number in [0, 1] (recall scores are calibrated probabilities).

    Example:
        >>> check_score(0.25)
        0.25
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise InvalidInputError(f"{what} must be a number in [0, 1] (a calibrated relevance), got {_short(value)}")
    return float(value)


def check_limit_offset(limit: Any, offset: Any) -> tuple[int | None, int]:
    """``list()`` paging: limit None or a positive int, offset a non-negative int, both SQLite-sized.

    Example:
        >>> check_limit_offset(10, 0)
        (10, 0)
    """
    if limit is not None:
        check_k(limit, "limit")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 or offset > MAX_LIST_LIMIT:
        raise InvalidInputError(f"offset must be an integer between 0 and {MAX_LIST_LIMIT}, got {_short(offset)}")
    return limit, offset


def check_metadata(metadata: Any) -> dict[str, Any]:
    """A JSON-serialisable dict (string keys, finite numbers, at most 32 levels deep and ~1 MB).

    Example:
        >>> check_metadata({"source": "chat"})
        {'source': 'chat'}
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidInputError(f"metadata must be a dict, got {type(metadata).__name__}")
    _check_json_value(metadata, "metadata", 0)
    try:
        # round-trip so what is stored is exactly what will be read back
        dumped = json.dumps(dict(metadata), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"metadata must be JSON-serialisable: {exc}") from exc
    if len(dumped) > MAX_METADATA_BYTES:
        raise InvalidInputError(f"metadata is {len(dumped):,} bytes as JSON; the limit is {MAX_METADATA_BYTES:,}")
    return json.loads(dumped)


def _check_json_value(value: Any, where: str, depth: int) -> None:
    # iterative depth check first: json.dumps recurses in C and a 5,000-deep dict ends in RecursionError
    stack = [(value, where, depth)]
    while stack:
        item, path, level = stack.pop()
        if level > MAX_METADATA_DEPTH:
            raise InvalidInputError(f"metadata is nested more than {MAX_METADATA_DEPTH} levels deep (at {path[:80]})")
        if isinstance(item, str):
            _check_unicode(item, path[:80])
        elif isinstance(item, Mapping):
            for key, sub in item.items():
                if not isinstance(key, str):
                    raise InvalidInputError(f"metadata keys must be strings, got {_short(key)} in {path[:80]}")
                _check_unicode(key, f"{path[:80]} key")
                stack.append((sub, f"{path}.{key}", level + 1))
        elif isinstance(item, (list, tuple)):
            stack.extend((sub, f"{path}[{n}]", level + 1) for n, sub in enumerate(item))


def check_timestamp(ts: Any) -> datetime | str | None:
    """When it happened: a datetime, or a short single-line string such as ``"8 May 2023, 13:56"``.

    Example:
        >>> check_timestamp("8 May 2023, 13:56")
        '8 May 2023, 13:56'
    """
    if ts is None or isinstance(ts, datetime):
        return ts
    if not isinstance(ts, str):
        raise InvalidInputError(f"timestamp must be a datetime or a string, got {type(ts).__name__}")
    if len(ts) > MAX_TIMESTAMP_CHARS:
        raise InvalidInputError(f"timestamp is {len(ts)} characters long; the limit is {MAX_TIMESTAMP_CHARS}")
    _check_unicode(ts, "timestamp")
    if _CONTROL.search(ts):
        raise InvalidInputError("timestamp must not contain control characters (tab, newline, NUL, ...)")
    return ts


def format_timestamp(ts: datetime | str | None) -> str | None:
    """The ``occurred_at`` text of a (validated) timestamp.

    Example:
        >>> format_timestamp(datetime(2023, 5, 8, 13, 56))
        '8 May 2023, 13:56'
    """
    if ts is None:
        return None
    if isinstance(ts, str):
        return ts.strip() or None
    if isinstance(ts, datetime):
        if ts.tzinfo is not None:
            ts = ts.astimezone(timezone.utc)
        return ts.strftime("%-d %B %Y, %H:%M")
    raise InvalidInputError(f"timestamp must be a datetime or a string, got {type(ts).__name__}")


def check_generation(*, max_new_tokens: Any, budget_tokens: Any = None, temperature: Any = None, top_p: Any = None,
                     seed: Any = None, do_sample: Any = None, k: Any = None, repetition_penalty: Any = None) -> None:
    """Arguments of ``generate`` / ``Session.send`` that reach torch (checked before any retrieval or mount); None
    sampling settings stand for the model's own.

    Example:
        >>> check_generation(max_new_tokens=64, temperature=0.7, top_p=0.9, seed=1, do_sample=True)
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 0 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise InvalidInputError(f"max_new_tokens must be an integer between 0 and {MAX_NEW_TOKENS:,}, "
                                f"got {_short(max_new_tokens)}")
    if budget_tokens is not None and (isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int)
                                      or budget_tokens < 0):
        raise InvalidInputError(f"budget_tokens must be a non-negative integer or None, got {_short(budget_tokens)}")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise InvalidInputError(f"do_sample must be True or False, got {_short(do_sample)}")
    for name, value in (("temperature", temperature), ("repetition_penalty", repetition_penalty)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value > 0)):
            raise InvalidInputError(f"{name} must be a finite number > 0, got {_short(value)}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not (0 < top_p <= 1)):
        raise InvalidInputError(f"top_p must be a number in (0, 1], got {_short(top_p)}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise InvalidInputError(f"seed must be a non-negative integer or None, got {_short(seed)}")
    if k is not None:
        check_k(k)


def check_answer_room(*, context: int, prompt_tokens: int, max_new_tokens: int, memories: bool = True) -> None:
    """Refuse a question longer than the model's context, and (when there are ``memories`` to mount) a
    ``max_new_tokens`` that leaves no position for any memory.

    Without this, a too-long question was answered with nothing (``max_new_tokens`` cut to 0, only ``out.notes``
    said so), and every recalled memory was dropped silently.

    Example:
        >>> check_answer_room(context=8192, prompt_tokens=40, max_new_tokens=64)
        >>> check_answer_room(context=8192, prompt_tokens=9000, max_new_tokens=64)
        Traceback (most recent call last):
        ...
        agentmem.errors.InvalidInputError: the question is too long: with the prompt around it, it takes 9000 of the model's 8192 positions
    """
    room = context - prompt_tokens - max_new_tokens
    if prompt_tokens >= context:  # no max_new_tokens can help: say what is too long
        raise InvalidInputError(f"the question is too long: with the prompt around it, it takes {prompt_tokens} of "
                                f"the model's {context} positions")
    if room <= 0 and memories:
        raise InvalidInputError(
            f"max_new_tokens={max_new_tokens} leaves no room for memories: the model's context holds {context} "
            f"positions and the prompt takes {prompt_tokens}; ask for at most {max(0, context - prompt_tokens - 1)} "
            "new tokens"
        )


REMEMBER_FIELDS = ("user_id", "session_id", "kind", "role", "speaker", "timestamp", "tags", "ttl", "metadata", "index")


def check_remember_item(item: Any, n: int) -> tuple[Any, dict[str, Any]]:
    """One item of ``remember_many``: (text, the other remember() keyword arguments).

    Example:
        >>> check_remember_item({"text": "hi", "user_id": "u1"}, 0)
        ('hi', {'user_id': 'u1'})
    """
    if not isinstance(item, Mapping) or "text" not in item or "user_id" not in item:
        raise InvalidInputError(f"item {n} must be a dict with at least 'text' and 'user_id'")
    fields = dict(item)
    text = fields.pop("text")
    unknown = set(fields) - set(REMEMBER_FIELDS)
    if unknown:
        raise InvalidInputError(f"item {n} has unknown fields {sorted(map(str, unknown))}")
    return text, fields


def _short(value: Any) -> str:
    """A value for an error message: its repr, cut short (a hostile value may be megabytes long)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


__all__ = [
    "MAX_ID_CHARS", "MAX_TEXT_CHARS", "MAX_TTL_SECONDS", "REMEMBER_FIELDS", "ROLES",
    "check_answer_room", "check_content_parts", "check_messages", "check_entry_id", "check_entry_ids", "check_generation", "check_id", "check_k", "check_kind", "check_kinds",
    "check_limit_offset", "check_logit_bias", "check_metadata", "check_remember_item", "check_role", "check_score",
    "check_session_id", "check_speaker", "check_stop", "check_tags",
    "check_text", "check_timestamp", "check_ttl", "format_timestamp",
]
