"""A hypothesis state machine over agentmem's public API, shared by the CI test and ``benchmarks/fuzz.py``.

Steps: remember / remember_many / update (when the facade has it) / recall / list / get / forget (entry, session,
user, with right and wrong owners) / sweep / reopen / a second process opening and closing the same store, with
hostile strings, numbers and ids mixed in. After every step:

* the call succeeded or raised an ``agentmem`` error (anything else fails the run);
* ``verify()``: rows = vectors, every row's blob present, no orphan vector or blob, and rows = what the model holds;
* every user's ``list()`` holds only that user's entries, exactly the ones the model says are alive;
* nothing erased is on disk: neither its text marker nor its stored vector's float32 bytes, nor a planted secret.

Example:
    >>> from hypothesis.stateful import run_state_machine_as_test                  # doctest: +SKIP
    >>> run_state_machine_as_test(ApiMachine)                                      # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agentmem import AgentMemError, AgentMemory
from agentmem.security import scan_tree_for_markers

ROOT = Path(__file__).resolve().parents[2]
USERS = ("alice", "bob", "carol")
SESSIONS = ("s1", "s2", "shared")
SECRET = "ghp_" + "Fz9q" * 9  # a GitHub token: redacted before storage, so it must never reach the disk
WORDS = ("orchard", "sailing", "violin", "harbour", "lantern", "glacier", "pottery", "meadow", "comet", "saffron")

def _deep(n: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    cur = root
    for _ in range(n):
        cur["a"] = {}
        cur = cur["a"]
    return root


# invisible and direction characters: an id that looks like "alice" but is not (zero-width space, right-to-left
# override, no-break space, BOM, left-to-right isolate, soft hyphen); accepted once, they made forget fail half-way
INVISIBLE_IDS = ("alice\u200b", "\u202ealice", "ali\u00a0ce", "\ufeffbob", "bo\u2066b", "car\u00adol")
HOSTILE_IDS = ("", " ", "a\tb", "x" * 300, "n\x00", "s\ud800", "new\nline", *INVISIBLE_IDS, 5, None, ["alice"])
HOSTILE_STR_IDS = tuple(i for i in HOSTILE_IDS if isinstance(i, str))
HOSTILE_TTLS = (1e12, 1e300, float("nan"), float("inf"), -1, 0, timedelta.max, "10", True)
HOSTILE_ROLES = (5, "robot", "password=hunter2", "")
HOSTILE_TIMESTAMPS = (5, "x" * 100, "8 May\n2023", "\ud800")
HOSTILE_METADATA: tuple[Any, ...] = ({"k": "\ud800"}, {"x": float("nan")}, [1, 2], "meta", {1: "a"}, _deep(5000))
HOSTILE_TEXT = ("", "   ", "\ud800 text", 5, None, b"bytes")
# each generated step counts here (benchmarks/fuzz.py reports it)
STATS = {"steps": 0, "agentmem_errors": 0, "examples": 0}


@dataclass
class Entry:
    user: str
    session: str | None
    markers: list[bytes] = field(default_factory=list)
    vectors: list[bytes] = field(default_factory=list)
    expires_at: float | None = None


def stored_vector_prefixes(mem: AgentMemory, user: str, ids: list[str]) -> dict[str, bytes]:
    """The first 32 bytes (8 float32s) of each entry's vector as Chroma holds it: what an attacker would find."""
    vectors = mem._store.vectors
    with vectors._handle.lock:
        col = vectors._collection(vectors._handle.fresh(), user, create=False)
        if col is None or not ids:
            return {}
        got = col.get(ids=ids, include=["embeddings"])
    return {i: np.asarray(v, dtype=np.float32)[:8].tobytes() for i, v in zip(got["ids"], got["embeddings"])}


class ApiMachine(RuleBasedStateMachine):
    """The public API against a plain model of what should be stored (see module docstring)."""

    model_pair: Any = None  # a tiny (model, tokenizer), set by the caller, so blobs reach the disk

    def __init__(self) -> None:
        super().__init__()
        STATS["examples"] += 1
        self.dir = Path(tempfile.mkdtemp(prefix="agentmem-fuzz-"))
        self.path = self.dir / "store"
        self.mem = self._open()
        self.entries: dict[str, Entry] = {}
        self.erased: list[bytes] = [SECRET.encode()]
        self.child: subprocess.Popen[bytes] | None = None

    def _open(self) -> AgentMemory:
        return AgentMemory(self.path, model=self.model_pair, sweep_interval=None)

    # --- helpers -------------------------------------------------------------------------------------------
    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> tuple[bool, Any]:
        """(True, result) or (False, the agentmem error); any other exception fails the run."""
        STATS["steps"] += 1
        try:
            return True, fn(*args, **kwargs)
        except AgentMemError as exc:
            STATS["agentmem_errors"] += 1
            return False, exc

    def _marker(self) -> tuple[str, bytes]:
        tag = "zq" + uuid.uuid4().hex[:12]  # lower-case alphanumeric: survives tokenising and stemming
        return tag, tag.encode()

    def _text(self, data: Any, marker: str) -> str:
        words = data.draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4))
        secret = data.draw(st.booleans())
        return " ".join([*words, marker] + ([f"token {SECRET}"] if secret else []))

    def _adopt(self, record: Any, marker: bytes) -> None:
        entry = self.entries.get(record.id)
        if entry is None:  # a consolidating store may merge into an existing entry and return it
            entry = self.entries[record.id] = Entry(record.user_id, record.session_id)
            entry.expires_at = record.expires_at.timestamp() if record.expires_at else None
        entry.markers.append(marker)
        entry.vectors.extend(stored_vector_prefixes(self.mem, record.user_id, [record.id]).values())

    def _erase(self, ids: list[str]) -> None:
        for i in ids:
            entry = self.entries.pop(i)
            self.erased += entry.markers + entry.vectors

    # --- writes --------------------------------------------------------------------------------------------
    @rule(data=st.data(), user=st.sampled_from(USERS), session=st.sampled_from((None, *SESSIONS)),
          hostile=st.sampled_from(("none", "none", "user_id", "ttl", "role", "timestamp", "metadata", "text",
                                   "session_id", "tags")),
          encode=st.booleans())
    def remember(self, data: Any, user: str, session: str | None, hostile: str, encode: bool) -> None:
        tag, marker = self._marker()
        kwargs: dict[str, Any] = dict(user_id=user, session_id=session, encode=encode and self.model_pair is not None,
                                      ttl=data.draw(st.sampled_from((None, None, 0.001, 3600.0))),
                                      role=data.draw(st.sampled_from((None, "user", "assistant"))),
                                      timestamp=data.draw(st.sampled_from((None, "8 May 2023, 13:56", datetime.now()))),
                                      metadata=data.draw(st.sampled_from((None, {"src": "chat", "n": 3}, _deep(20)))))
        text: Any = self._text(data, tag)
        if hostile == "text":
            text = data.draw(st.sampled_from(HOSTILE_TEXT))
        elif hostile == "user_id":
            kwargs["user_id"] = data.draw(st.sampled_from(HOSTILE_IDS))
        elif hostile == "session_id":
            kwargs["session_id"] = data.draw(st.sampled_from(HOSTILE_STR_IDS))
        elif hostile == "tags":
            kwargs["tags"] = data.draw(st.sampled_from(("tag", [5], ["\ud800"], ["a\nb"], [""], ["a\u200bb"])))
        elif hostile != "none":
            kwargs[hostile] = data.draw(st.sampled_from({"ttl": HOSTILE_TTLS, "role": HOSTILE_ROLES,
                                                         "timestamp": HOSTILE_TIMESTAMPS,
                                                         "metadata": HOSTILE_METADATA}[hostile]))
        ok, rec = self._call(self.mem.remember, text, **kwargs)
        assert not (ok and hostile in ("user_id", "session_id")), f"remember() accepted a hostile {hostile}"
        if ok:
            self._adopt(rec, marker)
        else:
            assert hostile != "none", f"a valid remember() was refused: {rec!r}"
            self.erased.append(marker)  # a refused write leaves no trace

    @rule(data=st.data(), n=st.integers(1, 5), poison=st.booleans())
    def remember_many(self, data: Any, n: int, poison: bool) -> None:
        items, markers = [], []
        for _ in range(n):
            tag, marker = self._marker()
            items.append({"text": self._text(data, tag), "user_id": data.draw(st.sampled_from(USERS)),
                          "session_id": data.draw(st.sampled_from((None, *SESSIONS)))})
            markers.append(marker)
        if poison:  # one bad item: nothing of the batch may be stored
            bad = data.draw(st.integers(0, n - 1))
            items[bad] = {**items[bad], **data.draw(st.sampled_from(
                ({"user_id": "a\tb"}, {"ttl": 1e300}, {"role": 5}, {"text": ""}, {"colour": "red"}, {"user_id": None})))}
            self.erased += markers  # a refused batch leaves no trace
        ok, recs = self._call(self.mem.remember_many, items)
        assert ok != poison, f"remember_many poison={poison} returned ok={ok}: {recs!r}"
        if ok:
            for rec, marker in zip(recs, markers):
                self._adopt(rec, marker)

    @precondition(lambda self: hasattr(self.mem, "update") and bool(self.entries))
    @rule(data=st.data())
    def update(self, data: Any) -> None:
        entry_id = data.draw(st.sampled_from(sorted(self.entries)))
        tag, marker = self._marker()
        ok, rec = self._call(self.mem.update, entry_id, text=self._text(data, tag))
        if ok:
            self._adopt(rec, marker)  # history keeps older versions until the entry is forgotten

    # --- reads ---------------------------------------------------------------------------------------------
    @rule(user=st.sampled_from(USERS), query=st.one_of(st.sampled_from(WORDS), st.text(max_size=30)),
          k=st.sampled_from((1, 5, 0, -1, "3", 2.5)), kinds=st.sampled_from((None, "turn", 5, ["bogus"])),
          filters=st.sampled_from((None, {"src": "chat"}, {"n": {"$in": {3}}}, {"n": {"$in": "x"}}, {"$bad": 1})))
    def recall(self, user: str, query: str, k: Any, kinds: Any, filters: Any) -> None:
        ok, hits = self._call(self.mem.recall, query, user_id=user, k=k, kinds=kinds, filters=filters)
        if ok:
            assert all(h.user_id == user for h in hits), "recall returned another user's entry"
            assert all(h.id in self.entries for h in hits), "recall returned an entry the model does not hold"

    @rule(user=st.sampled_from(USERS), limit=st.sampled_from((None, 2, 0, -1, "3", 2.5, 10**20)),
          offset=st.sampled_from((0, 1, -1, 1.5, "0")))
    def list_entries(self, user: str, limit: Any, offset: Any) -> None:
        ok, recs = self._call(self.mem.list, user_id=user, limit=limit, offset=offset)
        if ok:
            assert all(r.user_id == user and r.id in self.entries for r in recs)

    @precondition(lambda self: bool(self.entries))
    @rule(data=st.data(), as_user=st.sampled_from((None, *USERS)))
    def get(self, data: Any, as_user: str | None) -> None:
        entry_id = data.draw(st.sampled_from(sorted(self.entries)))
        entry = self.entries[entry_id]
        ok, rec = self._call(self.mem.get, entry_id, user_id=as_user)
        expired = entry.expires_at is not None and entry.expires_at <= time.time()
        if as_user is not None and as_user != entry.user:
            assert not ok, "get(user_id=) returned another user's entry"
        elif not expired:
            assert ok and rec.user_id == entry.user

    # --- erasure -------------------------------------------------------------------------------------------
    @precondition(lambda self: bool(self.entries))
    @rule(data=st.data(), as_user=st.sampled_from((None, "owner", "other")))
    def forget_entry(self, data: Any, as_user: str) -> None:
        entry_id = data.draw(st.sampled_from(sorted(self.entries)))
        owner = self.entries[entry_id].user
        user = None if as_user is None else owner if as_user == "owner" else next(u for u in USERS if u != owner)
        ok, n = self._call(self.mem.forget, entry_id, user_id=user)
        assert ok, f"forget(entry) failed: {n!r}"
        assert n == (0 if as_user == "other" else 1)
        if n:
            self._erase([entry_id])

    @rule(session=st.sampled_from(SESSIONS), user=st.sampled_from((None, *USERS)))
    def forget_session(self, session: str, user: str | None) -> None:
        ok, n = self._call(self.mem.forget, session_id=session, user_id=user)
        assert ok, f"forget(session) failed: {n!r}"
        gone = [i for i, e in self.entries.items() if e.session == session and (user is None or e.user == user)]
        assert n == len(gone), (n, len(gone))
        self._erase(gone)

    @rule(user=st.sampled_from(USERS))
    def forget_user(self, user: str) -> None:
        ok, n = self._call(self.mem.forget, user_id=user)
        assert ok, f"forget(user) failed: {n!r}"
        gone = [i for i, e in self.entries.items() if e.user == user]
        assert n == len(gone), (n, len(gone))
        self._erase(gone)

    @rule(bad=st.sampled_from(HOSTILE_IDS))
    def forget_hostile(self, bad: Any) -> None:
        ok, n = self._call(self.mem.forget, user_id=bad)
        assert not ok or n == 0, "forget with a hostile id erased something"

    @rule()
    def sweep(self) -> None:
        now = time.time()
        ok, n = self._call(self.mem.sweep)
        assert ok
        gone = [i for i, e in self.entries.items() if e.expires_at is not None and e.expires_at <= now]
        assert n >= len(gone)
        self._erase(gone)

    # --- processes -----------------------------------------------------------------------------------------
    @rule()
    def reopen(self) -> None:
        self._join_child()
        self.mem.close()
        STATS["steps"] += 1
        self.mem = self._open()

    @precondition(lambda self: self.child is None)
    @rule()
    def second_process(self) -> None:
        """Another process opens and closes the store while this one keeps writing (joined at reopen/teardown)."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        code = "import sys; from agentmem import AgentMemory; AgentMemory(sys.argv[1]).close()"
        self.child = subprocess.Popen([sys.executable, "-c", code, str(self.path)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        STATS["steps"] += 1

    def _join_child(self) -> None:
        if self.child is not None:
            _, err = self.child.communicate(timeout=300)
            assert self.child.returncode == 0, f"second process failed: {err.decode(errors='replace')[-2000:]}"
            self.child = None

    # --- invariants ----------------------------------------------------------------------------------------
    @invariant()
    def consistent(self) -> None:
        report = self.mem.verify()
        assert report["rows_missing_vector"] == 0 and report["rows_missing_blob"] == 0, report
        assert report["orphan_vectors"] == 0 and report["orphan_blobs"] == 0, report
        assert report["rows"] == report["vectors"] == len(self.entries), (report, len(self.entries))

    @invariant()
    def users_see_their_own(self) -> None:
        now = time.time()
        for user in USERS:
            ids = {r.id for r in self.mem.list(user_id=user)}
            alive = {i for i, e in self.entries.items() if e.user == user
                     and (e.expires_at is None or e.expires_at > now + 1)}
            maybe = {i for i, e in self.entries.items() if e.user == user and e.expires_at is not None}
            assert alive <= ids <= alive | maybe, (user, ids ^ alive)

    @invariant()
    def nothing_erased_on_disk(self) -> None:
        found = scan_tree_for_markers(self.path, self.erased)
        assert not found, {str(p.relative_to(self.path)): len(m) for p, m in found.items()}

    def teardown(self) -> None:
        try:
            self._join_child()
        finally:
            self.mem.close()
            shutil.rmtree(self.dir, ignore_errors=True)


__all__ = ["ApiMachine", "STATS"]
