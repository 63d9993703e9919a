"""Crash-safe small-file writes for store-level security files (key check, salts).

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "f.json"
>>> atomic_create(p, b"one"), atomic_create(p, b"two"), p.read_bytes()
(True, False, b'one')
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not possible (nor needed) on Windows.
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


def _write_tmp(path: Path, data: bytes, mode: int) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode) if hasattr(os, "fchmod") else None
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def atomic_write(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` all at once (tmp file + fsync + ``os.replace``)."""
    path = Path(path)
    tmp = _write_tmp(path, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_create(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600) -> bool:
    """Create ``path`` with ``data`` only if it does not exist; False if someone else won.

    ``os.replace`` would silently overwrite a concurrent creator's file (two processes
    opening a new store would each write their own salt, and one's data would become
    unreadable), so the tmp file is published with ``os.link``, which fails on an existing
    name. Where hard links are unsupported, ``O_EXCL`` keeps exclusivity (not atomicity).
    """
    path = Path(path)
    tmp = _write_tmp(path, data, mode)
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
    _fsync_dir(path.parent)
    return True
