"""Crash-safe file writes shared by the store, the session tiers, training checkpoints and security files.

One recipe everywhere: write a temporary file next to the target, fsync it, publish it with one rename (or a
hard link when an existing file must win), then fsync the directory so the rename itself survives a crash.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "f.json"
>>> atomic_create(p, b"one"), atomic_create(p, b"two"), p.read_bytes()
(True, False, b'one')
"""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file at ``path`` and fsync it (the caller publishes it)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_temp(path: Path, data: bytes, *, mode: int | None = None, mtime: float | None = None) -> Path:
    """Write ``data`` to a fsynced temporary file beside ``path`` (same directory, so a rename is atomic)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if mode is not None and hasattr(os, "fchmod"):
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mtime is not None:
            os.utime(tmp, (mtime, mtime))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def publish(tmp: Path, path: Path) -> None:
    """Rename a temporary file onto ``path`` atomically and durably (the temp file is removed on failure)."""
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` all at once (tmp file + fsync + ``os.replace``)."""
    path = Path(path)
    publish(write_temp(path, data, mode=mode), path)


def atomic_create(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600) -> bool:
    """Create ``path`` with ``data`` only if it does not exist; False if someone else won.

    ``os.replace`` would silently overwrite a concurrent creator's file (two processes
    opening a new store would each write their own salt, and one's data would become
    unreadable), so the tmp file is published with ``os.link``, which fails on an existing
    name. Where hard links are unsupported, ``O_EXCL`` keeps exclusivity (not atomicity).
    """
    path = Path(path)
    tmp = write_temp(path, data, mode=mode)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a directory, created ``0700`` (and its missing parents the usual way) if it does not exist.

    An existing directory keeps its mode: it may be the caller's own, shared on purpose.

    >>> import tempfile, pathlib, stat
    >>> d = private_dir(pathlib.Path(tempfile.mkdtemp()) / "store")
    >>> oct(stat.S_IMODE(d.stat().st_mode) & 0o077)
    '0o0'
    """
    path = Path(path)
    if not path.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
    return path


def private_file(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` empty and ``0600`` if it does not exist, so whoever opens it next (SQLite, which gives its
    journal and WAL files the database file's mode) never makes it world-readable. An existing file is untouched.

    >>> import tempfile, pathlib, stat
    >>> f = private_file(pathlib.Path(tempfile.mkdtemp()) / "catalog.db")
    >>> oct(stat.S_IMODE(f.stat().st_mode))
    '0o600'
    """
    path = Path(path)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    return path


def map_readonly(path: str | os.PathLike[str]) -> memoryview:
    """A read-only, memory-mapped view of a file: the page-cache pages are mapped, nothing is copied.

    Safe for files that are replaced by rename (the old inode stays valid while mapped) or overwritten in place
    (readers then see the new bytes). Never truncate a file someone may have mapped: touching a mapping past the
    new end of file kills the process with SIGBUS. That is why ``secure_unlink`` overwrites without truncating.
    The mapping is released when the last object made from the view (e.g. a tensor) is dropped.
    """
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return memoryview(b"")  # mmap refuses empty files; the caller's decoder reports the truncation
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


__all__ = ["atomic_create", "atomic_write", "fsync_dir", "map_readonly", "private_dir", "private_file", "publish",
           "write_synced", "write_temp"]
