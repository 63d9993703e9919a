"""The embedded cold tier of session KV: one file per session under the store path (the default).

Files are written atomically (fsynced temp file + rename), stamped with the session's last use as their mtime, and
shared safely by several processes on one host: nothing is cached in memory, and a lease is a small JSON file
updated under an exclusive ``flock``. ``delete`` moves a file into ``.trash/`` (instant); ``purge`` overwrites and
unlinks it later, off the path of a turn.

Example:
    >>> import tempfile, pathlib, time
    >>> store = FileSessionStore(pathlib.Path(tempfile.mkdtemp()))
    >>> store.publish(store.stage("u/s", b"kv", last_used=time.time())); bytes(store.get("u/s"))
    b'kv'
    >>> store.delete("u/s"), store.purge(), store.get("u/s")
    (True, 1, None)
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path

from agentmem._fs import publish, write_temp
from agentmem.errors import InvalidInputError
from agentmem.security import secure_unlink

__all__ = ["FileSessionStore"]

SUFFIX = ".session"
STAGED_MAX_AGE_S = 3600.0  # a staged write older than this was left by a crashed writer
_LEASE = ".lease"


class FileSessionStore:
    """Sessions as files ``root/<folder>/<name>.session``; implements :class:`~agentmem.ports.SessionTierStore`."""

    def __init__(self, root: str | os.PathLike[str], name: str = "cold") -> None:
        self.name = name
        self.root = Path(root)
        self.trash = self.root / ".trash"
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    # -- paths ----------------------------------------------------------------------------------------
    def path(self, key: str) -> Path:
        folder, sep, name = key.partition("/")
        if not sep or not folder or not name or "/" in name or name.startswith(".") or folder.startswith("."):
            raise InvalidInputError(f"a session key is '<folder>/<name>', got {key!r}")
        return self.root / folder / f"{name}{SUFFIX}"

    @staticmethod
    def _key_of(path: Path) -> str:
        return f"{path.parent.name}/{path.name[: -len(SUFFIX)]}"

    # -- values ---------------------------------------------------------------------------------------
    def stage(self, key: str, data: bytes, *, last_used: float) -> str:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return str(write_temp(path, data, mtime=last_used))  # mtime = last use, for TTLs of unopened sessions

    def publish(self, token: str) -> None:
        staged = Path(token)
        # write_temp names it ".<name>.session.<random>.tmp" beside its target
        target = staged.parent / staged.name[1:].rsplit(".", 2)[0]
        publish(staged, target)

    def discard(self, token: str) -> None:
        secure_unlink(token, missing_ok=True)

    def get(self, key: str) -> bytearray | None:
        try:
            return _read(self.path(key))
        except FileNotFoundError:
            return None

    def last_used(self, key: str) -> float | None:
        try:
            return self.path(key).stat().st_mtime
        except FileNotFoundError:
            return None

    def delete(self, key: str) -> bool:
        self.trash.mkdir(exist_ok=True, mode=0o700)
        name = f"{time.time_ns()}-{os.getpid()}-{threading.get_ident()}.trashed"
        try:
            os.replace(self.path(key), self.trash / name)
        except FileNotFoundError:
            return False
        self._drop_empty_folder(key)
        return True

    def purge(self) -> int:
        self.cleanup_staged()
        if not self.trash.exists():
            return 0
        return sum(secure_unlink(p, missing_ok=True) for p in list(self.trash.iterdir()))

    def keys(self, folder: str | None = None) -> list[str]:
        pattern = f"*/*{SUFFIX}" if folder is None else f"{folder}/*{SUFFIX}"
        return [self._key_of(p) for p in self.root.glob(pattern) if not p.parent.name.startswith((".", "_"))]

    def nbytes(self) -> int:
        total = 0
        for key in self.keys():
            try:
                path = self.path(key)
                total += path.stat().st_size
            except FileNotFoundError:  # deleted by another process meanwhile
                pass
        return total

    def cleanup_staged(self, older_than_s: float = STAGED_MAX_AGE_S) -> int:
        """Erase temp files older than ``older_than_s``: a crashed writer's (a live one publishes within seconds,
        so the age makes this safe while other processes write)."""
        cutoff, n = time.time() - older_than_s, 0
        for tmp in self.root.glob("*/.*.tmp"):
            try:
                if tmp.stat().st_ctime <= cutoff:  # ctime: mtime is set to the session's last use
                    n += secure_unlink(tmp, missing_ok=True)
            except FileNotFoundError:  # published or discarded meanwhile
                continue
        return n

    # -- leases ---------------------------------------------------------------------------------------
    def acquire_lease(self, key: str, owner: str, ttl_s: float) -> bool:
        path = self.path(key).with_suffix(_LEASE)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with _locked(path) as f:
            holder = _lease_holder(f)
            if holder is not None and holder != owner:
                return False
            _write_lease(f, {"owner": owner, "expires": time.time() + ttl_s})
            return True

    def release_lease(self, key: str, owner: str) -> None:
        path = self.path(key).with_suffix(_LEASE)
        if not path.exists():
            return
        with _locked(path) as f:
            if _lease_holder(f) == owner:
                _write_lease(f, None)

    def _drop_empty_folder(self, key: str) -> None:
        # Lease files stay (they hold an owner id and an expiry, no user data): unlinking one that another process
        # is waiting to lock would hand that process a lease on a file nobody else sees.
        try:
            self.path(key).parent.rmdir()
        except OSError:  # not empty (other sessions, a lease, a staged write) or already gone
            pass


class _locked:
    """An exclusive ``flock`` on a lease file, opened read-write (created if missing)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self):  # type: ignore[no-untyped-def]
        self.f = open(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600), "r+b")
        fcntl.flock(self.f.fileno(), fcntl.LOCK_EX)
        return self.f

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.f.fileno(), fcntl.LOCK_UN)
        self.f.close()


def _lease_holder(f) -> str | None:  # type: ignore[no-untyped-def]
    f.seek(0)
    raw = f.read()
    try:
        lease = json.loads(raw) if raw.strip() else None
    except ValueError:  # a torn write: treat as free
        return None
    if not lease or lease.get("expires", 0) <= time.time():
        return None
    return str(lease.get("owner"))


def _write_lease(f, lease: dict | None) -> None:  # type: ignore[no-untyped-def,type-arg]
    f.seek(0)
    f.truncate()
    f.write(b"" if lease is None else json.dumps(lease).encode())
    f.flush()


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
