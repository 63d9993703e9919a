"""The manager's bookkeeping of one session, as a public dataclass both sides read by name.

:class:`~agentmem.sessions.session.Session` is what a caller holds (``send``, ``history``, ``reset``);
:class:`SessionSlot` is where its working KV is and what is on disk and leased, which the
:class:`~agentmem.sessions.manager.SessionManager` changes under the session's lock. Neither reaches into the
other's private fields for it.

Example:
    >>> slot = SessionSlot("u/s")
    >>> slot.tier is None and slot.version == 0 and slot.disk_version is None
    True
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SessionSlot"]


@dataclass
class SessionSlot:
    """Where one session's working KV lives and what its copies are (changed only under the session's lock)."""

    key: str  # the cold store's key: digests of the user and session ids
    tier: str | None = None  # "hot", "warm", "cold", or None (nothing cached)
    state: Any = None  # its Transcript while in memory; None while it lives on disk (or has no turns yet)
    busy: bool = False  # answering a turn right now: never moved to another tier
    last_used: float = field(default_factory=time.time)
    version: int = 0  # bumped by every send and reset: lets the worker write a snapshot without the lock
    disk_version: int | None = None  # the version its cold copy holds (None: no current copy)
    lease_until: float = 0.0  # time.monotonic() until which this worker surely holds the session's lease
    # held by a turn, a tier move or the worker: everything above changes only under it (re-entrant: a turn resets)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)
