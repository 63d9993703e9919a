"""Storage tiers for session KV, after LMCache's split: small storage backends, eviction policy kept apart.

Every backend has the same five verbs (``put``/``get``/``pop``/``contains``/``bytes``) over string keys:

* :class:`MemoryBackend` keeps :class:`~agentmem.sessions.state.SessionKV` objects on one device: the **hot** tier
  on the model's device, the **warm** tier on the CPU. (On a CPU-only machine both are host memory, with separate
  budgets and counters, so the logic that runs is the one that runs with a GPU.)
* :class:`DiskBackend` is the **cold** tier: one file per session (bytes already serialised, and encrypted when a
  cipher is set), written atomically (tmp file + fsync + rename). ``pop`` moves the file into a trash directory
  (instant) and :meth:`DiskBackend.drain_trash` overwrites and unlinks it later, off the restore path.

:class:`LRUPolicy` only orders keys; :class:`Tier` joins a backend, a policy, a byte budget and counters. Which
session to move and where is decided by the manager.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agentmem._fs import publish, write_temp
from agentmem.security import secure_unlink

__all__ = ["DiskBackend", "LRUPolicy", "MemoryBackend", "Tier", "TierBackend", "TierCounters"]

log = logging.getLogger(__name__)
SUFFIX = ".session"


class TierBackend(Protocol):
    name: str

    def put(self, key: str, value: Any) -> None: ...
    def get(self, key: str) -> Any | None: ...
    def pop(self, key: str) -> Any | None: ...
    def contains(self, key: str) -> bool: ...
    def bytes(self) -> int: ...


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

    def bytes(self) -> int:
        with self._lock:
            return sum(v.nbytes for v in self._items.values())

    def size(self, key: str) -> int:
        with self._lock:
            value = self._items.get(key)
            return 0 if value is None else value.nbytes

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._items)


class DiskBackend:
    """One file per key under ``root`` (keys may hold one ``/``: a per-user folder)."""

    def __init__(self, root: Path, name: str = "cold") -> None:
        self.name = name
        self.root = Path(root)
        self.trash = self.root / ".trash"
        self._sizes: dict[str, int] = {}
        self._lock = threading.Lock()
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        for path in self.root.glob(f"*/*{SUFFIX}"):  # files left by an earlier process
            self._sizes[self._key_of(path)] = path.stat().st_size
        for tmp in self.root.glob("*/.*.tmp"):  # a write that crashed before its rename
            secure_unlink(tmp, missing_ok=True)

    def path(self, key: str) -> Path:
        return self.root / f"{key}{SUFFIX}"

    def _key_of(self, path: Path) -> str:
        return f"{path.parent.name}/{path.name[: -len(SUFFIX)]}"

    def put(self, key: str, value: bytes, *, mtime: float | None = None) -> None:
        """Write the key's file atomically (tmp + fsync + rename)."""
        self.commit(key, self.stage(key, value, mtime=mtime))

    def stage(self, key: str, value: bytes, *, mtime: float | None = None) -> Path:
        """Write ``value`` to a fsynced temp file next to the key's file; :meth:`commit` or :meth:`discard` it."""
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # mtime = last use, for the TTL of sessions no process has opened
        return write_temp(path, value, mtime=mtime)

    def commit(self, key: str, staged: Path) -> None:
        """Publish a staged file as the key's file (atomic rename)."""
        path = self.path(key)
        publish(staged, path)
        with self._lock:
            self._sizes[key] = path.stat().st_size

    def discard(self, staged: Path) -> None:
        secure_unlink(staged, missing_ok=True)

    def get(self, key: str) -> bytearray | None:
        try:
            return _read(self.path(key))
        except FileNotFoundError:
            return None

    def pop(self, key: str) -> bytearray | None:
        """Read the file and move it to the trash (overwritten later by :meth:`drain_trash`)."""
        path = self.path(key)
        try:
            data = _read(path)
        except FileNotFoundError:
            with self._lock:
                self._sizes.pop(key, None)
            return None
        self.trash.mkdir(exist_ok=True, mode=0o700)
        os.replace(path, self.trash / f"{time.time_ns()}-{threading.get_ident()}.trashed")
        with self._lock:
            self._sizes.pop(key, None)
        return data

    def retire(self, key: str) -> bool:
        """Move the key's file to the trash unread (overwritten later by :meth:`drain_trash`)."""
        self.trash.mkdir(exist_ok=True, mode=0o700)
        try:
            os.replace(self.path(key), self.trash / f"{time.time_ns()}-{threading.get_ident()}.trashed")
        except FileNotFoundError:
            return False
        finally:
            with self._lock:
                self._sizes.pop(key, None)
        return True

    def erase(self, key: str) -> bool:
        """Overwrite and unlink the key's file now."""
        with self._lock:
            self._sizes.pop(key, None)
        return secure_unlink(self.path(key), missing_ok=True)

    def contains(self, key: str) -> bool:
        return self.path(key).exists()

    def bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def size(self, key: str) -> int:
        with self._lock:
            return self._sizes.get(key, 0)

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._sizes)

    def mtime(self, key: str) -> float | None:
        try:
            return self.path(key).stat().st_mtime
        except FileNotFoundError:
            return None

    def find(self, session_hash: str) -> list[str]:
        """Keys of every file named for this session, whoever's folder it is in."""
        return [self._key_of(p) for p in self.root.glob(f"*/{session_hash}{SUFFIX}")]

    def erase_folder(self, folder: str) -> int:
        """Erase every file of one per-user folder, then the folder."""
        base = self.root / folder
        count = 0
        for path in base.glob(f"*{SUFFIX}"):
            count += self.erase(self._key_of(path))
        for tmp in base.glob(".*.tmp"):
            secure_unlink(tmp, missing_ok=True)
        try:
            base.rmdir()
        except OSError:
            pass
        return count

    def drain_trash(self) -> int:
        """Overwrite and unlink every file retired by :meth:`pop`."""
        if not self.trash.exists():
            return 0
        return sum(secure_unlink(p, missing_ok=True) for p in list(self.trash.iterdir()))


def _read(path: Path) -> bytearray:
    """The whole file in one writable buffer (one copy from the page cache)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        buf = bytearray(size)
        view, done = memoryview(buf), 0
        while done < size:
            n = f.readinto(view[done:])
            if not n:
                raise OSError(f"{path.name}: file shrank while being read")
            done += n
    return buf


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
    """A backend + its eviction order + its byte budget (``None``: unbounded) + counters."""

    backend: Any
    budget: int | None
    policy: LRUPolicy = field(default_factory=LRUPolicy)
    counters: TierCounters = field(default_factory=TierCounters)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def name(self) -> str:
        return self.backend.name

    def bytes(self) -> int:
        return self.backend.bytes()

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
