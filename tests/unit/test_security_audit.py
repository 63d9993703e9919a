"""Audit log of erasures holds no content; logs hold no secrets or KV bytes."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import pytest

from agentmem.errors import InvalidInputError
from agentmem.security.audit import AuditLog, SafeLogFilter, entry_summary, install_log_filter

SECRET_TEXT = "my bank PIN is 8812 and I love Paris"


def test_record_writes_json_lines_without_content(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "sub" / "audit.jsonl")
    log.record("forget", user_id="u1", session_id="s1", count=3, by="api")
    log.record("forget_user", user_id="u1", count=12)
    log.record("expire", count=0)
    raw = (tmp_path / "sub" / "audit.jsonl").read_text()
    lines = raw.splitlines()
    assert len(lines) == 3
    first = json.loads(lines[0])
    assert set(first) == {"v", "ts", "action", "user_id", "session_id", "count", "by"}
    assert first["ts"].endswith("Z") and first["count"] == 3
    assert [e["action"] for e in log.read()] == ["forget", "forget_user", "expire"]
    assert oct((tmp_path / "sub" / "audit.jsonl").stat().st_mode & 0o777) == "0o600"


def test_record_refuses_anything_shaped_like_content(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    with pytest.raises(InvalidInputError):
        log.record(SECRET_TEXT, count=1)  # free text is not an action code
    with pytest.raises(InvalidInputError):
        log.record("forget", user_id="x" * 300, count=1)
    with pytest.raises(InvalidInputError):
        log.record("forget", session_id="line1\nline2", count=1)
    with pytest.raises(InvalidInputError):
        log.record("forget", count=-1)
    with pytest.raises(InvalidInputError):
        log.record("forget", count=True)
    with pytest.raises(TypeError):
        log.record("forget", count=1, text=SECRET_TEXT)  # type: ignore[call-arg]
    assert log.read() == []


def test_appends_are_whole_lines_under_concurrency(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", fsync=False)
    other = AuditLog(tmp_path / "audit.jsonl", fsync=False)  # a second handle, like another process

    def work(target: AuditLog) -> None:
        for i in range(100):
            target.record("forget", user_id=f"user-{i}", count=i)

    threads = [threading.Thread(target=work, args=(t,)) for t in (log, other, log, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert len(lines) == 400
    assert all(json.loads(line)["action"] == "forget" for line in lines)


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    log.record("forget", count=1)
    with open(tmp_path / "audit.jsonl", "ab") as f:
        f.write(b'{"v":1,"ts":"2024')  # crash mid-write
    assert len(log.read()) == 1
    assert AuditLog(tmp_path / "missing.jsonl").read() == []


def test_entry_summary_has_no_content() -> None:
    s = entry_summary("e-9", text=SECRET_TEXT, kind="fact", kv_nbytes=1 << 20)
    assert s == f"entry=e-9 kind=fact chars={len(SECRET_TEXT)} kv_bytes=1048576"
    assert "Paris" not in s and "8812" not in s


@pytest.fixture()
def captured() -> tuple[logging.Logger, list[str]]:
    logger = logging.getLogger("agentmem.test_security_audit")
    out: list[str] = []

    class ListHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            out.append(self.format(record))

    handler = ListHandler()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, out
    logger.removeHandler(handler)
    logger.filters.clear()


def test_safe_log_filter_redacts_secrets_bytes_and_long_text(captured: tuple[logging.Logger, list[str]]) -> None:
    logger, out = captured
    logger.addFilter(SafeLogFilter(max_chars=80))
    logger.info("connecting with password=%s", "hunter2hunter2")
    logger.info("stored kv %s", os.urandom(64))
    logger.warning("dumped %s", "x" * 500)
    logger.info("ratio %d%%", 5)
    logger.debug("debug is left alone: password=%s", "dbg-only")
    assert out[0] == "connecting with password=[REDACTED:password]"
    assert out[1] == "stored kv <64 bytes>"
    assert out[2].endswith("[truncated 427 chars]") and len(out[2]) < 120
    assert out[3] == "ratio 5%"
    assert "dbg-only" in out[4]


def test_install_log_filter_reaches_child_loggers(captured: tuple[logging.Logger, list[str]]) -> None:
    logger, out = captured
    flt = install_log_filter("agentmem")
    assert flt in logger.filters
    install_log_filter("agentmem")  # idempotent
    assert sum(isinstance(f, SafeLogFilter) for f in logger.filters) == 1
    logger.error("key %s leaked", "ghp_" + "Ab1" * 12)
    assert "ghp_" not in out[-1]
    logging.getLogger("agentmem").removeFilter(flt)
