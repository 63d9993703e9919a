"""Where a server counts its chat requests in flight: the one opening the server reaches its admission counters
through (in this process, or in Redis shared by several servers).

The server uses agentmem's public API only (``.importlinter``), never the ports, backends or factory; this module is
the smallest surface that lets it open the counters the factory builds: one function, and the port's types. The
caps themselves (which counters, what a refusal answers) are the server's
(:class:`agentmem.server.scheduler.Scheduler`).

Example:
    >>> counters = open_admission_counters()                       # in this process
    >>> counters.acquire("t1", [Claim("key:k1", 1, cap=4)], lease_s=30) is None, counters.held("key:k1")
    (True, 1)
"""

from __future__ import annotations

from agentmem.factory import build_admission
from agentmem.ports.admission import AdmissionCounters, Claim, Refusal


def open_admission_counters(url: str | None = None) -> AdmissionCounters:
    """The admission counters ``url`` names: None or ``"memory"`` in this process, ``redis://host:port/db``
    (``rediss://``, ``unix://``; ``?prefix=`` sets the key prefix) shared by every server on that Redis.

    Example:
        >>> open_admission_counters("memory").held("user:u1")
        0
    """
    return build_admission(url)


__all__ = ["AdmissionCounters", "Claim", "Refusal", "open_admission_counters"]
