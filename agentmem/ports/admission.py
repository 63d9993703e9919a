"""Port: the counters a server admits chat requests against (requests in flight per API key and per user, and the
``max_tokens`` a user has in flight), kept in one process or shared by every server behind a load balancer.

A request takes a share of several counters at once (:class:`Claim`: ``1`` of ``"user:u1"``, ``256`` of
``"tokens:u1"``); it gets all of them or none (:meth:`AdmissionCounters.acquire` answers the first claim over its
cap as a :class:`Refusal`). A share is a lease: it ends ``lease_s`` after it was taken or last renewed, so the shares
of a server that died (no release, no renewal) free themselves. The policy (which counters, which caps, the 429) is
the server's (:class:`agentmem.server.scheduler.Scheduler`); a counter store only counts.

Example:
    >>> from agentmem.admission import open_admission_counters
    >>> counters = open_admission_counters()                        # in this process; "redis://..." is shared
    >>> one_each = [Claim("user:u1", 1, cap=1)]
    >>> counters.acquire("t1", one_each, lease_s=30), counters.held("user:u1")
    (None, 1)
    >>> counters.acquire("t2", one_each, lease_s=30)              # u1's one slot is taken
    Refusal(claim=Claim(name='user:u1', amount=1, cap=1), held=1)
    >>> counters.release("t1"); counters.acquire("t2", one_each, lease_s=30) is None
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Claim:
    """``amount`` units of the counter ``name``, allowed while what is held under ``name`` plus ``amount`` stays
    within ``cap``."""

    name: str
    amount: int
    cap: int


@dataclass(frozen=True)
class Refusal:
    """Why a request was not admitted: its ``claim`` would pass the cap, with ``held`` units already taken."""

    claim: Claim
    held: int


@runtime_checkable
class AdmissionCounters(Protocol):
    """Leased shares of named counters (the embedded default: in this process; Redis: shared by servers)."""

    def acquire(self, ticket: str, claims: Sequence[Claim], *, lease_s: float) -> Refusal | None:
        """Take every claim for ``ticket`` (a new, unique id) at once, or none of them: None when taken, else the
        first claim (in the order given) that would pass its cap. The shares last ``lease_s`` seconds unless
        renewed."""
        ...

    def renew(self, tickets: Sequence[str], *, lease_s: float) -> None:
        """Extend the shares of ``tickets`` to ``lease_s`` seconds from now (tickets no longer held: ignored)."""
        ...

    def release(self, ticket: str) -> None:
        """Give back every share of ``ticket`` (one released or expired already: nothing happens)."""
        ...

    def held(self, name: str) -> int:
        """The units of ``name`` held now by unexpired shares."""
        ...

    def close(self) -> None:
        """Release the connection (a closed store is not used again)."""
        ...


__all__ = ["AdmissionCounters", "Claim", "Refusal"]
