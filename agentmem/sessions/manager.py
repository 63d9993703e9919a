"""SessionManager: the registry of live conversations and the tiers their working KV moves between.

* **hot** (model device) → **warm** (CPU) → **cold** (disk): when a tier's byte budget would be exceeded, its
  least recently used sessions move one tier down (never one that is answering right now). A background worker
  offloads sessions idle longer than ``session_idle_seconds`` to disk and erases those unused for longer than
  ``session_ttl_seconds``; it only ever *tries* a session's lock, so it never makes a ``send`` wait.
* A returning session is restored to hot transparently by its next ``send`` (or by :meth:`restore`).
* Validity: the KV is tagged with the model fingerprint, the preamble digest, the knowledge-base version and an
  invalidation epoch; on any mismatch it is dropped and re-encoded from the session's stored turns.

Locks: each session has its own (a second ``send`` on one session waits its turn); the manager lock only guards
bookkeeping and is never held across a model call or a disk write; the engine's lock serialises model calls.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentmem.backends.file_sessions import FileSessionStore
from agentmem.errors import BlobCorruptedError, EncryptionError, InvalidInputError, NotFoundError
from agentmem.kv.mount import Workspace
from agentmem.ports.sessions import SessionTierStore, put
from agentmem.security.sealer import Sealer
from agentmem.sessions.holds import WorkerHolds
from agentmem.sessions.session import Session
from agentmem.sessions.shared import Leases, load_epoch, new_epoch, worker_id
from agentmem.sessions.state import PackedSessionKV, SessionKV, Transcript, dump_session, load_session
from agentmem.sessions.tiers import MemoryBackend, Tier
from agentmem.sessions.turn import EngineContext

__all__ = ["SessionManager"]

log = logging.getLogger(__name__)
_EPOCH_FILE = "epoch"
_SLACK_TOKENS = 128  # spare room a restored session gets for its next turn


class SessionManager:
    """Owns every session's working KV across the hot / warm / cold tiers (see the module docstring).

    Args:
        engine: returns the loaded :class:`~agentmem.kv.KVEngine` (called lazily, on first use).
        retrieve: ``(query, user_id, k, *, strict=False) -> [mountable memory]``, most relevant first.
        remember_turn: ``(user_id, session_id, role, text) -> MemoryRecord``: stores a turn long-term.
        scan: secret redaction applied to user text before it is encoded.
        kb_version: returns the current knowledge-base version.
        root: the epoch file's directory, and the cold tier's when ``cold_store`` is None.
        config: a :class:`~agentmem.config.MemoryConfig`. cipher: encrypts what goes to the cold tier.
        cold_store: the cold tier (a :class:`~agentmem.ports.SessionTierStore`; default: files under ``root``).
            The manager calls only the protocol's methods on it, so a shared one (Redis) serves several workers.
        history_kv: ``"clean"`` (default) keeps the history's KV exactly as if encoded right after the preamble:
            a turn that mounted memories is re-encoded once without them after its reply. ``"as_generated"``
            keeps the KV the turn was generated with (it attended to that turn's memories), shifted back.
        start_worker: run the background idle/TTL worker (tests may call :meth:`sweep` by hand instead).
    """

    def __init__(
        self,
        *,
        engine: Callable[[], Any],
        retrieve: Callable[..., list[Any]],
        remember_turn: Callable[[str, str, str, str], Any],
        scan: Callable[[str], str],
        kb_version: Callable[[], str | None],
        root: str | Path,
        config: Any,
        cipher: Any = None,
        history_kv: str = "clean",
        start_worker: bool = True,
        sweep_interval: float | None = None,
        cold_store: SessionTierStore | None = None,
    ) -> None:
        if history_kv not in ("clean", "as_generated"):
            raise InvalidInputError("history_kv must be 'clean' or 'as_generated'")
        self._engine_fn = engine
        self._retrieve = retrieve
        self._remember_turn = remember_turn
        self._scan = scan
        self._kb_version = kb_version
        self.root = Path(root)
        self.config = config
        self._cipher = cipher
        self._sealer = Sealer(cipher)
        self.history_kv = history_kv
        self._lock = threading.RLock()
        self._ctx_lock = threading.Lock()
        self._ctx: EngineContext | None = None
        self._sessions: dict[tuple[str, str], Session] = {}  # (user_id, session_id): ids are per user
        self._by_key: dict[str, Session] = {}
        self.hot = Tier(MemoryBackend("hot", device=None), config.session_hot_bytes)
        self.warm = Tier(MemoryBackend("warm", device="cpu"), config.session_warm_bytes)
        self.store: SessionTierStore = cold_store if cold_store is not None else FileSessionStore(self.root)
        self.cold = Tier(self.store, None)
        self._workspace = Workspace()
        self._workspace_peak = 0
        self.counts: Counter[str] = Counter()
        self.owner = worker_id()  # whose leases these are (several managers may share one cold store)
        self.leases = Leases(self.store, self.owner, ttl_s=config.session_lease_seconds,
                             wait_s=config.session_lease_wait_seconds)
        load_epoch(self.store, self.root / _EPOCH_FILE)
        self._closed = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._write_behind: set[str] = set()
        self._holds = WorkerHolds()  # sessions the worker holds right now: a turn making room waits for those
        ttl = config.session_ttl_seconds
        self._interval = sweep_interval or max(0.05, min(30.0, config.session_idle_seconds / 4,
                                                         (ttl / 4) if ttl else 30.0,
                                                         config.session_lease_seconds / 3))
        self._worker: threading.Thread | None = None
        if start_worker:
            self._worker = threading.Thread(target=self._run_worker, name="agentmem-sessions", daemon=True)
            self._worker.start()

    # -- public API -------------------------------------------------------------------------------------
    def open(self, session_id: str, *, user_id: str) -> Session:
        """The session with that id (created if new; restored lazily from disk on its first ``send``)."""
        self._check_open()
        if not session_id or not user_id:
            raise InvalidInputError("open needs a session_id and a user_id")
        with self._lock:
            s = self._sessions.get((user_id, session_id))
            if s is not None:
                return s
            key = self._key_for(user_id, session_id)
            s = Session(self, session_id, user_id, key)
            stamp = self.store.last_used(key)
            if stamp is not None:
                s.slot.tier = "cold"
                s.slot.last_used = stamp
            self._register(s)
            return s

    def get(self, session_id: str, *, user_id: str | None = None) -> Session:
        """An open session; raises :class:`NotFoundError` if none is registered under that id.

        Session ids are per user: without ``user_id`` the id must name one user's session only.

        Example:
            >>> mgr.get("s1", user_id="u1")                                            # doctest: +SKIP
        """
        with self._lock:
            if user_id is not None:
                found = [s] if (s := self._sessions.get((user_id, session_id))) is not None else []
            else:
                found = [s for (_, sid), s in self._sessions.items() if sid == session_id]
        if not found:
            raise NotFoundError(f"no open session {session_id!r}")
        if len(found) > 1:
            raise InvalidInputError(f"several users have a session {session_id!r}: pass user_id")
        return found[0]

    def list(self, *, user_id: str | None = None) -> list[str]:
        """Ids of registered sessions (optionally of one user)."""
        with self._lock:
            return [sid for (uid, sid) in self._sessions if user_id is None or uid == user_id]

    def offload(self, session_id: str, to: str = "disk", *, user_id: str | None = None) -> str | None:
        """Move a session's KV down to ``"warm"`` or ``"disk"``/``"cold"`` now (waits for an in-flight send).

        Returns the tier it is in afterwards. Moving up is :meth:`restore`.
        """
        target = {"warm": "warm", "cpu": "warm", "disk": "cold", "cold": "cold"}.get(to)
        if target is None:
            raise InvalidInputError("offload to 'warm' or 'disk'")
        s = self.get(session_id, user_id=user_id)
        with s._lock:
            if s.slot.tier == "hot":
                self._move_down(s, self.hot, to_cold=target == "cold")
            if s.slot.tier == "warm" and target == "cold":
                self._move_down(s, self.warm, to_cold=True)
            return s.slot.tier

    def restore(self, session_id: str, *, user_id: str | None = None) -> dict[str, Any]:
        """Bring a session's KV back to the hot tier now.

        Returns ``{"from": tier, "seconds": s, "make_room_seconds": s}``: the restore itself, and the time spent first
        moving other sessions down to make room for it.
        """
        s = self.get(session_id, user_id=user_id)
        ctx = self.context()
        with s._lock:
            self._serve(s)
            source, seconds, evict = self._bring_hot(s, ctx)
            self._validate(s, ctx)
            s.slot.last_used = time.time()
            with self._lock:
                if self.hot.backend.contains(s._key):
                    self.hot.policy.touch(s._key)
        self._fit(self.hot)
        return {"from": source, "seconds": seconds, "make_room_seconds": evict}

    def end(self, session_id: str, *, user_id: str | None = None) -> bool:
        """Erase a session's working KV and stored turns from every tier now (its long-term memories stay).

        With ``user_id``, only that user's session of this id; without, every user's session of this id.

        Example:
            >>> mgr.end("s1", user_id="u1")                                            # doctest: +SKIP
            True
        """
        with self._lock:
            mine = [s for (uid, sid), s in self._sessions.items()
                    if sid == session_id and (user_id is None or uid == user_id)]
        n = 0
        for s in mine:
            with s._lock:
                n += self._erase(s)
        if user_id is not None:  # sessions no process has opened since a restart
            n += self.store.delete(self._key_for(user_id, session_id))
        else:
            name = self._hash("s", session_id)
            n += sum(self.store.delete(k) for k in self.store.keys() if k.split("/", 1)[1] == name)
        self.store.purge()
        if n:
            self._count("ended", 1)
        return n > 0

    def end_user(self, user_id: str) -> int:
        """Erase every session of ``user_id`` from every tier; returns how many were erased."""
        with self._lock:
            mine = [s for s in self._sessions.values() if s.user_id == user_id]
        n = 0
        for s in mine:
            with s._lock:
                n += self._erase(s)
        n += sum(self.store.delete(k) for k in self.store.keys(self._hash("u", user_id)))
        self.store.purge()
        self._count("ended", n)
        return n

    def invalidate(self, reason: str = "invalidated") -> int:
        """Drop every session's cached KV (rebuilt from its turns on next use); returns how many were dropped.

        A new epoch is written to the cold store, so KV there is never mounted after this either, by any worker.
        """
        new_epoch(self.store)
        with self._lock:
            sessions = list(self._sessions.values())
        dropped = 0
        for s in sessions:
            if not s._lock.acquire(blocking=False):
                continue  # busy: its next use sees the new epoch
            try:
                if not s.slot.busy and self._drop_kv(s):
                    dropped += 1
            finally:
                s._lock.release()
        self._count("invalidations", 1)
        log.info("session KV invalidated (%s): %d sessions dropped from memory", reason, dropped)
        return dropped

    def sweep(self) -> dict[str, int]:
        """One pass of the background worker: offload idle sessions to disk, erase expired ones."""
        now = time.time()
        idle_s, ttl = self.config.session_idle_seconds, self.config.session_ttl_seconds
        done = Counter()
        with self._lock:
            sessions = list(self._sessions.values())
        for s in sessions:
            with self._holds.hold(s) as held:
                if not held:
                    continue
                try:
                    if s.slot.busy or not self._keep_lease(s, early=True):
                        continue
                    age = now - s.slot.last_used
                    if ttl is not None and age > ttl:
                        if self._erase(s):
                            done["expired"] += 1
                        continue
                    idle = age > idle_s and s.slot.tier in ("hot", "warm")
                except Exception:
                    log.exception("session sweep failed for one session")
                    continue
            if idle:
                try:
                    moved = self._offload_idle(s)
                    done["idle_offloads"] += moved
                    self._count("idle_offloads", moved)  # now, not at the sweep's end (just after the tier change)
                except Exception:
                    log.exception("idle offload failed for one session")
        if ttl is not None:  # files of sessions no process has opened since a restart
            with self._lock:
                known = set(self._by_key)
            for key in self.store.keys():
                stamp = self.store.last_used(key)
                if key not in known and stamp is not None and now - stamp > ttl and self.store.delete(key):
                    done["expired"] += 1
        self.store.purge()
        with self._lock:
            self.counts.update({k: v for k, v in done.items() if k != "idle_offloads"})
        return dict(done)

    def stats(self) -> dict[str, Any]:
        """Per tier: sessions, bytes, budget, peak, hits, misses, offloads, restores, restore latency."""
        tiers = {t.name: t.stats() for t in (self.hot, self.warm, self.cold)}
        with self._lock:
            registered = len(self._sessions)
        return {
            **tiers,
            "restore_latency_s": {"warm": tiers["warm"]["restore_latency_s"], "cold": tiers["cold"]["restore_latency_s"]},
            "sessions": registered,
            "workspace_bytes": self._workspace_peak,
            "history_kv": self.history_kv,
            **{k: self.counts.get(k, 0) for k in (
                "turns", "rebuilds", "invalidations", "invalidated_sessions", "evicted_turns", "idle_offloads",
                "expired", "ended", "resets", "corrupted", "clean_copies", "clean_demotions", "topic_switches",
            )},
        }

    def close(self) -> None:
        """Stop the worker and write every in-memory session to disk (they are restored after a restart)."""
        if self._closed:
            return
        self._stop.set()
        self._wake.set()
        if self._worker is not None:
            self._worker.join(timeout=10)
        with self._lock:
            sessions = list(self._sessions.values())
        for s in sessions:
            with s._lock:
                try:
                    if s.slot.tier == "hot":
                        self._move_down(s, self.hot, to_cold=True)
                    elif s.slot.tier == "warm":
                        self._move_down(s, self.warm, to_cold=True)
                except Exception:
                    log.exception("could not write a session to disk at close")
        self.store.purge()
        self._workspace.release()
        self._closed = True

    def __enter__(self) -> SessionManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- engine -----------------------------------------------------------------------------------------
    def context(self) -> EngineContext:
        """The loaded engine's session context (loads the model on first use)."""
        with self._ctx_lock:
            if self._ctx is None:
                self._ctx = EngineContext.from_engine(self._engine_fn())
                self.hot.backend.device = self._ctx.device
            return self._ctx

    def _limit(self, ctx: EngineContext) -> int:
        """Most conversation tokens (history + new message + reply) a session may hold."""
        return max(1, min(int(self.config.session_max_tokens), ctx.max_positions - ctx.margin - ctx.preamble_len))

    # -- registry ---------------------------------------------------------------------------------------
    def _hash(self, kind: str, value: str) -> str:
        secret = self._cipher.index_key if self._cipher is not None else b"agentmem-sessions-v1"
        return hmac.new(secret, f"{kind}:{value}".encode(), hashlib.sha256).hexdigest()[:32]

    def _key_for(self, user_id: str, session_id: str) -> str:
        return f"{self._hash('u', user_id)}/{self._hash('s', session_id)}"

    def _register(self, s: Session) -> None:
        with self._lock:
            current = self._sessions.get((s.user_id, s.session_id))
            if current is not None and current is not s:
                raise InvalidInputError(
                    f"session {s.session_id!r} was ended and reopened through another handle; use that one"
                )
            self._sessions[(s.user_id, s.session_id)] = s
            self._by_key[s._key] = s

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def _bump(self, tier: Tier, field: str) -> None:
        with self._lock:
            setattr(tier.counters, field, getattr(tier.counters, field) + 1)

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidInputError("this session manager is closed")

    # -- tier moves (caller holds the session's lock) ---------------------------------------------------
    def _dump(self, state: Transcript, kv: SessionKV | None) -> bytes:
        return dump_session(state, kv, codec=self.config.session_kv_codec)  # cold files: maybe an integer codec

    def _seal(self, key: str, data: bytes) -> bytes:
        return self._sealer.seal_session(key, data)

    def _unseal(self, key: str, blob: bytes) -> bytes:
        return self._sealer.open_session(key, blob)

    def _write_cold(self, s: Session, kv: SessionKV | None) -> None:
        assert s.slot.state is not None
        blob = self._seal(s._key, self._dump(s.slot.state, kv))
        if not self._keep_lease(s):
            return  # another worker serves it now: our copy was dropped, not written over theirs
        put(self.store, s._key, blob, last_used=s.slot.last_used)
        s.slot.disk_version = s.slot.version
        s.slot.state = None  # the transcript now lives in the file
        s.slot.tier = "cold"
        self.cold.note_bytes()
        self._release(s)

    def _move_down(self, s: Session, src: Tier, *, to_cold: bool) -> None:
        """Move ``s`` from ``src`` (hot or warm) to warm, or to cold when ``to_cold`` or warm cannot take it."""
        kv = src.backend.pop(s._key)
        with self._lock:
            src.policy.remove(s._key)
            src.counters.offloads += 1
        if kv is None or s.slot.state is None:
            s.slot.tier = None
            return
        warm_kv = self._warm_copy(kv) if src is self.hot and not to_cold else None
        if warm_kv is not None:
            self._fit(self.warm, incoming=warm_kv.nbytes, exclude=s)
            self.warm.backend.put(s._key, warm_kv)
            s.slot.tier = "warm"
            with self._lock:
                self.warm.policy.touch(s._key)
                if s.slot.state.turns and s.slot.disk_version != s.slot.version:
                    self._write_behind.add(s._key)  # the worker writes a clean disk copy ahead of need
            self.warm.note_bytes()
            self._wake.set()
            return
        if not s.slot.state.turns:  # an empty conversation: nothing worth a file
            s.slot.state, s.slot.tier = None, None
            self._release(s)
            return
        if s.slot.disk_version == s.slot.version and self.store.last_used(s._key) is not None:
            s.slot.state, s.slot.tier = None, "cold"  # its clean copy is already on disk: nothing to write
            with self._lock:
                self.counts["clean_demotions"] += 1
            self._release(s)
            return
        self._write_cold(s, kv)

    def _offload_idle(self, s: Session) -> bool:
        """Move an idle session to disk without holding its lock across the serialisation and the write.

        Snapshot under the lock, write a staged file without it, then publish the file and drop the in-memory
        KV only if nothing touched the session meanwhile (same version and tier); otherwise discard the file.
        A ``send`` that arrives during the write therefore never waits for the disk.
        """
        with self._holds.hold(s) as held:
            if not held or s.slot.busy or s.slot.tier not in ("hot", "warm") or s.slot.state is None:
                return False
            tier = self.hot if s.slot.tier == "hot" else self.warm
            kv = tier.backend.get(s._key)
            if kv is None:
                return False
            if not s.slot.state.turns:  # an empty conversation: nothing worth a file
                self._drop_kv(s)
                s.slot.state = None
                self._release(s)
                return True
            if s.slot.disk_version == s.slot.version and self.store.last_used(s._key) is not None:
                self._move_down(s, tier, to_cold=True)  # clean copy on disk: just drop the memory copy
                return True
            version, tier_name, last_used = s.slot.version, s.slot.tier, s.slot.last_used
            state = copy.deepcopy(s.slot.state)
        staged = self.store.stage(s._key, self._seal(s._key, self._dump(state, kv)), last_used=last_used)
        published = False
        with self._holds.hold(s) as held:
            if held and not s.slot.busy and s.slot.version == version and s.slot.tier == tier_name and self._keep_lease(s):
                self.store.publish(staged)
                published = True
                s.slot.disk_version = version
                tier.backend.pop(s._key)
                with self._lock:
                    tier.policy.remove(s._key)
                    tier.counters.offloads += 1
                s.slot.state, s.slot.tier = None, "cold"
                self.cold.note_bytes()
                self._release(s)
        if not published:
            self.store.discard(staged)
        return published

    def _queue_likely_victims(self) -> None:
        """Write-behind watermark: queue clean disk copies of the sessions each tier would move down next.

        For every tier above half its budget, its least recently used sessions covering the excess get a copy
        written in the background; moving one of them to disk later is then free (no write on a ``send``'s path).
        """
        queued = False
        with self._lock:
            for tier in (self.hot, self.warm):
                if not tier.budget:
                    continue
                excess = tier.bytes() - tier.budget // 2
                for key in tier.policy.victims():
                    if excess <= 0:
                        break
                    s = self._by_key.get(key)
                    if s is None or s.slot.busy:
                        continue
                    excess -= tier.backend.size(key)
                    st = s.slot.state
                    if s.slot.disk_version != s.slot.version and st is not None and st.turns:
                        self._write_behind.add(key)
                        queued = True
        if queued:
            self._wake.set()

    def _write_clean_copy(self, s: Session) -> bool | None:
        """Write-behind: put a current copy of a hot or warm session on disk, keeping it in memory; lock-free write.

        True: written. False: not needed (or the session changed meanwhile). None: the session was busy; retry.
        """
        with self._holds.hold(s) as held:
            if not held:
                return None
            if s.slot.busy or s.slot.tier not in ("hot", "warm") or s.slot.state is None or s.slot.disk_version == s.slot.version:
                return False
            tier_name = s.slot.tier
            kv = (self.hot if tier_name == "hot" else self.warm).backend.get(s._key)
            if kv is None:
                return False
            version, last_used = s.slot.version, s.slot.last_used
            state = copy.deepcopy(s.slot.state)
        staged = self.store.stage(s._key, self._seal(s._key, self._dump(state, kv)), last_used=last_used)
        with self._holds.hold(s) as held:
            if held and not s.slot.busy and s.slot.version == version and s.slot.tier in ("hot", "warm") and self._keep_lease(s):
                self.store.publish(staged)
                s.slot.disk_version = version
                self.cold.note_bytes()
                return True
        self.store.discard(staged)
        return False

    def _drain_write_behind(self) -> int:
        with self._lock:
            keys, self._write_behind = list(self._write_behind), set()
            sessions = [self._by_key.get(k) for k in keys]
        done = 0
        for key, s in zip(keys, sessions):
            if s is not None and not self._stop.is_set():
                try:
                    result = self._write_clean_copy(s)
                except Exception:
                    log.exception("write-behind failed for one session")
                    continue
                if result is None:
                    with self._lock:
                        self._write_behind.add(key)  # busy right now: try again shortly
                done += bool(result)
        if done:
            self._count("clean_copies", done)
        return done

    def _warm_copy(self, kv: SessionKV) -> SessionKV | PackedSessionKV | None:
        """``kv`` as the warm tier keeps it (compacted; codes if ``session_warm_kv_codec``), None if it cannot fit."""
        budget = self.warm.budget or 0
        if self.config.session_warm_kv_codec is None:
            return kv.moved("cpu") if kv.length * self._bytes_per_token(kv) <= budget else None
        packed = PackedSessionKV.pack(kv, self.config.session_warm_kv_codec)  # (codec parts: helper compression)
        return packed if packed.nbytes <= budget else None

    @staticmethod
    def _bytes_per_token(kv: SessionKV | PackedSessionKV) -> int:
        """Bytes per token of ``kv`` once hot (a warm copy in codes is dequantized to the model's dtype)."""
        if isinstance(kv, PackedSessionKV):
            return kv.float_bytes_per_token
        return kv.nbytes // max(1, kv.capacity)

    def _bring_hot(
        self, s: Session, ctx: EngineContext, extra: int = _SLACK_TOKENS
    ) -> tuple[str | None, float, float]:
        """Restore ``s``'s KV (and transcript) to the hot tier; count hits and misses on the way down.

        Returns the tier it came from, the seconds spent restoring it (reading, parsing, copying to the device)
        and the seconds spent first moving other sessions down to make room.
        """
        if s.slot.tier == "hot" and self.hot.backend.contains(s._key):
            self._bump(self.hot, "hits")
            if s.slot.disk_version is not None:  # its write-behind copy is about to go stale
                self.store.delete(s._key)
                s.slot.disk_version = None
            return None, 0.0, 0.0
        t0 = time.perf_counter()
        self._bump(self.hot, "misses")
        source: Tier | None = None
        kv: SessionKV | None = None
        if s.slot.tier == "warm":
            self._bump(self.warm, "hits")
            kv = self.warm.backend.pop(s._key)
            with self._lock:
                self.warm.policy.remove(s._key)
                self._write_behind.discard(s._key)
            if s.slot.disk_version is not None:
                self.store.delete(s._key)  # a file exists only while it is current
            source = self.warm
        else:
            self._bump(self.warm, "misses")
            if s.slot.tier == "cold":
                self._bump(self.cold, "hits")
                source = self.cold
                kv = self._read_cold(s, ctx)
            else:
                self._bump(self.cold, "misses")
        if s.slot.state is None:
            s.slot.state = Transcript(s.session_id, s.user_id)
        s.slot.tier = None
        s.slot.disk_version = None
        if kv is None:
            return (source.name if source else None), time.perf_counter() - t0, 0.0
        capacity = kv.length + extra
        t_fit = time.perf_counter()
        self._fit(self.hot, incoming=capacity * self._bytes_per_token(kv), exclude=s)
        evict = time.perf_counter() - t_fit
        kv = kv.moved(ctx.device, capacity=capacity)
        self.hot.backend.put(s._key, kv)
        s.slot.tier = "hot"
        with self._lock:
            self.hot.policy.touch(s._key)
        self.hot.note_bytes()
        seconds = time.perf_counter() - t0 - evict
        assert source is not None
        with self._lock:
            source.counters.restores += 1
            source.counters.restore_seconds.append(seconds)
        return source.name, seconds, evict

    def _read_cold(self, s: Session, ctx: EngineContext) -> SessionKV | None:
        blob = self.store.get(s._key)
        if blob is None:
            return None
        self.store.delete(s._key)  # a file exists only while it is current (purged later, off this path)
        try:
            transcript, kv = load_session(self._unseal(s._key, blob))
            if transcript.session_id != s.session_id or transcript.user_id != s.user_id:
                raise BlobCorruptedError("session file belongs to another session")
        except (BlobCorruptedError, EncryptionError) as exc:
            log.warning("session file %s unusable (%s); starting the conversation over", s._key, exc)
            self._count("corrupted", 1)
            s.slot.state = None
            return None
        s.slot.state = transcript
        key = transcript.key or {}
        if kv is not None and (
            key.get("fingerprint") != ctx.fingerprint
            or tuple(kv.keys.shape[:3]) != tuple(ctx.pre_k.shape[:3])
            or kv.keys.shape[4] != ctx.pre_k.shape[4]
            or kv.keys.dtype != ctx.dtype
        ):
            kv = None  # made by another model: rebuilt from the turns by _validate / the next send
        return kv

    def _validate(self, s: Session, ctx: EngineContext) -> str | None:
        """Drop ``s``'s KV if it was built under another model, preamble, kb version or epoch; say why.

        Returns None when the cached KV can be used as is (or there is no history to encode).
        """
        from agentmem.sessions.turn import retokenize

        st = s.slot.state
        if st is None:
            return None
        want = ctx.validity_key(self._kb_version(), self._epoch)
        have = st.key
        if have is not None and have != want:
            changed = next(name for name in ("fingerprint", "preamble", "kb", "epoch") if have.get(name) != want[name])
            reason = {"fingerprint": "model changed", "preamble": "preamble changed",
                      "kb": "knowledge-base version changed", "epoch": "invalidated"}[changed]
            self._count("invalidated_sessions", 1)
            if changed in ("fingerprint", "preamble"):
                retokenize(ctx, st)  # another tokenizer or template may split the texts differently
            self._drop_kv(s)
            st.key = None
            return reason if st.ids else None
        if not self.hot.backend.contains(s._key):
            st.kv_len = 0
            return "no cached KV" if st.ids else None
        return None

    def _drop_kv(self, s: Session) -> bool:
        """Forget ``s``'s KV in memory (its transcript and validity key stay); True if there was any."""
        had = False
        for tier in (self.hot, self.warm):
            if tier.backend.pop(s._key) is not None:
                had = True
            with self._lock:
                tier.policy.remove(s._key)
        if s.slot.state is not None:
            s.slot.state.kv_len = 0
        if s.slot.tier in ("hot", "warm"):
            s.slot.tier = None
            if s.slot.disk_version is not None:
                self.store.delete(s._key)
        s.slot.version += 1
        s.slot.disk_version = None
        return had

    def _erase(self, s: Session) -> bool:
        """Erase ``s`` from every tier and the registry; True if it held anything."""
        had = s.slot.state is not None or s.slot.tier is not None
        had = self.store.delete(s._key) or had  # the caller purges (overwrites) it
        s.slot.disk_version = None
        self._drop_kv(s)
        s.slot.state, s.slot.tier = None, None
        self._release(s)
        with self._lock:
            if self._sessions.get((s.user_id, s.session_id)) is s:
                del self._sessions[(s.user_id, s.session_id)]
            self._by_key.pop(s._key, None)
        return had

    def _fit(self, tier: Tier, *, incoming: int = 0, exclude: Session | None = None) -> None:
        """Move least recently used sessions out of ``tier`` until ``incoming`` more bytes fit its budget."""
        if tier.budget is None:
            return
        with self._lock:
            order = [self._by_key.get(k) for k in tier.policy.victims()]
        for victim in order:
            if tier.bytes() + incoming <= tier.budget:
                return
            # a session answering a turn is skipped; one the worker holds for a moment is waited for (holds.py)
            if victim is None or victim is exclude or victim.slot.busy or not self._holds.lock_victim(victim):
                continue
            try:
                if not victim.slot.busy and victim.slot.tier == tier.name:
                    self._move_down(victim, tier, to_cold=tier is self.warm)
            finally:
                victim._lock.release()

    # -- leases and the shared epoch (see agentmem.sessions.shared) ---------------------------------
    @property
    def _epoch(self) -> str:
        """The current epoch, read from the store each time: another worker's invalidation counts here too."""
        return load_epoch(self.store)

    def _serve(self, s: Session) -> None:
        """Hold ``s``'s lease before serving it (waits, or raises SessionBusyError); caller holds ``s._lock``.

        If the lease had lapsed, another worker may have served the session meanwhile: a newer cold copy than
        the one in memory wins (ours is dropped, and restored from the store by the turn).
        """
        held = s.slot.lease_until > time.monotonic()
        until = self.leases.take(s._key)
        if not held:
            stamp = self.store.last_used(s._key)
            mine = s.slot.state.last_used if s.slot.state is not None else None
            if stamp is not None and (mine is None or stamp > mine + 1e-3):
                self._forget_copy(s)
                s.slot.tier, s.slot.last_used = "cold", stamp
        s.slot.lease_until = until

    def _keep_lease(self, s: Session, *, early: bool = False) -> bool:
        """Renew ``s``'s lease if it is in this worker's memory; False (and our copy dropped) if it was lost.

        ``early`` (the sweep): skip the store while more than two thirds of the lease are left.
        """
        if s.slot.lease_until <= 0:
            return True  # nothing in memory here that needs it
        if early and s.slot.lease_until - time.monotonic() > self.leases.ttl_s * 2 / 3:
            return True
        until = self.leases.renew(s._key)
        if until is not None:
            s.slot.lease_until = until
            return True
        log.warning("session %s: its lease went to another worker; dropping this worker's copy", s._key)
        self._forget_copy(s)
        s.slot.tier = "cold" if self.store.last_used(s._key) is not None else None
        return False

    def _forget_copy(self, s: Session) -> None:
        """Drop this worker's in-memory copy of ``s``, leaving the store's copy alone."""
        s.slot.disk_version = None  # so _drop_kv does not delete the store's (another worker's) copy
        self._drop_kv(s)
        s.slot.state, s.slot.tier, s.slot.lease_until = None, None, 0.0

    def _release(self, s: Session) -> None:
        if s.slot.lease_until > 0:
            s.slot.lease_until = 0.0
            self.leases.release(s._key)

    def _run_worker(self) -> None:
        last_sweep = time.monotonic()
        while not self._stop.is_set():
            with self._lock:
                pending = bool(self._write_behind)
            self._wake.wait(0.05 if pending else self._interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self._drain_write_behind()
                if time.monotonic() - last_sweep >= self._interval:
                    last_sweep = time.monotonic()
                    self.sweep()
            except Exception:  # a failed pass must not kill the worker; the next one retries
                log.exception("background session pass failed")
