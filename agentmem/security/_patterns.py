"""Regexes for the secrets ``detect-secrets`` lacks, tuned for chat text (no false alarms).

Each detector names the capture group that is the secret, so only the value is redacted
(``password=[REDACTED:password]`` keeps the key, which is useful and harmless context).
Every pattern is linear-time on adversarial input: no nested unbounded quantifiers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True, slots=True)
class RegexDetector:
    """One pattern: ``type`` names what it finds, ``group`` is the secret's capture group,
    ``check`` (optional) vetoes a match, lower ``priority`` wins when spans overlap."""

    type: str
    pattern: re.Pattern[str]
    group: int | str = 0
    priority: int = 10
    check: Callable[[str], bool] | None = None


def placeholder(kind: str) -> str:
    """The text that replaces a secret of ``kind``."""
    return f"[REDACTED:{kind}]"


PLACEHOLDER_RE = re.compile(r"\[REDACTED:[a-z0-9_]{1,40}\]")


def looks_random(value: str) -> bool:
    """A credential-shaped value: long, no spaces, mixes letters and digits.

    Used where only a keyword says "secret" (``token: ...``), so prose such as
    ``token: thanks`` or dates such as ``2024-05-12T10:00`` are left alone.
    """
    v = value.strip("\"'")
    if len(v) < 16 or any(c.isspace() for c in v):
        return False
    digits = sum(c.isdigit() for c in v)
    letters = sum(c.isalpha() for c in v)
    return digits >= 2 and letters >= 4 and len(set(v)) >= 8


def _has_digit_and_letter(value: str) -> bool:
    return any(c.isdigit() for c in value) and any(c.isalpha() for c in value)


# Values that follow "password:" in ordinary writing and are not passwords.
_NOT_A_PASSWORD = frozenset(
    """required optional none null nil empty changed reset expired incorrect invalid wrong
    forgotten hidden redacted unknown n/a na tbd todo same blank missing protected
    updated provided needed set unset true false yes no""".split()
)


def password_value_ok(value: str) -> bool:
    v = value.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
        v = v[1:-1]
    if not v or v.lower().rstrip(".!?") in _NOT_A_PASSWORD:
        return False
    if set(v) <= set("*•x.X?"):  # already masked: ******
        return False
    if re.match(r"(?:~?/|[A-Za-z]:\\)", v):  # a path (PWD=/home/me, password_file), not a secret
        return False
    # Templates and references, not values: ${DB_PW}, {{pw}}, <password>, %(pw)s, $PW
    return not re.fullmatch(r"\$\{[^}]*\}|\{\{.*\}\}|<[^>]*>|%\([^)]*\)s|%s|\$[A-Za-z_]\w*", v)


def luhn_ok(digits: str) -> bool:
    """Luhn checksum, the check digit every payment card number carries."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _card_ok(raw: str) -> bool:
    digits = re.sub(r"[ -]", "", raw)
    n = len(digits)
    if not 13 <= n <= 19 or not _issuer_ok(digits, n):
        return False
    return luhn_ok(digits)


def _issuer_ok(digits: str, n: int) -> bool:
    # Issuer prefix + length (IIN ranges): cuts the 1-in-10 random numbers passing Luhn
    # (order ids, tracking numbers) to the few that also look like a real card.
    two, four = int(digits[:2]), int(digits[:4])
    if digits[0] == "4":
        return n in (16, 19)  # Visa (13-digit Visa is retired; 13 digits is phone-like)
    if 51 <= two <= 55 or 2221 <= four <= 2720:
        return n == 16  # Mastercard
    if two in (34, 37):
        return n == 15  # Amex
    if digits.startswith(("6011", "65")) or 644 <= int(digits[:3]) <= 649 or two == 62:
        return 16 <= n <= 19  # Discover / UnionPay
    if 3528 <= four <= 3589:
        return 16 <= n <= 19  # JCB
    if 300 <= int(digits[:3]) <= 305 or two in (36, 38, 39):
        return 14 <= n <= 19  # Diners
    if two == 50 or 56 <= two <= 69:
        return 16 <= n <= 19  # Maestro (shorter ones are rare and collide with phones)
    return False


_TOK = r"A-Za-z0-9_\-"
_KEY_END = r"(?![A-Za-z0-9_\-])"
# An assignment as written in code, config, env files, JSON and chat: =, :, :=, =>
_ASSIGN = r"[\"']?[ \t]*(?::=|=>|=|:)[ \t]*"
_PW_KEY = (
    r"(?i)(?<![A-Za-z0-9_.\-])[\"']?[A-Za-z0-9_.\-]{0,40}?"
    r"(?:password|passwd|passphrase|passcode|pwd|pswd)"
)
# A bare dictionary-looking word: lower, Capitalised or UPPER letters only (+ end punctuation).
_PLAIN_WORD = re.compile(r"(?:[a-z]+|[A-Z][a-z]+|[A-Z]+)[.!?]?")
_VALUE = r"(?P<val>\"[^\"\n]{1,256}\"|'[^'\n]{1,256}'|[^\s\"',;]{1,256})"

REGEX_DETECTORS: tuple[RegexDetector, ...] = (
    RegexDetector(
        "private_key",
        # Whole PEM/OpenSSH/PGP block; an unterminated block is redacted to the end.
        re.compile(
            r"-----BEGIN[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----"
            r".*?(?:-----END[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
            re.DOTALL,
        ),
        priority=0,
    ),
    RegexDetector("anthropic_api_key", re.compile(rf"(?<![{_TOK}])sk-ant-[{_TOK}]{{20,}}"), priority=5),
    RegexDetector(
        "openai_api_key",
        re.compile(rf"(?<![{_TOK}])sk-(?!ant-)(?:proj-|svcacct-|admin-)?[{_TOK}]{{20,}}"),
        check=_has_digit_and_letter,
    ),
    RegexDetector("google_api_key", re.compile(rf"AIza[{_TOK}]{{35}}{_KEY_END}")),
    RegexDetector("huggingface_token", re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}")),
    RegexDetector("github_token", re.compile(r"github_pat_[A-Za-z0-9_]{22,}")),
    RegexDetector("github_token", re.compile(r"gh[pousr]_[A-Za-z0-9]{30,}")),
    RegexDetector("slack_token", re.compile(r"(?<![A-Za-z0-9])xox[a-z]-[A-Za-z0-9-]{10,}")),
    RegexDetector("slack_token", re.compile(r"(?<![A-Za-z0-9])xapp-\d-[A-Za-z0-9-]{10,}")),
    RegexDetector("stripe_key", re.compile(r"(?<![A-Za-z0-9])(?:[sr]k|whsec)_(?:live_|test_)?[0-9A-Za-z]{16,}")),
    RegexDetector(
        "aws_secret_access_key",
        # Unquoted form from ~/.aws/credentials and env files, which detect-secrets misses.
        re.compile(
            r"(?i)aws[A-Za-z0-9_.\-]{0,30}?(?:secret|key)[A-Za-z0-9_.\-]{0,20}"
            + _ASSIGN
            + r"[\"']?(?P<val>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"
        ),
        group="val",
    ),
    RegexDetector(
        "connection_string_password",
        # scheme://user:password@host - the password may hold '@' (greedy up to the host).
        re.compile(
            r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]{1,30}://[^\s:/?#@\[\]]*:"
            r"(?P<val>[^\s/?#]+)@[A-Za-z0-9.\-_\[\]:]+"
        ),
        group="val",
        priority=15,
        check=password_value_ok,
    ),
    RegexDetector(
        "bearer_token",
        re.compile(
            r"(?i)\b(?:proxy-)?authorization" + _ASSIGN + r"[\"']?"
            r"(?:bearer|basic|token|digest|apikey)[ \t]+(?P<val>[A-Za-z0-9\-._~+/]{8,}=*)"
        ),
        group="val",
        priority=25,  # a JWT or provider key inside the header is named as such
    ),
    RegexDetector(
        "bearer_token",
        re.compile(r"(?i)\bbearer[ \t]+(?P<val>[A-Za-z0-9\-._~+/]{16,}=*)"),
        group="val",
        priority=25,
        check=looks_random,
    ),
    RegexDetector(
        "password",
        # Code/config style (=, :=, =>): any value that is not a template or mask.
        re.compile(_PW_KEY + r"[\"']?[ \t]*(?::=|=>|=)[ \t]*" + _VALUE),
        group="val",
        priority=30,
        check=password_value_ok,
    ),
    RegexDetector(
        "password",
        # "password: x" is also how prose introduces things ("Reset your password: click
        # the link"), so an unquoted plain word after a colon is not taken as a password.
        re.compile(_PW_KEY + r"[\"']?[ \t]*:(?![:=])[ \t]*" + _VALUE),
        group="val",
        priority=30,
        check=lambda v: password_value_ok(v) and not _PLAIN_WORD.fullmatch(v),
    ),
    RegexDetector(
        "generic_secret",
        re.compile(
            r"(?i)(?<![A-Za-z0-9_.\-])[\"']?[A-Za-z0-9_.\-]{0,40}?"
            r"(?:api[_\-]?key|secret|token|credential|private[_\-]?key)s?" + _ASSIGN + _VALUE
        ),
        group="val",
        priority=40,
        check=looks_random,
    ),
)

# Metadata keys whose string value is a secret whatever it looks like.
SENSITIVE_KEY_RE = re.compile(
    r"(?i)(?:[A-Za-z0-9]*[_\-. ])?(?:(?P<pw>password|passwd|passphrase|passcode|pwd|pswd)"
    r"|api[_\-]?key|apikey|secret(?:[_\-]?key)?|client[_\-]?secret|(?:access|auth|refresh|bearer|id)?[_\-]?token"
    r"|private[_\-]?key|credentials?|authorization|cookie|session[_\-]?key)"
)


# Runs of digits joined by single spaces/dashes; find_cards picks card-shaped slices out of
# them, so a card followed or preceded by another number ("4111 1111 1111 1111 0") is found.
_DIGIT_RUN = re.compile(r"(?<![\d+.,])\d(?:[ \-]?\d){12,}(?!\d|[.,]\d)")
_GROUP = re.compile(r"\d+")


def _card_shape(groups: list[str]) -> bool:
    sizes = [len(g) for g in groups]
    if len(sizes) == 1:
        return True
    if sizes in ([4, 6, 5], [4, 6, 4]):  # Amex, Diners
        return True
    return len(sizes) >= 4 and all(n == 4 for n in sizes[:4]) and all(1 <= n <= 4 for n in sizes[4:])


def find_cards(text: str) -> list[tuple[int, int]]:
    """Spans of payment card numbers: card-shaped grouping, issuer prefix and Luhn.

    >>> find_cards("pay 4111 1111 1111 1111 today, not 4111 1111 1111 1112")
    [(4, 23)]
    """
    out: list[tuple[int, int]] = []
    for run in _DIGIT_RUN.finditer(text):
        groups = [(m.start() + run.start(), m.group()) for m in _GROUP.finditer(run.group())]
        i = 0
        while i < len(groups):
            if groups[i][1][0] not in "23456":  # no issuer range starts elsewhere
                i += 1
                continue
            best = None
            total = 0
            for j in range(i, min(len(groups), i + 5)):
                total += len(groups[j][1])
                if total > 19:
                    break
                parts = [g for _, g in groups[i:j + 1]]
                if total >= 13 and _card_shape(parts) and _card_ok("".join(parts)):
                    best = j
            if best is None:
                i += 1
                continue
            out.append((groups[i][0], groups[best][0] + len(groups[best][1])))
            i = best + 1
    return out


def private_key_fallback_span(text: str, marker_pos: int) -> tuple[int, int]:
    """Span for a private-key marker the block regex could not delimit (PuTTY, SSH2):
    from the start of its line to the end of the text; key bodies have no safe end."""
    return text.rfind("\n", 0, marker_pos) + 1, len(text)
