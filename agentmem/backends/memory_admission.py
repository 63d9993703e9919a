"""Admission counters in this process (the default of one server): what :mod:`agentmem.backends.redis_admission`
shares between servers, kept in a dict under a lock.

Example:
    >>> from agentmem.ports.admission import Claim
    >>> counters = MemoryAdmissionCounters()
    >>> counters.acquire("t1", [Claim("tokens:u1", 300, cap=512)], lease_s=30), counters.held("tokens:u1")
    (None, 300)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from agentmem.ports.admission import Claim, Refusal

__all__ = ["MemoryAdmissionCounters", "build"]


class MemoryAdmissionCounters:
    """Leased shares of named counters in a dict; implements :class:`~agentmem.ports.admission.AdmissionCounters`.

    Args:
        clock: seconds, monotonic (tests pass a fake one to expire leases).
    """

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._shares: dict[str, dict[str, tuple[int, float]]] = {}  # name -> ticket -> (amount, expires at)
        self._names: dict[str, list[str]] = {}  # ticket -> the names it holds a share of

    def _live(self, name: str, now: float) -> dict[str, tuple[int, float]]:
        shares = self._shares.get(name, {})
        for ticket in [t for t, (_, until) in shares.items() if until <= now]:  # its holder stopped renewing
            del shares[ticket]
        return shares

    def acquire(self, ticket: str, claims: Sequence[Claim], *, lease_s: float) -> Refusal | None:
        with self._lock:
            now = self._clock()
            for claim in claims:
                held = sum(amount for amount, _ in self._live(claim.name, now).values())
                if held + claim.amount > claim.cap:
                    return Refusal(claim, held)
            for claim in claims:
                self._shares.setdefault(claim.name, {})[ticket] = (claim.amount, now + lease_s)
            self._names[ticket] = [c.name for c in claims]
            return None

    def renew(self, tickets: Sequence[str], *, lease_s: float) -> None:
        with self._lock:
            until = self._clock() + lease_s
            for ticket in tickets:
                for name in self._names.get(ticket, ()):
                    share = self._shares.get(name, {}).get(ticket)
                    if share is not None:
                        self._shares[name][ticket] = (share[0], until)

    def release(self, ticket: str) -> None:
        with self._lock:
            for name in self._names.pop(ticket, ()):
                shares = self._shares.get(name, {})
                shares.pop(ticket, None)
                if not shares:
                    self._shares.pop(name, None)

    def held(self, name: str) -> int:
        with self._lock:
            return sum(amount for amount, _ in self._live(name, self._clock()).values())

    def close(self) -> None:
        pass


def build(url: str | None, ctx: Any) -> MemoryAdmissionCounters:
    """The factory's builder (``limits_url`` None or ``"memory"``)."""
    return MemoryAdmissionCounters()
