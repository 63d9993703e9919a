"""Storage tiers for session KV, after LMCache's split: small storage backends, eviction policy kept apart.

* :class:`MemoryBackend` keeps :class:`~agentmem.sessions.state.SessionKV` objects on one device: the **hot** tier
  on the model's device, the **warm** tier on the CPU. (On a CPU-only machine both are host memory, with separate
  budgets and counters, so the logic that runs is the one that runs with a GPU.) Its methods are the
  :class:`TierBackend` protocol; the manager calls nothing else on it.
* The **cold** tier is a :class:`~agentmem.ports.sessions.SessionTierStore` (bytes already serialised, and
  encrypted when a cipher is set): files under the store path
  (:class:`~agentmem.backends.file_sessions.FileSessionStore`) or Redis
  (:class:`~agentmem.backends.redis_sessions.RedisSessionStore`), shared by every worker.

:class:`LRUPolicy` only orders keys; :class:`Tier` joins a backend, a policy, a byte budget and counters. Which
session to move and where is decided by the manager.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["LRUPolicy", "MemoryBackend", "Tier", "TierBackend", "TierCounters"]

log = logging.getLogger(__name__)


class TierBackend(Protocol):
    """An in-memory tier (hot or warm): session KV objects by key, on one device."""

    name: str

    def put(self, key: str, value: Any) -> None: ...
    def get(self, key: str) -> Any | None: ...
    def pop(self, key: str) -> Any | None: ...
    def contains(self, key: str) -> bool: ...
    def nbytes(self) -> int: ...
    def size(self, key: str) -> int: ...
    def keys(self) -> list[str]: ...


class MemoryBackend:
    """Session KV held in memory on ``device`` (values must already live there)."""

    def __init__(self, name: str, device: Any = "cpu") -> None:
        self.name = name
        self.device = device
        self._items: dict[str, Any] = {}
        self._lock = threading.Lock()

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._items[key] = value

    def get(self, key: str) -> Any | None:
        with self._lock:
            return self._items.get(key)

    def pop(self, key: str) -> Any | None:
        with self._lock:
            return self._items.pop(key, None)

    def contains(self, key: str) -> bool:
        with self._lock:
            return key in self._items

    def nbytes(self) -> int:
        with self._lock:
            return sum(v.nbytes for v in self._items.values())

    def size(self, key: str) -> int:
        with self._lock:
            value = self._items.get(key)
            return 0 if value is None else value.nbytes

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._items)


class LRUPolicy:
    """Least-recently-used order of keys; knows nothing about storage."""

    def __init__(self) -> None:
        self._order: OrderedDict[str, None] = OrderedDict()

    def touch(self, key: str) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def remove(self, key: str) -> None:
        self._order.pop(key, None)

    def victims(self) -> list[str]:
        """Keys from least to most recently used."""
        return list(self._order)

    def __contains__(self, key: str) -> bool:
        return key in self._order

    def __len__(self) -> int:
        return len(self._order)


@dataclass
class TierCounters:
    hits: int = 0
    misses: int = 0
    offloads: int = 0  # sessions moved out of this tier to a lower one
    restores: int = 0  # sessions restored from this tier to hot
    peak_bytes: int = 0
    over_budget: int = 0  # times a tier had to exceed its budget (every candidate to move was in use)
    restore_seconds: list[float] = field(default_factory=list)


@dataclass
class Tier:
    """A backend + its eviction order + its byte budget (``None``: unbounded) + counters.

    ``backend`` is a :class:`TierBackend` (hot, warm) or a :class:`~agentmem.ports.sessions.SessionTierStore` (cold).
    """

    backend: Any
    budget: int | None
    policy: LRUPolicy = field(default_factory=LRUPolicy)
    counters: TierCounters = field(default_factory=TierCounters)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def name(self) -> str:
        return self.backend.name

    def bytes(self) -> int:
        return self.backend.nbytes()

    def note_bytes(self) -> None:
        used = self.bytes()
        with self._lock:
            self.counters.peak_bytes = max(self.counters.peak_bytes, used)
            if self.budget is not None and used > self.budget:
                self.counters.over_budget += 1

    def stats(self) -> dict[str, Any]:
        c = self.counters
        lat = sorted(c.restore_seconds)
        return {
            "sessions": len(self.backend.keys()),
            "bytes": self.bytes(),
            "budget_bytes": self.budget,
            "peak_bytes": c.peak_bytes,
            "over_budget": c.over_budget,
            "hits": c.hits,
            "misses": c.misses,
            "offloads": c.offloads,
            "restores": c.restores,
            "restore_latency_s": {
                "count": len(lat),
                "mean": sum(lat) / len(lat) if lat else None,
                "p50": lat[len(lat) // 2] if lat else None,
                "max": lat[-1] if lat else None,
            },
        }
