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

What the manager keeps per session is the public :class:`~agentmem.sessions.slot.SessionSlot` (``session.slot``);
the manager holds its parts, one job each, over one shared :class:`~agentmem.sessions.registry.Registry` (open
sessions, tiers, counters): :class:`~agentmem.sessions.moves.TierMoves` (tier movement),
:class:`~agentmem.sessions.worker.Background` (idle offload, TTL, write-behind),
:class:`~agentmem.sessions.leasing.Leasing` (leases). A :class:`~agentmem.sessions.session.Session` sees the manager
only through :class:`~agentmem.sessions.session.SessionHost`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentmem.errors import InvalidInputError, NotFoundError
from agentmem.kv.mount import Workspace
from agentmem.ports.sessions import SessionTierStore
from agentmem.security.sealer import Sealer
from agentmem.sessions.leasing import Leasing
from agentmem.sessions.moves import SLACK_TOKENS, TierMoves
from agentmem.sessions.registry import Registry
from agentmem.sessions.session import Session, TopicSwitch
from agentmem.sessions.shared import Leases, load_epoch, new_epoch, worker_id
from agentmem.sessions.state import SessionKV, Transcript, load_session
from agentmem.sessions.tiers import MemoryBackend, Tier
from agentmem.sessions.turn import EngineContext
from agentmem.sessions.worker import Background

__all__ = ["SessionManager"]

log = logging.getLogger(__name__)
_EPOCH_FILE = "epoch"


class SessionManager:
    """Owns every session's working KV across the hot / warm / cold tiers (see the module docstring).

    Args:
        engine: returns the loaded :class:`~agentmem.kv.KVEngine` (called lazily, on first use).
        retrieve: ``(query, user_id, k, *, strict=False) -> [mountable memory]``, most relevant first.
        remember_turn: ``(user_id, session_id, role, text) -> [MemoryRecord]``: stores a turn long-term (a long one
            as parts, ``MemoryConfig.message_max_words``).
        scan: secret redaction applied to user text before it is encoded.
        kb_version: returns the current knowledge-base version.
        root: the epoch file's directory.
        config: a :class:`~agentmem.config.MemoryConfig`. cipher: encrypts what goes to the cold tier.
        cold_store: the cold tier (a :class:`~agentmem.ports.SessionTierStore`, built by
            ``agentmem.factory.build_session_store``: files under ``<store>/sessions`` by default).
            The manager calls only the protocol's methods on it, so a shared one (Redis) serves several workers.
        history_kv: ``"clean"`` (default) keeps the history's KV exactly as if encoded right after the preamble:
            a turn that mounted memories is re-encoded once without them after its reply. ``"as_generated"``
            keeps the KV the turn was generated with (it attended to that turn's memories), shifted back.
        start_worker: run the background idle/TTL worker (tests may call :meth:`sweep` by hand instead).
        topic: decides when a message starts a new topic (the session resets first), e.g. a
            :class:`~agentmem.sessions.topic.TopicDetector`; None: never.
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
        cold_store: SessionTierStore,
        topic: TopicSwitch | None = None,
    ) -> None:
        if history_kv not in ("clean", "as_generated"):
            raise InvalidInputError("history_kv must be 'clean' or 'as_generated'")
        self._engine_fn = engine
        self.retrieve = retrieve
        self.remember_turn = remember_turn
        self.scan = scan
        self.kb_version = kb_version
        self.topic = topic
        self.root = Path(root)
        self.config = config
        self._cipher = cipher
        self.history_kv = history_kv
        self._ctx_lock = threading.Lock()
        self._ctx: EngineContext | None = None
        self.hot = Tier(MemoryBackend("hot", device=None), config.session_hot_bytes)
        self.warm = Tier(MemoryBackend("warm", device="cpu"), config.session_warm_bytes)
        self.store = cold_store
        self.cold = Tier(self.store, None)
        self._reg = Registry(self.hot, self.warm, self.cold, self.store)
        self.counts: Counter[str] = self._reg.counts
        self.workspace = Workspace()
        self.workspace_peak = 0
        self.owner = worker_id()  # whose leases these are (several managers may share one cold store)
        self.leases = Leases(self.store, self.owner, ttl_s=config.session_lease_seconds,
                             wait_s=config.session_lease_wait_seconds)
        self._leasing = Leasing(self._reg, self.leases)
        self._moves = TierMoves(self._reg, self._leasing, Sealer(cipher), config, kb_version)
        load_epoch(self.store, self.root / _EPOCH_FILE)
        self._closed = False
        ttl = config.session_ttl_seconds
        interval = sweep_interval or max(0.05, min(30.0, config.session_idle_seconds / 4,
                                                   (ttl / 4) if ttl else 30.0, config.session_lease_seconds / 3))
        self._background = Background(self._reg, self._moves, self._leasing, config, interval)
        if start_worker:
            self._background.start()

    # -- public API -------------------------------------------------------------------------------------
    def open(self, session_id: str, *, user_id: str) -> Session:
        """The session with that id (created if new; restored lazily from disk on its first ``send``)."""
        self.check_open()
        if not session_id or not user_id:
            raise InvalidInputError("open needs a session_id and a user_id")
        with self._reg.lock:
            s = self._reg.sessions.get((user_id, session_id))
            if s is not None:
                return s
            key = self._key_for(user_id, session_id)
            s = Session(self, session_id, user_id, key)
            stamp = self.store.last_used(key)
            if stamp is not None:
                s.slot.tier = "cold"
                s.slot.last_used = stamp
            self.register(s)
            return s

    def get(self, session_id: str, *, user_id: str | None = None) -> Session:
        """An open session; raises :class:`NotFoundError` if none is registered under that id.

        Session ids are per user: without ``user_id`` the id must name one user's session only.

        Example:
            >>> chat = mem.session("s1", user_id="u1")              # mgr: mem.sessions
            >>> mgr.get("s1", user_id="u1") is chat, mgr.get("s1") is chat
            (True, True)
            >>> mgr.get("s1", user_id="u2")
            Traceback (most recent call last):
            agentmem.errors.NotFoundError: no open session 's1'
        """
        with self._reg.lock:
            if user_id is not None:
                found = [s] if (s := self._reg.sessions.get((user_id, session_id))) is not None else []
            else:
                found = [s for (_, sid), s in self._reg.sessions.items() if sid == session_id]
        if not found:
            raise NotFoundError(f"no open session {session_id!r}")
        if len(found) > 1:
            raise InvalidInputError(f"several users have a session {session_id!r}: pass user_id")
        return found[0]

    def list(self, *, user_id: str | None = None) -> list[str]:
        """Ids of registered sessions (optionally of one user)."""
        with self._reg.lock:
            return [sid for (uid, sid) in self._reg.sessions if user_id is None or uid == user_id]

    def offload(self, session_id: str, to: str = "disk", *, user_id: str | None = None) -> str | None:
        """Move a session's KV down to ``"warm"`` or ``"disk"``/``"cold"`` now (waits for an in-flight send).

        Returns the tier it is in afterwards. Moving up is :meth:`restore`.
        """
        target = {"warm": "warm", "cpu": "warm", "disk": "cold", "cold": "cold"}.get(to)
        if target is None:
            raise InvalidInputError("offload to 'warm' or 'disk'")
        s = self.get(session_id, user_id=user_id)
        with s.slot.lock:
            if s.slot.tier == "hot":
                self._moves.move_down(s, self.hot, to_cold=target == "cold")
            if s.slot.tier == "warm" and target == "cold":
                self._moves.move_down(s, self.warm, to_cold=True)
            return s.slot.tier

    def restore(self, session_id: str, *, user_id: str | None = None) -> dict[str, Any]:
        """Bring a session's KV back to the hot tier now.

        Returns ``{"from": tier, "seconds": s, "make_room_seconds": s}``: the restore itself, and the time spent first
        moving other sessions down to make room for it.
        """
        s = self.get(session_id, user_id=user_id)
        ctx = self.context()
        with s.slot.lock:
            self.serve(s)
            source, seconds, evict = self.bring_hot(s, ctx)
            self.validate(s, ctx)
            s.slot.last_used = time.time()
            with self._reg.lock:
                if self.hot.backend.contains(s.slot.key):
                    self.hot.policy.touch(s.slot.key)
        self.fit(self.hot)
        return {"from": source, "seconds": seconds, "make_room_seconds": evict}

    def end(self, session_id: str, *, user_id: str | None = None) -> bool:
        """Erase a session's working KV and stored turns from every tier now (its long-term memories stay).

        With ``user_id``, only that user's session of this id; without, every user's session of this id.

        Example:
            >>> mem.session("s1", user_id="u1").send("Hello.", max_new_tokens=1).reused_tokens
            0
            >>> mgr.end("s1", user_id="u1"), mgr.list(user_id="u1"), len(mem.list(user_id="u1")) > 2
            (True, [], True)
        """
        with self._reg.lock:
            mine = [s for (uid, sid), s in self._reg.sessions.items()
                    if sid == session_id and (user_id is None or uid == user_id)]
        n = 0
        for s in mine:
            with s.slot.lock:
                n += self._moves.erase(s)
        if user_id is not None:  # sessions no process has opened since a restart
            n += self.store.delete(self._key_for(user_id, session_id))
        else:
            name = self._hash("s", session_id)
            n += sum(self.store.delete(k) for k in self.store.keys() if k.split("/", 1)[1] == name)
        self.store.purge()
        if n:
            self.count("ended", 1)
        return n > 0

    def end_user(self, user_id: str) -> int:
        """Erase every session of ``user_id`` from every tier; returns how many were erased."""
        with self._reg.lock:
            mine = [s for s in self._reg.sessions.values() if s.user_id == user_id]
        n = 0
        for s in mine:
            with s.slot.lock:
                n += self._moves.erase(s)
        n += sum(self.store.delete(k) for k in self.store.keys(self._hash("u", user_id)))
        self.store.purge()
        self.count("ended", n)
        return n

    def invalidate(self, reason: str = "invalidated") -> int:
        """Drop every session's cached KV (rebuilt from its turns on next use); returns how many were dropped.

        A new epoch is written to the cold store, so KV there is never mounted after this either, by any worker.
        """
        new_epoch(self.store)
        with self._reg.lock:
            sessions = list(self._reg.sessions.values())
        dropped = 0
        for s in sessions:
            if not s.slot.lock.acquire(blocking=False):
                continue  # busy: its next use sees the new epoch
            try:
                if not s.slot.busy and self.drop_kv(s):
                    dropped += 1
            finally:
                s.slot.lock.release()
        self.count("invalidations", 1)
        log.info("session KV invalidated (%s): %d sessions dropped from memory", reason, dropped)
        return dropped


    def stats(self) -> dict[str, Any]:
        """Per tier: sessions, bytes, budget, peak, hits, misses, offloads, restores, restore latency."""
        tiers = {t.name: t.stats() for t in (self.hot, self.warm, self.cold)}
        with self._reg.lock:
            registered = len(self._reg.sessions)
        return {
            **tiers,
            "restore_latency_s": {"warm": tiers["warm"]["restore_latency_s"], "cold": tiers["cold"]["restore_latency_s"]},
            "sessions": registered,
            "workspace_bytes": self.workspace_peak,
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
        self._background.stop()
        with self._reg.lock:
            sessions = list(self._reg.sessions.values())
        for s in sessions:
            with s.slot.lock:
                try:
                    if s.slot.tier == "hot":
                        self._moves.move_down(s, self.hot, to_cold=True)
                    elif s.slot.tier == "warm":
                        self._moves.move_down(s, self.warm, to_cold=True)
                except Exception:
                    log.exception("could not write a session to disk at close")
        self.store.purge()
        self.workspace.release()
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

    def limit(self, ctx: EngineContext) -> int:
        """Most conversation tokens (history + new message + reply) a session may hold."""
        return max(1, min(int(self.config.session_max_tokens), ctx.max_positions - ctx.margin - ctx.preamble_len))

    # -- registry ---------------------------------------------------------------------------------------
    def _hash(self, kind: str, value: str) -> str:
        secret = self._cipher.index_key if self._cipher is not None else b"agentmem-sessions-v1"
        return hmac.new(secret, f"{kind}:{value}".encode(), hashlib.sha256).hexdigest()[:32]

    def _key_for(self, user_id: str, session_id: str) -> str:
        return f"{self._hash('u', user_id)}/{self._hash('s', session_id)}"

    def register(self, s: Session) -> None:
        with self._reg.lock:
            current = self._reg.sessions.get((s.user_id, s.session_id))
            if current is not None and current is not s:
                raise InvalidInputError(
                    f"session {s.session_id!r} was ended and reopened through another handle; use that one"
                )
            self._reg.sessions[(s.user_id, s.session_id)] = s
            self._reg.by_key[s.slot.key] = s

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``name`` (``stats()``)."""
        self._reg.count(name, n)

    def check_open(self) -> None:
        if self._closed:
            raise InvalidInputError("this session manager is closed")

    # -- what a Session asks of its manager (caller holds the session's lock) ---------------------------
    def validity_key(self, ctx: EngineContext) -> dict[str, Any]:
        """The key KV built now is valid under: model, preamble, knowledge-base version, shared epoch."""
        return ctx.validity_key(self.kb_version(), self._leasing.epoch)

    def read_transcript(self, s: Session) -> Transcript | None:
        """``s``'s transcript without restoring anything: in memory, else read from its cold file (no KV)."""
        if s.slot.state is not None:
            return s.slot.state
        if s.slot.tier != "cold":
            return None
        blob = self.store.get(s.slot.key)
        return load_session(self._moves.unseal(s.slot.key, blob), with_kv=False)[0] if blob is not None else None

    def hot_kv(self, s: Session) -> SessionKV | None:
        """``s``'s working KV if it is in the hot tier."""
        return self.hot.backend.get(s.slot.key)

    def put_hot(self, s: Session, kv: SessionKV) -> None:
        """Make ``kv`` ``s``'s working KV in the hot tier (most recently used)."""
        self.hot.backend.put(s.slot.key, kv)
        s.slot.tier = "hot"
        with self._reg.lock:
            self.hot.policy.touch(s.slot.key)
        self.hot.note_bytes()

    def note_workspace(self, nbytes: int) -> None:
        """Record the workspace's high-water mark (``stats()["workspace_bytes"]``)."""
        self.workspace_peak = max(self.workspace_peak, nbytes)

    def reset_session(self, s: Session) -> None:
        """Drop ``s``'s working KV and turns from every tier; it starts over with an empty transcript."""
        self.store.delete(s.slot.key)
        self.store.purge()
        s.slot.disk_version = None
        self.drop_kv(s)
        s.slot.state = Transcript(s.session_id, s.user_id)
        s.slot.tier = None
        self.count("resets", 1)

    def end_turn(self, s: Session, *, changed: bool) -> None:
        """After a turn (even a failed one): not busy, a new version if it ``changed`` the session, used now."""
        s.slot.busy = False
        if changed:
            s.slot.version += 1
        s.slot.last_used = time.time()
        if s.slot.state is not None:
            s.slot.state.last_used = s.slot.last_used
        with self._reg.lock:
            if self.hot.backend.contains(s.slot.key):
                self.hot.policy.touch(s.slot.key)

    def settle(self) -> None:
        """Keep the tiers within budget after a turn, and let the worker write ahead what would move down next.

        The session that just answered may move down too, if it alone exceeds the hot budget.
        """
        self.fit(self.hot)
        self.fit(self.warm)
        if self._background.running:
            self._background.queue_likely_victims()

    def serve(self, s: Session) -> None:
        """Hold ``s``'s lease before serving it (waits, or raises SessionBusyError; see :class:`Leasing`)."""
        self._leasing.serve(s)

    def bring_hot(self, s: Session, ctx: EngineContext, extra: int = SLACK_TOKENS) -> tuple[str | None, float, float]:
        """Restore ``s``'s KV to the hot tier; where from, seconds restoring, seconds making room (TierMoves)."""
        return self._moves.bring_hot(s, ctx, extra)

    def validate(self, s: Session, ctx: EngineContext) -> str | None:
        """Drop ``s``'s KV if built under another model, preamble, kb version or epoch; why (:class:`TierMoves`)."""
        return self._moves.validate(s, ctx)

    def fit(self, tier: Tier, *, incoming: int = 0, exclude: Session | None = None) -> None:
        """Move least recently used sessions out of ``tier`` until ``incoming`` more bytes fit its budget."""
        self._moves.fit(tier, incoming=incoming, exclude=exclude)

    def drop_kv(self, s: Session) -> bool:
        """Forget ``s``'s KV in memory (its transcript stays); True if there was any."""
        return self._reg.drop_kv(s)

    # -- the background worker --------------------------------------------------------------------------
    def sweep(self) -> dict[str, int]:
        """One pass of the background worker by hand: offload idle sessions to disk, erase expired ones.

        Example:
            >>> chat = mem.session("s1", user_id="u1")
            >>> _ = chat.send("Hello.", max_new_tokens=1)
            >>> mgr.sweep(), chat.slot.tier
            ({}, 'hot')
            >>> chat.slot.last_used -= mem.config.session_idle_seconds + 1     # as if idle that long
            >>> mgr.sweep(), chat.slot.tier
            ({'idle_offloads': 1}, 'cold')
        """
        return self._background.sweep()
