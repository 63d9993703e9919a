"""Keep secrets out of the memory bank: detect, then redact or reject.

Detection combines the maintained ``detect-secrets`` plugins (provider tokens whose formats
that project tracks) with a few precise regexes for what it lacks or gets wrong for chat
text: modern OpenAI/Anthropic keys, Google/Hugging Face keys, fine-grained GitHub PATs,
whole private-key blocks, bearer headers, ``password=...`` pairs, connection strings with
passwords, and Luhn-checked card numbers.

Only the plugins' pure ``analyze_string`` is called. ``scan_line``/``transient_settings``
are avoided on purpose: they mutate process-global settings (not thread-safe, ~1 ms each)
and, with verification enabled, plugins send the candidate secret to the provider's API.
The high-entropy and keyword plugins are not used: they flag ordinary prose, miss
``password: x`` outside code files, and cost ~0.25 ms per message on their own.

>>> s = SecretScanner()
>>> s.apply("my key is ghp_" + "a1B2" * 9)
'my key is [REDACTED:github_token]'
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Iterable, Literal

from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.base import BasePlugin
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

from agentmem.errors import InvalidInputError, SecretDetectedError

from ._patterns import (
    PLACEHOLDER_RE,
    REGEX_DETECTORS,
    SENSITIVE_KEY_RE,
    find_cards,
    password_value_ok,
    placeholder,
    private_key_fallback_span,
)

_log = logging.getLogger(__name__)

Policy = Literal["redact", "reject"]

# detect-secrets type name -> our stable snake_case type. Order in the tuple = priority
# when spans overlap (more specific first); our own detectors carry their own priority.
_DS_PLUGINS: tuple[tuple[type[BasePlugin], str, int], ...] = (
    (PrivateKeyDetector, "private_key", 0),
    (AWSKeyDetector, "aws", 10),  # split into key id / secret key below
    (GitHubTokenDetector, "github_token", 10),
    (SlackDetector, "slack_token", 10),
    (StripeDetector, "stripe_key", 10),
    (OpenAIDetector, "openai_api_key", 10),
    (GitLabTokenDetector, "gitlab_token", 10),
    (PypiTokenDetector, "pypi_token", 10),
    (NpmDetector, "npm_token", 10),
    (SendGridDetector, "sendgrid_api_key", 10),
    (TwilioKeyDetector, "twilio_api_key", 10),
    (DiscordBotTokenDetector, "discord_bot_token", 10),
    (MailchimpDetector, "mailchimp_api_key", 10),
    (SquareOAuthDetector, "square_oauth_secret", 10),
    (AzureStorageKeyDetector, "azure_storage_key", 10),
    (TelegramBotTokenDetector, "telegram_bot_token", 10),
    (JwtTokenDetector, "jwt", 20),
)

# Plugins report the secret *value*, not where it is; we locate it and grow the span over
# adjacent token characters because several denylists match only a fixed-length prefix
# (Stripe's 24 chars, JWT's lazy signature), which would leave the tail in the bank.
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_JWT_CHARS = _TOKEN_CHARS | frozenset(".=")
_AWS_KEY_ID_RE = re.compile(r"(?:A3T[A-Z0-9]|ABIA|ACCA|AKIA|ASIA)[0-9A-Z]{16}")
# Values shorter than this are not searched for elsewhere in the text: a short value could
# be a common word and redacting all its occurrences would shred prose.
_MIN_LOCATABLE = 12


@dataclass(frozen=True, slots=True)
class Finding:
    """Where a secret of a given type sits in the scanned text; never the secret itself.

    >>> Finding("jwt", 4, 40)
    Finding(type='jwt', start=4, end=40)
    """

    type: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class ValueFinding:
    """A finding inside a structured value; ``path`` is the key/index path to the string.

    ``start``/``end`` index into the string at ``path`` (a dict key when ``in_key``).
    """

    path: tuple[str | int, ...]
    type: str
    start: int
    end: int
    in_key: bool = False


class SecretScanner:
    """Detect secrets in text and either redact them or refuse the text.

    Stateless after construction, so one instance can be shared across threads.

    >>> SecretScanner().apply("db at postgres://app:s3cr3t-pw@db.internal:5432/prod")
    'db at postgres://app:[REDACTED:connection_string_password]@db.internal:5432/prod'
    >>> SecretScanner("reject").apply("all clear")
    'all clear'
    """

    def __init__(self, policy: Policy = "redact", *, disabled_types: Iterable[str] = ()) -> None:
        if policy not in ("redact", "reject"):
            raise InvalidInputError(f"secret policy must be 'redact' or 'reject', got {policy!r}")
        self.policy: Policy = policy
        self.disabled_types = frozenset(disabled_types)
        unknown = self.disabled_types - SECRET_TYPES
        if unknown:
            raise InvalidInputError(f"unknown secret types: {sorted(unknown)}")
        self._plugins = [(cls(), name, prio) for cls, name, prio in _DS_PLUGINS]

    def __repr__(self) -> str:
        return f"SecretScanner(policy={self.policy!r})"

    # -- text ---------------------------------------------------------------------------

    def scan(self, text: str) -> list[Finding]:
        """Return non-overlapping findings sorted by position.

        >>> SecretScanner().scan("call me at +1 555 123 4567")
        []
        """
        if not isinstance(text, str):
            raise InvalidInputError(f"scan expects str, got {type(text).__name__}")
        if not text:
            return []
        spans: list[tuple[int, int, int, str]] = []  # (start, end, priority, type)
        for det in REGEX_DETECTORS:
            for m in det.pattern.finditer(text):
                start, end = m.span(det.group)
                if start >= end or (det.check is not None and not det.check(m.group(det.group))):
                    continue
                if end - start >= 2 and text[start] == text[end - 1] and text[start] in "\"'":
                    start, end = start + 1, end - 1  # keep quotes: JSON/code stays well-formed
                    if start >= end:
                        continue
                spans.append((start, end, det.priority, det.type))
        spans.extend((a, b, 50, "card_number") for a, b in find_cards(text))
        self._scan_plugins(text, spans)
        return self._resolve(text, spans)

    def apply(self, text: str) -> str:
        """Return ``text`` with secrets redacted, or raise under the ``reject`` policy.

        Raises :class:`SecretDetectedError` naming only the secret *types* found.
        Idempotent: redaction placeholders are never flagged again.
        """
        findings = self.scan(text)
        if not findings:
            return text
        # Types and counts only: a log line must never carry the value it is about.
        _log.debug("secret scan: %d finding(s) of %s (policy=%s)", len(findings),
                   sorted({f.type for f in findings}), self.policy)
        if self.policy == "reject":
            raise _rejection(f.type for f in findings)
        return redact_spans(text, findings)

    def contains_secret(self, text: str) -> bool:
        """True when :meth:`scan` finds anything."""
        return bool(self.scan(text))

    # -- structured values (metadata) -----------------------------------------------------

    def scan_value(self, obj: Any) -> list[ValueFinding]:
        """Walk dict/list/tuple/str (keys too) and report findings with their path.

        A string under a sensitive key (``password``, ``api_key``, ``token``...) counts as
        a secret in full, since the key, not the value's shape, says what it is.

        >>> SecretScanner().scan_value({"user": "ann", "db": {"password": "hunter2"}})
        [ValueFinding(path=('db', 'password'), type='password', start=0, end=7, in_key=False)]
        """
        out: list[ValueFinding] = []
        self._walk(obj, (), None, out, 0)
        return out

    def apply_value(self, obj: Any) -> Any:
        """Return a redacted copy of a structured value (or raise under ``reject``).

        Containers are rebuilt (dict, list, tuple); other scalars are returned as is.
        """
        findings = self.scan_value(obj)
        if not findings:
            return obj
        if self.policy == "reject":
            raise _rejection(f.type for f in findings)
        return _rebuild(obj, self, None)

    # -- internals ----------------------------------------------------------------------

    def _scan_plugins(self, text: str, spans: list[tuple[int, int, int, str]]) -> None:
        for plugin, name, prio in self._plugins:
            if name == "npm_token":
                # Its pattern (//.+/:_authToken=) is quadratic on long lines full of "//"
                # (a 100 KB line of URLs took 10 s), so only lines that can match see it.
                if "_authToken" not in text:
                    continue
                lines = [ln for ln in text.splitlines() if "_authToken" in ln]
                values = {v for ln in lines for v in plugin.analyze_string(ln)}
            else:
                values = set(plugin.analyze_string(text))
            for value in values:
                if name == "private_key":
                    # The plugin reports only the BEGIN marker; the block regex covers the
                    # usual PEM case, this covers PuTTY/SSH2 formats it does not know.
                    blocks = [(a, b) for a, b, _, t in spans if t == "private_key"]
                    for pos in _occurrences(text, value):
                        if not any(a <= pos < b for a, b in blocks):
                            spans.append((*private_key_fallback_span(text, pos), prio, name))
                    continue
                if len(value) < _MIN_LOCATABLE:
                    continue
                kind = name
                if name == "aws":
                    kind = "aws_access_key_id" if _AWS_KEY_ID_RE.fullmatch(value) else "aws_secret_access_key"
                elif name == "slack_token" and value.lower().startswith("https://"):
                    kind = "slack_webhook"
                chars = _JWT_CHARS if name == "jwt" else _TOKEN_CHARS
                for pos in _occurrences(text, value):
                    start, end = _grow(text, pos, pos + len(value), chars)
                    spans.append((start, end, prio, kind))

    def _resolve(self, text: str, spans: list[tuple[int, int, int, str]]) -> list[Finding]:
        if not spans:
            return []
        holders = [m.span() for m in PLACEHOLDER_RE.finditer(text)] if "[REDACTED:" in text else []
        kept = [
            s for s in spans
            if s[3] not in self.disabled_types
            and not any(h0 <= s[0] and s[1] <= h1 for h0, h1 in holders)
        ]
        kept.sort()
        merged: list[list[Any]] = []  # [start, end, priority, type]
        for start, end, prio, kind in kept:
            if merged and start < merged[-1][1]:
                cur = merged[-1]
                cur[1] = max(cur[1], end)
                if prio < cur[2]:  # the most specific detector names the merged span
                    cur[2], cur[3] = prio, kind
            else:
                merged.append([start, end, prio, kind])
        return [Finding(kind, start, end) for start, end, _, kind in merged]

    def _walk(self, obj: Any, path: tuple, key: Any, out: list[ValueFinding], depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise InvalidInputError(f"value nested deeper than {_MAX_DEPTH} levels")
        if isinstance(obj, str):
            whole = _sensitive_key_type(key, obj)
            if whole is not None and whole not in self.disabled_types:
                out.append(ValueFinding(path, whole, 0, len(obj)))
                return
            out.extend(ValueFinding(path, f.type, f.start, f.end) for f in self.scan(obj))
        elif isinstance(obj, int) and not isinstance(obj, bool):
            # {"card": 4111111111111111} or {"pin_password": 1234}: numbers can be secrets too.
            digits = str(obj)
            whole = _sensitive_key_type(key, digits)
            kinds = {f.type for f in self.scan(digits)} | ({whole} if whole == "password" else set())
            out.extend(ValueFinding(path, k, 0, len(digits)) for k in sorted(kinds - self.disabled_types))
        elif isinstance(obj, dict):
            for k, v in obj.items():
                if isinstance(k, str):
                    out.extend(ValueFinding(path + (k,), f.type, f.start, f.end, True) for f in self.scan(k))
                self._walk(v, path + (k,), k, out, depth + 1)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                self._walk(v, path + (i,), None, out, depth + 1)


_MAX_DEPTH = 64


def _sensitive_key_type(key: Any, value: str) -> str | None:
    """Type for a whole value under a sensitive key, or None."""
    if not isinstance(key, str) or not value or PLACEHOLDER_RE.fullmatch(value):
        return None
    m = SENSITIVE_KEY_RE.fullmatch(key)
    if m is None:
        return None
    if m.group("pw"):
        return "password" if password_value_ok(value) else None
    # api_key/token/secret: only values shaped like a credential (no spaces, not tiny),
    # so {"token": "none yet"} or {"secret": "surprise party"} survive.
    return "generic_secret" if len(value) >= 8 and not any(c.isspace() for c in value) else None


def _rebuild(obj: Any, scanner: SecretScanner, key: Any) -> Any:
    if isinstance(obj, str):
        whole = _sensitive_key_type(key, obj)
        if whole is not None and whole not in scanner.disabled_types:
            return placeholder(whole)
        return scanner.apply(obj)
    if isinstance(obj, int) and not isinstance(obj, bool):
        found: list[ValueFinding] = []
        scanner._walk(obj, (), key, found, 0)
        return placeholder(found[0].type) if found else obj
    if isinstance(obj, dict):
        new: dict = {}
        for k, v in obj.items():
            nk = scanner.apply(k) if isinstance(k, str) else k
            if nk in new:
                raise InvalidInputError("two keys collide after secret redaction")
            new[nk] = _rebuild(v, scanner, k)
        return new
    if isinstance(obj, list):
        return [_rebuild(v, scanner, None) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_rebuild(v, scanner, None) for v in obj)
    return obj


def _occurrences(text: str, value: str) -> Iterable[int]:
    pos = text.find(value)
    while pos != -1:
        yield pos
        pos = text.find(value, pos + 1)


def _grow(text: str, start: int, end: int, chars: frozenset[str]) -> tuple[int, int]:
    while start > 0 and text[start - 1] in _TOKEN_CHARS:
        start -= 1
    n = len(text)
    while end < n and text[end] in chars:
        end += 1
    return start, end


def _rejection(types: Iterable[str]) -> SecretDetectedError:
    names = sorted(set(types))
    err = SecretDetectedError(
        f"refused to store text containing secret(s) of type: {', '.join(names)} "
        "(secret policy is 'reject'; nothing was stored)"
    )
    err.types = tuple(names)  # type: ignore[attr-defined]  # lets callers branch without parsing
    return err


def redact_spans(text: str, findings: Iterable[Finding]) -> str:
    """Replace each (non-overlapping, sorted) finding's span with its placeholder."""
    parts: list[str] = []
    last = 0
    for f in findings:
        parts.append(text[last:f.start])
        parts.append(placeholder(f.type))
        last = f.end
    parts.append(text[last:])
    return "".join(parts)


_default: SecretScanner | None = None


def default_scanner() -> SecretScanner:
    """A shared redact-policy scanner (plugins are built once)."""
    global _default
    if _default is None:
        _default = SecretScanner("redact")
    return _default


def scan_text(text: str) -> list[Finding]:
    """Module-level shortcut for ``default_scanner().scan(text)``."""
    return default_scanner().scan(text)


def scan_value(obj: Any) -> list[ValueFinding]:
    """Module-level shortcut for ``default_scanner().scan_value(obj)`` (metadata)."""
    return default_scanner().scan_value(obj)


def redact(text: str) -> str:
    """Module-level shortcut for ``default_scanner().apply(text)``."""
    return default_scanner().apply(text)


SECRET_TYPES: frozenset[str] = frozenset(
    {name for _, name, _ in _DS_PLUGINS if name != "aws"}
    | {"aws_access_key_id", "aws_secret_access_key", "slack_webhook"}
    | {d.type for d in REGEX_DETECTORS}
    | {"password", "generic_secret", "card_number"}
)

__all__ = [
    "SECRET_TYPES",
    "Finding",
    "Policy",
    "SecretScanner",
    "ValueFinding",
    "default_scanner",
    "redact",
    "redact_spans",
    "scan_text",
    "scan_value",
]
