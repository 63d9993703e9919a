"""Verified erasure: find leftover bytes, overwrite files, scrub SQLite after deletes.

Deleting a row or a file removes a *name*, not the bytes. Measured with SQLite 3.40 and
Chroma 1.5 (see docs/security.md), erased text survives in:

* SQLite free pages, unless ``PRAGMA secure_delete=ON`` was set on the deleting connection;
* the ``-wal`` file, until ``PRAGMA wal_checkpoint(TRUNCATE)`` (or the last connection closes);
* FTS5 index segments, even with secure_delete, until ``INSERT INTO t(t) VALUES('optimize')``;
* Chroma's ``chroma.sqlite3`` (its ``embeddings_queue`` log, then free pages) until the log is
  purged and the file is VACUUMed, and deleted vectors stay in the HNSW ``data_level0.bin``
  (hnswlib only marks them deleted) until the collection is rebuilt.

:func:`scan_tree_for_markers` is the ground truth for tests and the reliability benchmark:
plant a unique marker, erase, and require that no file under the store holds it.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.bin").write_bytes(b"..MARK-1..")
>>> {p.name: m for p, m in scan_tree_for_markers(d, [b"MARK-1", b"MARK-2"]).items()}
{'a.bin': [b'MARK-1']}
>>> _ = secure_unlink(d / "a.bin"); scan_tree_for_markers(d, [b"MARK-1"])
{}
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from agentmem.errors import InvalidInputError

from agentmem._fs import fsync_dir

_CHUNK = 1 << 20
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# -- finding leftovers -------------------------------------------------------------------------

def scan_tree_for_markers(root: str | os.PathLike[str], markers: Sequence[bytes], *,
                          ignore_case: bool = False, chunk_size: int = _CHUNK) -> dict[Path, list[bytes]]:
    """Every regular file under ``root`` (or ``root`` itself) that contains a marker.

    Reads raw bytes, so it sees SQLite free pages, ``-wal``/``-shm``/``-journal`` files,
    Chroma's segment files and hidden files alike. Symlinks are not followed (a link out of
    the store is not the store's data). ``ignore_case`` folds ASCII case, which matters for
    FTS indexes that store lower-cased tokens. Unreadable files raise: a scan that skipped
    files could not prove anything.

    Safe on a store that is open in this process: the files are read by a child process
    (:mod:`agentmem.security.file_scan` says why: closing a descriptor of a SQLite file here
    would drop this process's locks on it, and another process could then delete the WAL
    under the open connections).
    """
    needles = [bytes(m) for m in markers]
    if not needles or any(not m for m in needles):
        raise InvalidInputError("markers must be a non-empty list of non-empty bytes")
    wanted = [m.lower() for m in needles] if ignore_case else needles
    request = {"root": os.fspath(root), "needles": [m.hex() for m in wanted], "ignore_case": ignore_case,
               "chunk_size": max(chunk_size, 2 * max(len(m) for m in wanted))}
    # -I -S: no site-packages, no environment: the worker needs only the standard library, and starts in ~20 ms
    done = subprocess.run([sys.executable, "-I", "-S", str(Path(__file__).with_name("file_scan.py"))],
                          input=json.dumps(request), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the marker scan of {root} failed: {done.stderr.strip()[-2000:]}")
    answer = json.loads(done.stdout)
    if "error" in answer:
        raise OSError(*answer["error"])  # OSError(errno, ...) builds the matching subclass (PermissionError, ...)
    return {Path(path): [needles[i] for i in hits] for path, hits in answer["found"].items()}


def marker_variants(marker: str) -> list[bytes]:
    """The encodings a text marker may take on disk (UTF-8, UTF-16 LE/BE).

    >>> marker_variants("ab")
    [b'ab', b'a\\x00b\\x00', b'\\x00a\\x00b']
    """
    return [marker.encode("utf-8"), marker.encode("utf-16-le"), marker.encode("utf-16-be")]


# -- overwriting files -------------------------------------------------------------------------

def secure_unlink(path: str | os.PathLike[str], *, missing_ok: bool = False) -> bool:
    """Overwrite a file's bytes with zeros, fsync, then unlink it (best effort).

    Returns False only when the file was missing and ``missing_ok``. A symlink is unlinked
    without touching its target. Other hard links to the file see the zeros too.
    The file is not truncated: a reader that has it memory-mapped at this moment (a mount in
    progress, see ``EntryStore.map_blob``) would be killed by SIGBUS; it reads zeros instead,
    and the zeroed blocks are freed once the last reader lets go.

    Limits: this only helps on filesystems that rewrite blocks in place (ext4 data=ordered,
    XFS, NTFS). Copy-on-write and log-structured filesystems (btrfs, ZFS, APFS, F2FS),
    snapshots, backups, SSD wear levelling/TRIM and swap may all keep old copies. Encrypting
    at rest and destroying the key is the only reliable erasure on such storage.
    """
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        if missing_ok:
            return False
        raise
    if stat.S_ISLNK(st.st_mode):
        os.unlink(p)
        return True
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInputError(f"secure_unlink only handles regular files: {p}")
    try:
        fd = os.open(p, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0))
        try:
            _overwrite(fd, os.fstat(fd).st_size)  # fsyncs; no truncation (see above)
        finally:
            os.close(fd)
        os.unlink(p)
    except FileNotFoundError:  # another eraser (a second sweep of the same trash) removed it meanwhile
        if missing_ok:
            return False
        raise
    fsync_dir(p.parent)
    return True


def secure_rmtree(root: str | os.PathLike[str]) -> int:
    """:func:`secure_unlink` every file under ``root``, then remove the directories.

    Returns how many files were overwritten. For rebuilding an index directory (e.g. a Chroma
    HNSW segment that still holds deleted vectors) without leaving its old bytes behind.
    """
    root = Path(root)
    count = 0
    for dirpath, dirnames, filenames in os.walk(root, topdown=False, followlinks=False):
        for name in filenames:
            count += secure_unlink(Path(dirpath) / name, missing_ok=True)
        for name in dirnames:
            d = Path(dirpath) / name
            if d.is_symlink():
                d.unlink()
            else:
                d.rmdir()
    root.rmdir()
    return count


def _overwrite(fd: int, size: int) -> None:
    zeros = bytes(min(size, _CHUNK))
    done = 0
    while done < size:
        done += os.write(fd, zeros[: min(len(zeros), size - done)])
    os.fsync(fd)


# -- SQLite ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ScrubReport:
    """What :func:`scrub_sqlite` did; ``wal_truncated`` is False when readers blocked it."""

    fts_optimized: tuple[str, ...]
    vacuumed: bool
    wal_truncated: bool


def enable_secure_delete(dbapi_conn: Any, _record: Any = None) -> None:
    """``PRAGMA secure_delete=ON`` for a DB-API connection; usable as a SQLAlchemy
    ``connect`` listener: ``event.listen(engine, "connect", enable_secure_delete)``.

    The pragma is per connection and its build default varies (on in some distributions'
    SQLite, off in others), so set it on every connection that deletes.
    """
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA secure_delete=ON")
    finally:
        cur.close()


def scrub_sqlite(conn: Any, *, fts_tables: Iterable[str] = (), vacuum: bool = False) -> ScrubReport:
    """After deleting rows, push their bytes out of FTS5 segments, free pages and the WAL.

    ``conn`` is a DB-API SQLite connection (``sqlite3.connect(...)`` or SQLAlchemy's
    ``engine.raw_connection()``), or a path. Steps: FTS5 ``optimize`` for each table in
    ``fts_tables`` (deleted docs stay in index segments otherwise), optional ``VACUUM``
    (needed when the deleting connection lacked secure_delete, or for a file someone
    else writes, such as chroma.sqlite3), then ``wal_checkpoint(TRUNCATE)``.
    Cost grows with the index/database size: run it after an erasure batch, not per row.
    """
    if isinstance(conn, (str, os.PathLike)):
        import sqlite3

        owned = sqlite3.connect(os.fspath(conn))
        try:
            enable_secure_delete(owned)
            return scrub_sqlite(owned, fts_tables=fts_tables, vacuum=vacuum)
        finally:
            owned.close()
    tables = tuple(fts_tables)
    for t in tables:
        if not _IDENT.fullmatch(t):
            raise InvalidInputError(f"not a plain table name: {t!r}")
    cur = conn.cursor()
    try:
        for t in tables:
            cur.execute(f"INSERT INTO {t}({t}) VALUES('optimize')")
        conn.commit()
        if vacuum:
            cur.execute("VACUUM")
            conn.commit()
        cur.execute("PRAGMA journal_mode")
        wal = str(cur.fetchone()[0]).lower() == "wal"
        truncated = True
        if wal:
            cur.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            busy = cur.fetchone()[0]
            truncated = busy == 0
    finally:
        cur.close()
    return ScrubReport(tables, vacuum, truncated)


__all__ = [
    "ScrubReport",
    "enable_secure_delete",
    "marker_variants",
    "scan_tree_for_markers",
    "scrub_sqlite",
    "secure_rmtree",
    "secure_unlink",
]
