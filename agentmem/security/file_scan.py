"""The byte scan behind :func:`agentmem.security.scan_tree_for_markers`, run in a process of its own.

Why a process of its own: POSIX drops *every* ``fcntl`` lock a process holds on a file when that process closes
*any* descriptor of the file (https://www.sqlite.org/howtocorrupt.html, section 2.2). A scan that opened and
closed ``catalog.db`` or its ``-wal``/``-shm`` in the process that has the store open silently released that
process's SQLite locks: the next process to close its last connection then believed itself the last user,
checkpointed and deleted ``-wal`` and ``-shm`` under the open connections, so the first process's next connection
failed with ``disk I/O error`` and its commits went to a deleted WAL (lost). A child process's locks are its own.

This module imports only the standard library (it runs as ``python -I -S file_scan.py``): a JSON request on
stdin (``root``, ``needles`` as hex, ``ignore_case``, ``chunk_size``), a JSON answer on stdout:
``{"found": {path: [needle index, ...]}}`` or ``{"error": [errno, strerror, filename]}``.

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.bin").write_bytes(b"..MARK..")
    >>> {pathlib.Path(p).name: hits for p, hits in scan(d, [b"MARK", b"nope"], False, 1 << 20).items()}
    {'a.bin': [0]}
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path


def scan(root: str | os.PathLike[str], needles: list[bytes], ignore_case: bool, chunk_size: int
         ) -> dict[str, list[int]]:
    """Every regular file under ``root`` (or ``root`` itself) holding a needle: {path: sorted needle indices}.

    ``needles`` are already lower-cased when ``ignore_case``. Call it from a process that holds no SQLite
    connection to the files (see the module docstring); :func:`scan_tree_for_markers` does.
    """
    found: dict[str, list[int]] = {}
    for path in _regular_files(Path(root)):
        hits = _scan_file(path, needles, ignore_case, chunk_size)
        if hits:
            found[str(path)] = sorted(hits)
    return found


def _regular_files(root: Path) -> Iterable[Path]:
    st = os.lstat(root)
    if stat.S_ISREG(st.st_mode):
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:  # removed while we walked (e.g. a -journal)
                continue
            if stat.S_ISREG(mode):  # never open FIFOs/sockets: a read could block forever
                yield path


def _scan_file(path: Path, needles: list[bytes], ignore_case: bool, chunk_size: int) -> set[int]:
    hits: set[int] = set()
    keep = max(len(m) for m in needles) - 1  # overlap so a marker split across chunks is seen
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return hits
    with f:
        tail = b""
        while len(hits) < len(needles):
            block = f.read(chunk_size)
            if not block:
                break
            window = tail + (block.lower() if ignore_case else block)
            for i, m in enumerate(needles):
                if i not in hits and m in window:
                    hits.add(i)
            tail = window[-keep:] if keep else b""
    return hits


def _main() -> None:
    request = json.load(sys.stdin)
    try:
        found = scan(request["root"], [bytes.fromhex(n) for n in request["needles"]], request["ignore_case"],
                     request["chunk_size"])
        answer: dict[str, object] = {"found": found}
    except OSError as exc:  # unreadable: the caller re-raises it (a scan that skipped files proves nothing)
        answer = {"error": [exc.errno, exc.strerror, exc.filename]}
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    _main()
