"""Embedded Chroma shared by several processes on one directory: one client per process, kept current cheaply.

Embedded Chroma keeps each collection's HNSW index in the memory of the process that loaded it: a vector another
process adds reaches Chroma's SQLite (``get``/``count`` see it) but never this process's index, so ``query`` misses
it, and a process that *writes* with a stale index persists it over the newer one (vectors vanish from search).

So (docs/backends.md, "Several processes on one embedded directory"):

* every write holds an exclusive ``flock`` on the directory, appends what it did to a **journal**
  (``.agentmem-journal``: ids, and for an upsert the vectors themselves) and bumps a generation counter
  (``.agentmem-generation``: generation, journal length, journal base); reads hold the lock shared;
* a reader that finds the generation moved does **not** re-open its client: it reads the new journal records into
  an *overlay* per collection (vectors added, ids deleted by others). :class:`~agentmem.backends.chroma.index.ChromaVectorIndex`
  then scores the overlay's vectors exactly beside the stale index and drops the ids it shadows, so a read sees
  every write committed before it, at the cost of a file read;
* an erasure (``erase_residue``) overwrites the journal and starts it over, so erased vectors and ids do not stay
  in it; every other process then re-opens its client once;
* a **write** to a collection this client loaded and another process changed since re-opens the client first
  (the index it writes to must hold every earlier write); so does a reader whose overlay grew past
  ``_OVERLAY_LIMIT`` vectors, or one that fell behind a journal rotation. A collection this client never loaded
  is read fresh from disk on first use, so its overlay is dropped then.

Example:
    >>> import tempfile
    >>> h = ChromaHandle.acquire(tempfile.mkdtemp())
    >>> with h.reading() as client:
    ...     client is not None
    True
    >>> h.release()
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from agentmem.security.erase import secure_unlink

__all__ = ["ChromaHandle", "Overlay"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_OVERLAY_LIMIT = 4096  # vectors of others' writes a reader scores exactly before it re-opens its client instead
_ROTATE_BYTES = 16 << 20  # a writer starts the journal over past this size (behind readers then re-open)


@dataclass
class Overlay:
    """Another process's changes to one collection since this process loaded it: vectors by id, ids deleted."""

    added: dict[str, np.ndarray] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.added or self.deleted)


class ChromaHandle:
    """One embedded Chroma client per store directory and process (see the module docstring)."""

    _registry: dict[str, ChromaHandle] = {}
    _registry_lock = threading.Lock()

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.RLock()  # Chroma's embedded client is not documented as thread-safe
        self.users = 0
        self.client: Any = None
        self.collections: dict[str, Any] = {}
        self.seen = -1  # the generation this client is current to (index + overlays)
        self.reopens = 0
        self.stale_reads = 0  # reads Chroma failed on a stale index, retried after a re-open (retry_stale)
        self.overlays: dict[str, Overlay] = {}
        self.deleted_everywhere: set[str] = set()  # ids a recovery delete removed from every collection
        self.loaded: set[str] = set()  # collections whose index this client has in memory
        self._dir = Path(path)
        self._gen_path = self._dir / ".agentmem-generation"
        self._lock_path = self._dir / ".agentmem-write.lock"
        self._journal_path = self._dir / ".agentmem-journal"
        self._pos = 0  # journal bytes applied, counted from the journal of base ``self._base``
        self._base = -1
        self._records: list[dict[str, Any]] = []  # the journal records of the write in progress
        self._held = 0  # file-lock depth of the thread holding self.lock (never re-flock: it would deadlock)

    # -- lifetime -----------------------------------------------------------------------------------------
    @classmethod
    def acquire(cls, path: str) -> ChromaHandle:
        """The process's handle on ``path`` (one per directory), with one more user."""
        with cls._registry_lock:
            handle = cls._registry.get(path)
            if handle is None:
                handle = cls._registry[path] = ChromaHandle(path)
            handle.users += 1
            return handle

    def release(self) -> None:
        """Drop one user; the last one closes the client."""
        with ChromaHandle._registry_lock:
            self.users -= 1
            if self.users > 0:
                return
            ChromaHandle._registry.pop(self.path, None)
        with self.lock:
            self._close_client()

    def _close_client(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
        self.client = None
        self.collections = {}

    def _reopen(self, state: tuple[int, int, int]) -> None:
        import chromadb
        from chromadb.config import Settings

        self._close_client()
        self.client = chromadb.PersistentClient(
            path=self.path, settings=Settings(anonymized_telemetry=False, allow_reset=False))
        self.seen, self._pos, self._base = state
        self.overlays, self.deleted_everywhere, self.loaded = {}, set(), set()
        self.reopens += 1

    # -- the shared state files -----------------------------------------------------------------------------
    def _state(self) -> tuple[int, int, int]:
        """(generation, journal length, journal base: the generation its first record follows)."""
        try:
            data = self._gen_path.read_bytes()
        except FileNotFoundError:
            return 0, 0, 0
        gen = int.from_bytes(data[:8], "little") if len(data) >= 8 else 0
        if len(data) < 24:  # a counter without a journal (older agentmem): everyone behind it re-opens
            return gen, 0, gen
        return gen, int.from_bytes(data[8:16], "little"), int.from_bytes(data[16:24], "little")

    def _write_state(self, gen: int, length: int, base: int) -> None:
        tmp = self._gen_path.with_name(f"{self._gen_path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(b"".join(x.to_bytes(8, "little") for x in (gen, length, base)))
        os.replace(tmp, self._gen_path)

    def generation(self) -> int:
        """The directory's write generation (bumped by every write of any process)."""
        return self._state()[0]

    # -- keeping current ------------------------------------------------------------------------------------
    def fresh(self) -> Any:
        """The client, current to the last committed write: others' journal records applied as overlays, or
        re-opened when that is not possible or no longer worth it (caller holds ``lock``, and the directory's
        flock except while opening)."""
        state = self._state()
        gen, length, base = state
        if self.client is None or self.seen < base or gen < self.seen:
            self._reopen(state)
            return self.client
        if gen == self.seen:
            return self.client
        if base != self._base:  # the journal was started over at our generation: read it from its start
            self._base, self._pos = base, 0
        for rec in self._read_journal(self._pos, length):
            if rec["g"] > self.seen:
                self._apply(rec)
        self.seen, self._pos = gen, length
        if sum(len(o.added) + len(o.deleted) for o in self.overlays.values()) > _OVERLAY_LIMIT:
            self._reopen(state)
        return self.client

    def _read_journal(self, start: int, end: int) -> Iterator[dict[str, Any]]:
        if end <= start:
            return
        with open(self._journal_path, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
        for line in data.splitlines():
            yield json.loads(line)

    def _apply(self, rec: dict[str, Any]) -> None:
        name, ids = rec.get("c"), rec.get("ids", [])
        if name is None:  # a recovery delete in every collection
            self.deleted_everywhere.update(ids)
            for ov in self.overlays.values():
                for i in ids:
                    ov.added.pop(i, None)
            return
        ov = self.overlays.setdefault(name, Overlay())
        if rec["op"] == "a":
            vecs = np.frombuffer(base64.b64decode(rec["v"]), dtype=np.float32).reshape(len(ids), -1)
            for i, v in zip(ids, vecs):
                ov.added[i] = v
                ov.deleted.discard(i)
                self.deleted_everywhere.discard(i)
        else:
            for i in ids:
                ov.added.pop(i, None)
                ov.deleted.add(i)

    def overlay(self, name: str) -> Overlay:
        """What others changed in collection ``name`` that this client's index does not show (caller holds lock)."""
        ov = self.overlays.get(name) or Overlay()
        if self.deleted_everywhere:
            ov = Overlay(ov.added, ov.deleted | self.deleted_everywhere)
        return ov

    def retry_stale(self, read: Callable[[], T]) -> T:
        """Run ``read``; if Chroma fails it on an id its in-memory index lacks (a staleness the journal did not
        describe), re-open the client and run it once more. Counted in ``stale_reads``."""
        try:
            return read()
        except Exception as exc:
            if "Error finding id" not in str(exc) or self._held:  # never re-open under a write in progress
                raise
            log.warning("embedded Chroma: a read met a stale index (%s); re-opening the client", exc)
            with self.lock:
                self.stale_reads += 1
                self._close_client()  # the next fresh() opens a new client
            return read()

    def mark_loaded(self, name: str) -> None:
        """A collection is being used by this client for the first time: its index is read from disk now, with
        every write so far, so what the overlay held for it is in it (caller holds lock and flock)."""
        if name not in self.loaded:
            self.loaded.add(name)
            self.overlays.pop(name, None)

    def record(self, op: str, name: str | None, ids: list[str], vectors: np.ndarray | None = None) -> None:
        """Journal one change of the write in progress: ``"a"`` (upsert, with vectors) or ``"d"`` (delete; name
        None: in every collection)."""
        rec: dict[str, Any] = {"op": op, "c": name, "ids": list(ids)}
        if vectors is not None:
            rec["v"] = base64.b64encode(np.ascontiguousarray(vectors, dtype=np.float32).tobytes()).decode()
        self._records.append(rec)

    def _stale(self, names: Iterable[str] | None) -> bool:
        """Whether a write to ``names`` (None: any collection) would go to an index that misses others' writes."""
        if self.deleted_everywhere:
            return True
        wanted = self.loaded if names is None else self.loaded.intersection(names)
        return any(self.overlays.get(n) for n in wanted)

    # -- locking --------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def writing(self, names: Iterable[str] | None = None, *, everyone_reopens: bool = False) -> Iterator[Any]:
        """Hold the directory's write lock with a client whose index of ``names`` (None: every collection) holds
        every earlier write; journal what the caller :meth:`record`\\ s and bump the generation afterwards.

        ``everyone_reopens``: this write changes what no journal record can describe (a crash recovery renames
        collections), or erases (the journal, which holds vectors and ids, is overwritten and started over):
        every other process re-opens its client before its next call.
        """
        names = None if names is None else list(names)
        self._dir.mkdir(parents=True, exist_ok=True)
        with self.lock, open(self._lock_path, "a+b") as lock_file:
            _flock(lock_file)
            self._held += 1
            try:
                state = self._state()
                gen, length, base = state
                client = self.fresh()  # records past ``length`` are a crashed writer's: never read, written over
                if self._stale(names):
                    self._reopen(state)
                    client = self.client
                if length > _ROTATE_BYTES:
                    length, base = 0, gen
                self._records = []
                try:
                    yield client
                finally:
                    self._held -= 1
                    self._commit(gen + 1, length, gen + 1 if everyone_reopens else base)
            finally:
                _funlock(lock_file)

    def _commit(self, gen: int, length: int, base: int) -> None:
        records, self._records = self._records, []
        data = b"".join(json.dumps({"g": gen, **r}, separators=(",", ":")).encode() + b"\n" for r in records)
        if base == gen:  # the journal starts over (nobody behind this generation can use it); an erasure's
            # vectors and ids must not stay in it: its bytes are overwritten (security/erase.py)
            data, length = b"", 0
            secure_unlink(self._journal_path, missing_ok=True)
        with open(self._journal_path, "r+b" if self._journal_path.exists() else "wb") as j:
            j.truncate(length)
            j.seek(length)
            j.write(data)
        self._write_state(gen, length + len(data), base)
        self.seen, self._pos, self._base = gen, length + len(data), base

    @contextlib.contextmanager
    def reading(self) -> Iterator[Any]:
        """Hold the directory's lock shared with a current client: a read never sees another process's write or
        erasure rebuild half done (a rebuilt collection gets a new id under the same name)."""
        with self.lock:
            if self._held:  # this thread already holds the lock exclusively (a read inside a write)
                yield self.client
                return
            self._dir.mkdir(parents=True, exist_ok=True)
            with open(self._lock_path, "a+b") as lock_file:
                _flock(lock_file, shared=True)
                self._held += 1
                try:
                    yield self.fresh()
                finally:
                    self._held -= 1
                    _funlock(lock_file)


def _flock(f: Any, *, shared: bool = False) -> None:
    try:
        import fcntl
    except ImportError:  # Windows: one process per store directory
        return
    fcntl.flock(f.fileno(), fcntl.LOCK_SH if shared else fcntl.LOCK_EX)


def _funlock(f: Any) -> None:
    try:
        import fcntl
    except ImportError:
        return
    fcntl.flock(f.fileno(), fcntl.LOCK_UN)
