"""Append-only audit log of erasures, and log hygiene: no memory text or KV in logs.

The audit log records *that* something was erased (action, scope ids, count, actor, time),
never *what*: proving an erasure must not re-store the erased content.

>>> import tempfile, pathlib
>>> log = AuditLog(pathlib.Path(tempfile.mkdtemp()) / "audit.jsonl")
>>> rec = log.record("forget_user", user_id="u-42", count=17, by="gdpr-request-881")
>>> [r["action"] for r in log.read()], rec["count"]
(['forget_user'], 17)
>>> entry_summary("e-1", text="my secret diary", kind="fact", kv_nbytes=4096)
'entry=e-1 kind=fact chars=15 kv_bytes=4096'
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from agentmem.errors import InvalidInputError
from agentmem.validation import check_id

from .secrets import default_scanner

_ACTION = re.compile(r"[a-z][a-z0-9_.:\-]{0,63}")
AUDIT_VERSION = 1


class AuditLog:
    """JSON-lines audit trail; each :meth:`record` is one ``O_APPEND`` write plus fsync.

    ``O_APPEND`` makes each line land whole at the end even with several processes
    writing, and the file is created ``0600``. It is append-only by construction, not
    tamper-proof: ship it to external storage if it must survive a hostile host.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._lock = threading.Lock()

    def record(self, action: str, *, user_id: str | None = None, session_id: str | None = None,
               count: int, by: str | None = None) -> dict[str, Any]:
        """Append one event and return it. Only identifiers and a count are accepted.

        ``action`` is a short code such as ``forget``, ``forget_user``, ``expire``;
        ids and ``by`` must be short single-line identifiers, so text cannot ride along.
        """
        if not isinstance(action, str) or not _ACTION.fullmatch(action):
            raise InvalidInputError("audit action must be a short lowercase code like 'forget_user'")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidInputError("audit count must be a non-negative int")
        event: dict[str, Any] = {
            "v": AUDIT_VERSION,
            "ts": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "action": action,
            "user_id": _ident("user_id", user_id),
            "session_id": _ident("session_id", session_id),
            "count": count,
            "by": _ident("by", by),
        }
        line = (json.dumps(event, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o600)
            try:
                os.write(fd, line)  # one write: a line is never interleaved with another
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        return event

    def read(self) -> list[dict[str, Any]]:
        """All events, oldest first; a torn last line (crash mid-write) is skipped."""
        return list(self)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            with open(self.path, encoding="ascii", errors="replace") as f:
                for line in f:
                    try:
                        yield json.loads(line)
                    except ValueError:
                        continue
        except FileNotFoundError:
            return


def _ident(name: str, value: str | None) -> str | None:
    # the one id rule of every entry point: an id the API accepted is always recordable here
    return check_id(value, f"audit {name}", required=False)


# -- log hygiene -------------------------------------------------------------------------------

def entry_summary(entry_id: str, *, text: str | None = None, kind: str | None = None,
                  kv_nbytes: int | None = None) -> str:
    """What may be logged about an entry: its id, kind and sizes, never its content."""
    parts = [f"entry={entry_id}"]
    if kind is not None:
        parts.append(f"kind={kind}")
    if text is not None:
        parts.append(f"chars={len(text)}")
    if kv_nbytes is not None:
        parts.append(f"kv_bytes={kv_nbytes}")
    return " ".join(parts)


class SafeLogFilter(logging.Filter):
    """Defence in depth for log records at ``min_level`` and above: secrets are redacted,
    bytes arguments (KV blobs, tensors' buffers) become ``<N bytes>``, and messages longer
    than ``max_chars`` are cut, since a long message is almost always someone's content.

    It does not drop records and cannot tell prose from a log line: the rule stays that
    code logs :func:`entry_summary`, not text. Attach it to handlers (a logger's filters
    do not see records from its child loggers) or use :func:`install_log_filter`.

    >>> rec = logging.LogRecord("agentmem", logging.INFO, __file__, 1, "stored %s", (b"\\x00" * 9,), None)
    >>> SafeLogFilter().filter(rec), rec.getMessage()
    (True, 'stored <9 bytes>')
    """

    def __init__(self, *, min_level: int = logging.INFO, max_chars: int = 500) -> None:
        super().__init__()
        self.min_level = min_level
        self.max_chars = max_chars

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.min_level:
            return True
        try:
            args = record.args
            if isinstance(args, tuple):
                args = tuple(_safe_arg(a) for a in args)
            elif isinstance(args, dict):
                args = {k: _safe_arg(v) for k, v in args.items()}
            record.args = args
            message = record.getMessage()
        except Exception:  # a broken format string must not break logging
            message = str(record.msg)
        message = default_scanner().apply(message)
        if len(message) > self.max_chars:
            message = f"{message[: self.max_chars]}... [truncated {len(message) - self.max_chars} chars]"
        record.msg, record.args = message, None
        return True


def _safe_arg(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes>"
    return value


def install_log_filter(logger_name: str = "agentmem", **kwargs: Any) -> SafeLogFilter:
    """Attach one :class:`SafeLogFilter` to ``logger_name``, its existing child loggers
    and their handlers; returns it (call again after new child loggers are created)."""
    flt = SafeLogFilter(**kwargs)
    names = [logger_name] + [n for n in logging.root.manager.loggerDict if n.startswith(logger_name + ".")]
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, SafeLogFilter) for f in logger.filters):
            logger.addFilter(flt)
        for handler in logger.handlers:
            if not any(isinstance(f, SafeLogFilter) for f in handler.filters):
                handler.addFilter(flt)
    return flt


__all__ = ["AUDIT_VERSION", "AuditLog", "SafeLogFilter", "entry_summary", "install_log_filter"]
