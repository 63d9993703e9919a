"""Admission and cancellation of chat requests: caps per API key and per user, and a cancel event per request.

* A request is admitted only while its API key and its user are under their caps on requests in flight and on
  ``max_tokens`` in flight; otherwise it gets **429** with ``Retry-After`` (a client backs off and retries; the
  OpenAI client does so by itself). A single request asking for more than ``max_tokens_limit`` gets **400**:
  waiting would not help it.
* The counts live in admission counters (:mod:`agentmem.admission`): in this process by default, or in Redis
  (``ServerSettings.limits_url``) where several servers behind a load balancer hold one user to one cap. A request's
  share is a lease of ``limits_lease_s`` that a thread here renews while it runs, so the shares of a server that
  died free themselves. Counters that cannot be reached answer **503** with ``Retry-After``: no request is
  admitted uncounted.
* Every admitted request carries a ``threading.Event``; setting it stops its decode before the next model step
  (the client hung up, or the server is shutting down: :meth:`Scheduler.cancel_all`).

Fair interleaving of the admitted requests' decode steps is the engine's job (:mod:`agentmem.kv.batch`): requests
decoding at the same time advance one token each per step, so a long answer never holds another's first token.

Example:
    >>> from agentmem.server.state import ServerSettings
    >>> scheduler = Scheduler(ServerSettings(max_concurrent_per_user=2))
    >>> with scheduler.admitted(key_id="k1", user="u1", max_tokens=64) as ticket:
    ...     ticket.cancel.is_set()    # what mem.generate(..., cancel=ticket.cancel) watches between decode steps
    False
    >>> scheduler.close()
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from fastapi import HTTPException

from agentmem.admission import AdmissionCounters, Claim, Refusal, open_admission_counters

__all__ = ["AdmissionCaps", "Scheduler", "Ticket"]

log = logging.getLogger(__name__)


class AdmissionCaps(Protocol):
    """The caps a :class:`Scheduler` enforces (``agentmem.server.state.ServerSettings`` has them; declared here so
    the scheduler does not import the state module that builds it).

    Example:
        >>> from agentmem.server.state import ServerSettings
        >>> caps: AdmissionCaps = ServerSettings(max_concurrent_per_user=2)
        >>> caps.max_concurrent_per_user
        2
    """

    max_tokens_limit: int
    max_concurrent_per_key: int
    max_concurrent_per_user: int
    max_tokens_in_flight_per_user: int
    retry_after_s: int
    limits_lease_s: float


@dataclass(eq=False)
class Ticket:
    """One admitted request: the event that cancels its decode, and the id its shares of the caps are held under
    in the admission counters."""

    cancel: threading.Event = field(default_factory=threading.Event)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)


class Scheduler:
    """Counts requests and ``max_tokens`` in flight per API key and per user; refuses what is over a cap.

    Args:
        settings: the caps (``ServerSettings``).
        counters: where the counts live (default: in this process; :func:`agentmem.admission.open_admission_counters`
            builds the shared ones).
    """

    def __init__(self, settings: AdmissionCaps, counters: AdmissionCounters | None = None) -> None:
        self.settings = settings
        self.counters = counters if counters is not None else open_admission_counters()
        self._lock = threading.Lock()
        self._tickets: set[Ticket] = set()
        self._stop = threading.Event()
        # renew the leases of the requests in flight three times a lease: a slow renewal does not lose one
        self._renewer = threading.Thread(target=self._renew_loop, name="agentmem-admission", daemon=True)
        self._renewer.start()

    def admit(self, *, key_id: str | None, user: str, max_tokens: int) -> Ticket:
        """A ticket for a new request, or HTTPException 400 (max_tokens over the limit) / 429 (over a cap) / 503
        (the counters cannot be reached).

        Example:
            >>> from agentmem.server.state import ServerSettings
            >>> scheduler = Scheduler(ServerSettings(max_concurrent_per_user=1))
            >>> ticket = scheduler.admit(key_id=None, user="u1", max_tokens=16)
            >>> scheduler.admit(key_id=None, user="u1", max_tokens=16)   # the user's one slot is taken
            Traceback (most recent call last):
            ...
            fastapi.exceptions.HTTPException: 429: ...
            >>> scheduler.release(ticket); scheduler.close()
        """
        s = self.settings
        if max_tokens > s.max_tokens_limit:
            raise HTTPException(400, f"max_tokens must be <= {s.max_tokens_limit} on this server (got {max_tokens})")
        ticket = Ticket()
        claims = ([Claim(f"key:{key_id}", 1, s.max_concurrent_per_key)] if key_id is not None else []) + [
            Claim(f"user:{user}", 1, s.max_concurrent_per_user),
            Claim(f"tokens:{user}", max_tokens, s.max_tokens_in_flight_per_user)]
        try:
            refused = self.counters.acquire(ticket.id, claims, lease_s=s.limits_lease_s)
        except Exception as exc:  # the shared counters are down: refuse rather than admit uncounted
            log.warning("admission counters unreachable: %s", type(exc).__name__)
            raise HTTPException(503, "the server cannot count requests in flight right now; retry later",
                                headers={"Retry-After": str(s.retry_after_s)}) from exc
        if refused is not None:
            raise HTTPException(429, f"too many requests: {self._why(refused, user)}; retry later",
                                headers={"Retry-After": str(s.retry_after_s)})
        with self._lock:
            self._tickets.add(ticket)
        return ticket

    def _why(self, refused: Refusal, user: str) -> str:
        claim, s = refused.claim, self.settings
        if claim.name.startswith("key:"):
            return (f"this API key already has {refused.held} chat requests in flight "
                    f"(max_concurrent_per_key={s.max_concurrent_per_key})")
        if claim.name.startswith("user:"):
            return (f"user {user!r} already has {refused.held} chat requests in flight "
                    f"(max_concurrent_per_user={s.max_concurrent_per_user})")
        return (f"user {user!r} already has {refused.held} max_tokens in flight; {claim.amount} more would pass "
                f"max_tokens_in_flight_per_user={s.max_tokens_in_flight_per_user}")

    def release(self, ticket: Ticket) -> None:
        """The request is over (answered, failed or cancelled): its share of the caps is free again."""
        with self._lock:
            if ticket not in self._tickets:
                return
            self._tickets.discard(ticket)
        try:
            self.counters.release(ticket.id)
        except Exception as exc:  # its lease ends on its own once this server stops renewing it
            log.warning("admission counters unreachable on release: %s", type(exc).__name__)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.settings.limits_lease_s / 3):
            with self._lock:
                ids = [t.id for t in self._tickets]
            try:
                self.counters.renew(ids, lease_s=self.settings.limits_lease_s)
            except Exception as exc:  # tried again at the next turn, well within the lease
                log.warning("admission counters unreachable on renewal: %s", type(exc).__name__)

    def close(self) -> None:
        """Stop renewing leases, give back the shares of requests still in flight (cancelled: the server is
        shutting down) and close the counters."""
        self._stop.set()
        with self._lock:
            left = list(self._tickets)
        for ticket in left:
            self.release(ticket)
        self.counters.close()

    @contextmanager
    def admitted(self, *, key_id: str | None, user: str, max_tokens: int) -> Iterator[Ticket]:
        """``admit`` ... ``release`` around a block."""
        ticket = self.admit(key_id=key_id, user=user, max_tokens=max_tokens)
        try:
            yield ticket
        finally:
            self.release(ticket)

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet released."""
        with self._lock:
            return len(self._tickets)

    def cancel_all(self) -> int:
        """Cancel every request in flight (the server is shutting down); how many there were."""
        with self._lock:
            tickets = list(self._tickets)
        for ticket in tickets:
            ticket.cancel.set()
        return len(tickets)
