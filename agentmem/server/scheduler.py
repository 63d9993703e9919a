"""Admission and cancellation of chat requests: caps per API key and per user, and a cancel event per request.

* A request is admitted only while its API key and its user are under their caps on requests in flight and on
  ``max_tokens`` in flight; otherwise it gets **429** with ``Retry-After`` (a client backs off and retries; the
  OpenAI client does so by itself). A single request asking for more than ``max_tokens_limit`` gets **400**:
  waiting would not help it.
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
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from fastapi import HTTPException

__all__ = ["AdmissionCaps", "Scheduler", "Ticket"]


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


@dataclass(eq=False)
class Ticket:
    """One admitted request: who it counts against, and the event that cancels its decode."""

    key: str
    user: str
    max_tokens: int
    cancel: threading.Event = field(default_factory=threading.Event)


class Scheduler:
    """Counts requests and ``max_tokens`` in flight per API key and per user; refuses what is over a cap."""

    def __init__(self, settings: AdmissionCaps) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._tickets: set[Ticket] = set()
        self._requests: Counter[str] = Counter()  # "key:<id>" / "user:<id>" -> requests in flight
        self._tokens: Counter[str] = Counter()  # "user:<id>" -> max_tokens in flight

    def admit(self, *, key_id: str | None, user: str, max_tokens: int) -> Ticket:
        """A ticket for a new request, or HTTPException 400 (max_tokens over the limit) / 429 (over a cap).

        Example:
            >>> from agentmem.server.state import ServerSettings
            >>> scheduler = Scheduler(ServerSettings(max_concurrent_per_user=1))
            >>> ticket = scheduler.admit(key_id=None, user="u1", max_tokens=16)
            >>> scheduler.admit(key_id=None, user="u1", max_tokens=16)   # the user's one slot is taken
            Traceback (most recent call last):
            ...
            fastapi.exceptions.HTTPException: 429: ...
            >>> scheduler.release(ticket)
        """
        s = self.settings
        if max_tokens > s.max_tokens_limit:
            raise HTTPException(400, f"max_tokens must be <= {s.max_tokens_limit} on this server (got {max_tokens})")
        key, user_key = f"key:{key_id or '-'}", f"user:{user}"
        with self._lock:
            if key_id is not None and self._requests[key] >= s.max_concurrent_per_key:
                self._refuse(f"this API key already has {self._requests[key]} chat requests in flight "
                             f"(max_concurrent_per_key={s.max_concurrent_per_key})")
            if self._requests[user_key] >= s.max_concurrent_per_user:
                self._refuse(f"user {user!r} already has {self._requests[user_key]} chat requests in flight "
                             f"(max_concurrent_per_user={s.max_concurrent_per_user})")
            if self._tokens[user_key] + max_tokens > s.max_tokens_in_flight_per_user:
                self._refuse(f"user {user!r} already has {self._tokens[user_key]} max_tokens in flight; "
                             f"{max_tokens} more would pass max_tokens_in_flight_per_user="
                             f"{s.max_tokens_in_flight_per_user}")
            ticket = Ticket(key=key, user=user_key, max_tokens=max_tokens)
            self._requests[key] += 1
            self._requests[user_key] += 1
            self._tokens[user_key] += max_tokens
            self._tickets.add(ticket)
            return ticket

    def _refuse(self, message: str) -> None:
        raise HTTPException(429, f"too many requests: {message}; retry later",
                            headers={"Retry-After": str(self.settings.retry_after_s)})

    def release(self, ticket: Ticket) -> None:
        """The request is over (answered, failed or cancelled): its share of the caps is free again."""
        with self._lock:
            if ticket not in self._tickets:
                return
            self._tickets.discard(ticket)
            for name in (ticket.key, ticket.user):
                self._requests[name] -= 1
                if self._requests[name] <= 0:
                    del self._requests[name]
            self._tokens[ticket.user] -= ticket.max_tokens
            if self._tokens[ticket.user] <= 0:
                del self._tokens[ticket.user]

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
