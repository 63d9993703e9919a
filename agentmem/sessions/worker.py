"""The background worker of the session manager: idle offloads, TTL expiry and write-behind disk copies.

A part the :class:`~agentmem.sessions.manager.SessionManager` holds. The worker only ever *tries* a session's lock
(:class:`~agentmem.sessions.holds.WorkerHolds`), so it never makes a ``send`` wait: it snapshots a session under
its lock, serialises and writes the file without it, then publishes the file only if nothing touched the session
meanwhile. Write-behind: sessions a tier would move down next get a clean disk copy ahead of need, so moving them
to disk later costs a ``send`` nothing.

Example:
    >>> worker = Background(registry, moves, leasing, config, interval=1.0)    # mem.sessions' parts, not started
    >>> chat = mem.session("s1", user_id="u1")
    >>> _ = chat.send("Hello.", max_new_tokens=1)
    >>> chat.slot.last_used -= config.session_idle_seconds + 1        # as if idle that long
    >>> worker.sweep(), chat.slot.tier      # one pass by hand (the worker runs it on its own)
    ({'idle_offloads': 1}, 'cold')
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from agentmem.sessions.leasing import Leasing
from agentmem.sessions.moves import TierMoves
from agentmem.sessions.registry import Registry

if TYPE_CHECKING:
    from agentmem.sessions.session import Session

__all__ = ["Background"]

log = logging.getLogger(__name__)


class Background:
    """The worker's passes, and the daemon thread that runs them every ``interval`` seconds (:meth:`start`)."""

    def __init__(self, registry: Registry, moves: TierMoves, leasing: Leasing, config: Any, interval: float) -> None:
        self._reg = registry
        self._moves = moves
        self._leasing = leasing
        self.config = config
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Whether the background thread was started (and not stopped)."""
        return self._thread is not None and not self._stop.is_set()

    def start(self) -> None:
        """Run the passes on a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="agentmem-sessions", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10) -> None:
        """Stop the thread (waits up to ``timeout`` seconds for the pass in progress)."""
        self._stop.set()
        self._reg.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def sweep(self) -> dict[str, int]:
        """One pass of the background worker: offload idle sessions to disk, erase expired ones."""
        now = time.time()
        idle_s, ttl = self.config.session_idle_seconds, self.config.session_ttl_seconds
        done = Counter()
        with self._reg.lock:
            sessions = list(self._reg.sessions.values())
        for s in sessions:
            with self._reg.holds.hold(s.slot) as held:
                if not held:
                    continue
                try:
                    if s.slot.busy or not self._leasing.keep(s, early=True):
                        continue
                    age = now - s.slot.last_used
                    if ttl is not None and age > ttl:
                        if self._moves.erase(s):
                            done["expired"] += 1
                        continue
                    idle = age > idle_s and s.slot.tier in ("hot", "warm")
                except Exception:
                    log.exception("session sweep failed for one session")
                    continue
            if idle:
                try:
                    moved = self.offload_idle(s)
                    done["idle_offloads"] += moved
                    self._reg.count("idle_offloads", moved)  # now, not at the sweep's end (just after the tier change)
                except Exception:
                    log.exception("idle offload failed for one session")
        if ttl is not None:  # files of sessions no process has opened since a restart
            with self._reg.lock:
                known = set(self._reg.by_key)
            for key in self._reg.store.keys():
                stamp = self._reg.store.last_used(key)
                if key not in known and stamp is not None and now - stamp > ttl and self._reg.store.delete(key):
                    done["expired"] += 1
        self._reg.store.purge()
        with self._reg.lock:
            self._reg.counts.update({k: v for k, v in done.items() if k != "idle_offloads"})
        return dict(done)

    def offload_idle(self, s: Session) -> bool:
        """Move an idle session to disk without holding its lock across the serialisation and the write.

        Snapshot under the lock, write a staged file without it, then publish the file and drop the in-memory
        KV only if nothing touched the session meanwhile (same version and tier); otherwise discard the file.
        A ``send`` that arrives during the write therefore never waits for the disk.
        """
        with self._reg.holds.hold(s.slot) as held:
            if not held or s.slot.busy or s.slot.tier not in ("hot", "warm") or s.slot.state is None:
                return False
            tier = self._reg.hot if s.slot.tier == "hot" else self._reg.warm
            kv = tier.backend.get(s.slot.key)
            if kv is None:
                return False
            if not s.slot.state.turns:  # an empty conversation: nothing worth a file
                self._reg.drop_kv(s)
                s.slot.state = None
                self._leasing.release(s)
                return True
            if s.slot.disk_version == s.slot.version and self._reg.store.last_used(s.slot.key) is not None:
                self._moves.move_down(s, tier, to_cold=True)  # clean copy on disk: just drop the memory copy
                return True
            version, tier_name, last_used = s.slot.version, s.slot.tier, s.slot.last_used
            state = copy.deepcopy(s.slot.state)
        staged = self._stage(s.slot.key, state, kv, last_used)
        published = False
        with self._reg.holds.hold(s.slot) as held:
            if (held and not s.slot.busy and s.slot.version == version and s.slot.tier == tier_name
                    and self._leasing.keep(s)):
                self._reg.store.publish(staged)
                published = True
                s.slot.disk_version = version
                tier.backend.pop(s.slot.key)
                with self._reg.lock:
                    tier.policy.remove(s.slot.key)
                    tier.counters.offloads += 1
                s.slot.state, s.slot.tier = None, "cold"
                self._reg.cold.note_bytes()
                self._leasing.release(s)
        if not published:
            self._reg.store.discard(staged)
        return published

    def _stage(self, key: str, state: Any, kv: Any, last_used: float) -> Any:
        """A sealed copy of ``state`` + ``kv`` written as a staged file: published or discarded by the caller once
        it has checked, under the session's lock, that nothing touched the session meanwhile."""
        return self._reg.store.stage(key, self._moves.seal(key, self._moves.dump(state, kv)), last_used=last_used)

    def queue_likely_victims(self) -> None:
        """Write-behind watermark: queue clean disk copies of the sessions each tier would move down next.

        For every tier above half its budget, its least recently used sessions covering the excess get a copy
        written in the background; moving one of them to disk later is then free (no write on a ``send``'s path).
        """
        queued = False
        with self._reg.lock:
            for tier in (self._reg.hot, self._reg.warm):
                if not tier.budget:
                    continue
                excess = tier.bytes() - tier.budget // 2
                for key in tier.policy.victims():
                    if excess <= 0:
                        break
                    s = self._reg.by_key.get(key)
                    if s is None or s.slot.busy:
                        continue
                    excess -= tier.backend.size(key)
                    st = s.slot.state
                    if s.slot.disk_version != s.slot.version and st is not None and st.turns:
                        self._reg.write_behind.add(key)
                        queued = True
        if queued:
            self._reg.wake.set()

    def _write_clean_copy(self, s: Session) -> bool | None:
        """Write-behind: put a current copy of a hot or warm session on disk, keeping it in memory; lock-free write.

        True: written. False: not needed (or the session changed meanwhile). None: the session was busy; retry.
        """
        with self._reg.holds.hold(s.slot) as held:
            if not held:
                return None
            if (s.slot.busy or s.slot.tier not in ("hot", "warm") or s.slot.state is None
                    or s.slot.disk_version == s.slot.version):
                return False
            tier_name = s.slot.tier
            kv = (self._reg.hot if tier_name == "hot" else self._reg.warm).backend.get(s.slot.key)
            if kv is None:
                return False
            version, last_used = s.slot.version, s.slot.last_used
            state = copy.deepcopy(s.slot.state)
        staged = self._stage(s.slot.key, state, kv, last_used)
        with self._reg.holds.hold(s.slot) as held:
            if (held and not s.slot.busy and s.slot.version == version and s.slot.tier in ("hot", "warm")
                    and self._leasing.keep(s)):
                self._reg.store.publish(staged)
                s.slot.disk_version = version
                self._reg.cold.note_bytes()
                return True
        self._reg.store.discard(staged)
        return False

    def _drain_write_behind(self) -> int:
        with self._reg.lock:
            keys, self._reg.write_behind = list(self._reg.write_behind), set()
            sessions = [self._reg.by_key.get(k) for k in keys]
        done = 0
        for key, s in zip(keys, sessions):
            if s is not None and not self._stop.is_set():
                try:
                    result = self._write_clean_copy(s)
                except Exception:
                    log.exception("write-behind failed for one session")
                    continue
                if result is None:
                    with self._reg.lock:
                        self._reg.write_behind.add(key)  # busy right now: try again shortly
                done += bool(result)
        if done:
            self._reg.count("clean_copies", done)
        return done

    def _run(self) -> None:
        last_sweep = time.monotonic()
        while not self._stop.is_set():
            with self._reg.lock:
                pending = bool(self._reg.write_behind)
            self._reg.wake.wait(0.05 if pending else self.interval)
            self._reg.wake.clear()
            if self._stop.is_set():
                break
            try:
                self._drain_write_behind()
                if time.monotonic() - last_sweep >= self.interval:
                    last_sweep = time.monotonic()
                    self.sweep()
            except Exception:  # a failed pass must not kill the worker; the next one retries
                log.exception("background session pass failed")
