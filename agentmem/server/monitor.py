"""What the inspector shows about recent chat requests, and the fidelity monitor.

:class:`RequestLog` keeps the last requests (what was recalled, mounted, dropped and why). :class:`FidelityMonitor`
scores a configurable share of chat answers again, teacher-forced, with the same memories mounted as KV and
re-encoded as text (``mem.fidelity``), on a background thread so the answer is not delayed; the KL goes to
``/metrics`` and into the request's log record.

Example:
    >>> log = RequestLog(limit=100)
    >>> rid = log.add({"user": "u1", "query": "hi", "mounted": []})
    >>> log.get(rid)["user"]
    'u1'
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentmem.erasure import Erasure

__all__ = ["FidelityMonitor", "RequestLog"]

log = logging.getLogger("agentmem.server")


class RequestLog:
    """The last ``limit`` chat requests, newest last; thread-safe."""

    def __init__(self, limit: int = 200) -> None:
        self._limit = limit
        self._items: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, record: dict[str, Any]) -> str:
        """Store a record (an ``id`` and ``at`` are added); returns its id."""
        rid = record.get("id") or uuid.uuid4().hex[:12]
        with self._lock:
            self._items[rid] = {**record, "id": rid, "at": record.get("at", time.time())}
            while len(self._items) > self._limit:
                self._items.popitem(last=False)
        return rid

    def update(self, rid: str, **fields: Any) -> None:
        with self._lock:
            if rid in self._items:
                self._items[rid].update(fields)

    def get(self, rid: str) -> dict[str, Any] | None:
        with self._lock:
            item = self._items.get(rid)
            return dict(item) if item is not None else None

    def purge(self, erasure: Erasure) -> int:
        """Drop every request that touched what ``erasure`` erased: a request of a user erased whole or of an
        erased session, or one that recalled, mounted or remembered an erased entry (its question may be that
        entry's text); returns how many were dropped.

        Example:
            >>> log = RequestLog()
            >>> _ = log.add({"user": "u1", "query": "my diagnosis is ...", "recalled": []})
            >>> log.purge(Erasure(action="forget_user", user_ids=frozenset({"u1"}))), log.recent()
            (1, [])
        """
        def touched(record: dict[str, Any]) -> bool:
            hits = {h.get("id") for h in (*record.get("recalled", ()), *record.get("mounted", ()))}
            hits |= set(record.get("remembered", ()))
            return (record.get("user") in erasure.user_ids or record.get("session_id") in erasure.session_ids
                    or not hits.isdisjoint(erasure.entry_ids))

        with self._lock:
            gone = [rid for rid, record in self._items.items() if touched(record)]
            for rid in gone:
                del self._items[rid]
        return len(gone)

    def __contains__(self, rid: object) -> bool:
        with self._lock:
            return rid in self._items

    def recent(self, users: Any = None, limit: int = 50) -> list[dict[str, Any]]:
        """Newest first; only requests for users in ``users`` when given (a caller sees its own tenants only)."""
        with self._lock:
            items = [dict(v) for v in reversed(self._items.values())]
        if users is not None:
            items = [i for i in items if i.get("user") in users]
        return items[:limit]


class FidelityMonitor:
    """Scores every ``1/share``-th chat answer in text mode too (deterministic spacing, not random)."""

    def __init__(self, mem: Any, metrics: Any, requests: RequestLog, *, share: float = 0.1, tokens: int = 8,
                 history: int = 500) -> None:
        self._mem, self._metrics, self._requests = mem, metrics, requests
        self.share, self.tokens = share, tokens
        self._credit = 0.0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentmem-fidelity")
        self.series: deque[dict[str, Any]] = deque(maxlen=history)

    def due(self) -> bool:
        """Whether this request is one of the scored share."""
        if self.share <= 0:
            return False
        with self._lock:
            self._credit += self.share
            if self._credit >= 1.0 - 1e-9:
                self._credit -= 1.0
                return True
            return False

    def submit(self, rid: str, question: str, user_id: str, answer: str, entry_ids: list[str]) -> None:
        """Score in the background (only answers with mounted memories and some text are scorable)."""
        if not entry_ids or not answer.strip():
            return
        self._pool.submit(self._score, rid, question, user_id, answer, entry_ids)

    def _score(self, rid: str, question: str, user_id: str, answer: str, entry_ids: list[str]) -> None:
        try:
            report = self._mem.fidelity(question, user_id=user_id, answer=answer, entry_ids=entry_ids,
                                        tokens=self.tokens)
        except Exception as exc:  # a forgotten entry or a closing store: note it, never break serving
            log.info("fidelity scoring skipped: %s", type(exc).__name__)
            self._requests.update(rid, fidelity={"error": type(exc).__name__})
            return
        if rid not in self._requests:  # erased while it was being scored: keep nothing of it
            return
        self._metrics.fidelity_kl.observe(report["kl"])
        self._metrics.fidelity_last.set(report["kl"])
        self._metrics.fidelity_top1.set(report["top1_agree"])
        point = {"at": time.time(), "request": rid, **report}
        self.series.append(point)
        self._requests.update(rid, fidelity=report)

    def purge(self, erasure: Erasure) -> None:
        """Drop the scores of requests the request log no longer holds (call after :meth:`RequestLog.purge`):
        a point names its request, and an erased user's requests must not stay findable through it."""
        kept = [p for p in list(self.series) if p["request"] in self._requests]
        self.series.clear()
        self.series.extend(kept)

    def drain(self, timeout: float = 30.0) -> None:
        """Wait for queued scorings (tests, shutdown)."""
        self._pool.submit(lambda: None).result(timeout=timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
