"""How a session's working KV moves between the tiers: down (hot → warm → cold), back up to hot, or out.

A part the :class:`~agentmem.sessions.manager.SessionManager` holds (over its shared
:class:`~agentmem.sessions.registry.Registry`): moving down
when a tier is over budget (least recently used first), restoring to hot before a turn, reading a cold file back,
dropping KV that was built under another model / preamble / kb version / epoch, erasing a session. Every method
here expects the caller to hold the session's lock (``session.slot.lock``).

Example:
    >>> moves = TierMoves(registry, leasing, Sealer(None), config, kb_version=lambda: None)   # mem.sessions' parts
    >>> chat = mem.session("s1", user_id="u1")
    >>> _ = chat.send("Hello.", max_new_tokens=1)
    >>> chat.slot.tier, registry.hot.bytes() > 0
    ('hot', True)
    >>> moves.fit(registry.hot, incoming=registry.hot.budget)      # make room for a whole budget more
    >>> chat.slot.tier, registry.hot.bytes()
    ('warm', 0)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentmem.errors import BlobCorruptedError, EncryptionError
from agentmem.ports.sessions import put
from agentmem.security.sealer import Sealer
from agentmem.sessions.leasing import Leasing
from agentmem.sessions.registry import Registry
from agentmem.sessions.state import PackedSessionKV, SessionKV, Transcript, dump_session, load_session
from agentmem.sessions.tiers import Tier
from agentmem.sessions.turn import EngineContext, retokenize

if TYPE_CHECKING:
    from agentmem.sessions.session import Session

__all__ = ["TierMoves"]

log = logging.getLogger(__name__)
SLACK_TOKENS = 128  # spare room a restored session gets for its next turn


class TierMoves:
    """Tier movement of a session's KV (caller holds the session's lock)."""

    def __init__(self, registry: Registry, leasing: Leasing, sealer: Sealer, config: Any,
                 kb_version: Callable[[], str | None]) -> None:
        self._reg = registry
        self._leasing = leasing
        self._sealer = sealer
        self.config = config
        self.kb_version = kb_version
        self.hot, self.warm, self.cold, self.store = registry.hot, registry.warm, registry.cold, registry.store

    def dump(self, state: Transcript, kv: SessionKV | None) -> bytes:
        return dump_session(state, kv, codec=self.config.session_kv_codec)  # cold files: maybe an integer codec

    def seal(self, key: str, data: bytes) -> bytes:
        return self._sealer.seal_session(key, data)

    def unseal(self, key: str, blob: bytes) -> bytes:
        return self._sealer.open_session(key, blob)

    def _write_cold(self, s: Session, kv: SessionKV | None) -> None:
        assert s.slot.state is not None
        blob = self.seal(s.slot.key, self.dump(s.slot.state, kv))
        if not self._leasing.keep(s):
            return  # another worker serves it now: our copy was dropped, not written over theirs
        put(self.store, s.slot.key, blob, last_used=s.slot.last_used)
        s.slot.disk_version = s.slot.version
        s.slot.state = None  # the transcript now lives in the file
        s.slot.tier = "cold"
        self.cold.note_bytes()
        self._leasing.release(s)

    def move_down(self, s: Session, src: Tier, *, to_cold: bool) -> None:
        """Move ``s`` from ``src`` (hot or warm) to warm, or to cold when ``to_cold`` or warm cannot take it."""
        kv = src.backend.pop(s.slot.key)
        with self._reg.lock:
            src.policy.remove(s.slot.key)
            src.counters.offloads += 1
        if kv is None or s.slot.state is None:
            s.slot.tier = None
            return
        warm_kv = self._warm_copy(kv) if src is self.hot and not to_cold else None
        if warm_kv is not None:
            self.fit(self.warm, incoming=warm_kv.nbytes, exclude=s)
            self.warm.backend.put(s.slot.key, warm_kv)
            s.slot.tier = "warm"
            with self._reg.lock:
                self.warm.policy.touch(s.slot.key)
                if s.slot.state.turns and s.slot.disk_version != s.slot.version:
                    self._reg.write_behind.add(s.slot.key)  # the worker writes a clean disk copy ahead of need
            self.warm.note_bytes()
            self._reg.wake.set()
            return
        if not s.slot.state.turns:  # an empty conversation: nothing worth a file
            s.slot.state, s.slot.tier = None, None
            self._leasing.release(s)
            return
        if s.slot.disk_version == s.slot.version and self.store.last_used(s.slot.key) is not None:
            s.slot.state, s.slot.tier = None, "cold"  # its clean copy is already on disk: nothing to write
            with self._reg.lock:
                self._reg.counts["clean_demotions"] += 1
            self._leasing.release(s)
            return
        self._write_cold(s, kv)

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

    def bring_hot(
        self, s: Session, ctx: EngineContext, extra: int = SLACK_TOKENS
    ) -> tuple[str | None, float, float]:
        """Restore ``s``'s KV (and transcript) to the hot tier; count hits and misses on the way down.

        Returns the tier it came from, the seconds spent restoring it (reading, parsing, copying to the device)
        and the seconds spent first moving other sessions down to make room.
        """
        if s.slot.tier == "hot" and self.hot.backend.contains(s.slot.key):
            self._reg.bump(self.hot, "hits")
            if s.slot.disk_version is not None:  # its write-behind copy is about to go stale
                self.store.delete(s.slot.key)
                s.slot.disk_version = None
            return None, 0.0, 0.0
        t0 = time.perf_counter()
        self._reg.bump(self.hot, "misses")
        source: Tier | None = None
        kv: SessionKV | None = None
        if s.slot.tier == "warm":
            self._reg.bump(self.warm, "hits")
            kv = self.warm.backend.pop(s.slot.key)
            with self._reg.lock:
                self.warm.policy.remove(s.slot.key)
                self._reg.write_behind.discard(s.slot.key)
            if s.slot.disk_version is not None:
                self.store.delete(s.slot.key)  # a file exists only while it is current
            source = self.warm
        else:
            self._reg.bump(self.warm, "misses")
            if s.slot.tier == "cold":
                self._reg.bump(self.cold, "hits")
                source = self.cold
                kv = self._read_cold(s, ctx)
            else:
                self._reg.bump(self.cold, "misses")
        if s.slot.state is None:
            s.slot.state = Transcript(s.session_id, s.user_id)
        s.slot.tier = None
        s.slot.disk_version = None
        if kv is None:
            return (source.name if source else None), time.perf_counter() - t0, 0.0
        capacity = kv.length + extra
        t_fit = time.perf_counter()
        self.fit(self.hot, incoming=capacity * self._bytes_per_token(kv), exclude=s)
        evict = time.perf_counter() - t_fit
        kv = kv.moved(ctx.device, capacity=capacity)
        self.hot.backend.put(s.slot.key, kv)
        s.slot.tier = "hot"
        with self._reg.lock:
            self.hot.policy.touch(s.slot.key)
        self.hot.note_bytes()
        seconds = time.perf_counter() - t0 - evict
        assert source is not None
        with self._reg.lock:
            source.counters.restores += 1
            source.counters.restore_seconds.append(seconds)
        return source.name, seconds, evict

    def _read_cold(self, s: Session, ctx: EngineContext) -> SessionKV | None:
        blob = self.store.get(s.slot.key)
        if blob is None:
            return None
        self.store.delete(s.slot.key)  # a file exists only while it is current (purged later, off this path)
        try:
            transcript, kv = load_session(self.unseal(s.slot.key, blob))
            if transcript.session_id != s.session_id or transcript.user_id != s.user_id:
                raise BlobCorruptedError("session file belongs to another session")
        except (BlobCorruptedError, EncryptionError) as exc:
            log.warning("session file %s unusable (%s); starting the conversation over", s.slot.key, exc)
            self._reg.count("corrupted", 1)
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
            kv = None  # made by another model: rebuilt from the turns by validate / the next send
        return kv

    def validate(self, s: Session, ctx: EngineContext) -> str | None:
        """Drop ``s``'s KV if it was built under another model, preamble, kb version or epoch; say why.

        Returns None when the cached KV can be used as is (or there is no history to encode).
        """
        st = s.slot.state
        if st is None:
            return None
        want = ctx.validity_key(self.kb_version(), self._leasing.epoch)
        have = st.key
        if have is not None and have != want:
            changed = next(name for name in ("fingerprint", "preamble", "kb", "epoch") if have.get(name) != want[name])
            reason = {"fingerprint": "model changed", "preamble": "preamble changed",
                      "kb": "knowledge-base version changed", "epoch": "invalidated"}[changed]
            self._reg.count("invalidated_sessions", 1)
            if changed in ("fingerprint", "preamble"):
                retokenize(ctx, st)  # another tokenizer or template may split the texts differently
            self._reg.drop_kv(s)
            st.key = None
            return reason if st.ids else None
        if not self.hot.backend.contains(s.slot.key):
            st.kv_len = 0
            return "no cached KV" if st.ids else None
        return None

    def erase(self, s: Session) -> bool:
        """Erase ``s`` from every tier and the registry; True if it held anything."""
        had = s.slot.state is not None or s.slot.tier is not None
        had = self.store.delete(s.slot.key) or had  # the caller purges (overwrites) it
        s.slot.disk_version = None
        self._reg.drop_kv(s)
        s.slot.state, s.slot.tier = None, None
        self._leasing.release(s)
        with self._reg.lock:
            if self._reg.sessions.get((s.user_id, s.session_id)) is s:
                del self._reg.sessions[(s.user_id, s.session_id)]
            self._reg.by_key.pop(s.slot.key, None)
        return had

    def fit(self, tier: Tier, *, incoming: int = 0, exclude: Session | None = None) -> None:
        """Move least recently used sessions out of ``tier`` until ``incoming`` more bytes fit its budget."""
        if tier.budget is None:
            return
        with self._reg.lock:
            order = [self._reg.by_key.get(k) for k in tier.policy.victims()]
        for victim in order:
            if tier.bytes() + incoming <= tier.budget:
                return
            # a session answering a turn is skipped; one the worker holds for a moment is waited for (holds.py)
            if victim is None or victim is exclude or victim.slot.busy or not self._reg.holds.lock_victim(victim.slot):
                continue
            try:
                if not victim.slot.busy and victim.slot.tier == tier.name:
                    self.move_down(victim, tier, to_cold=tier is self.warm)
            finally:
                victim.slot.lock.release()
