"""Verified erasure: the marker scan is the ground truth for what a delete leaves behind.

The SQLite tests pin down, for the facade, exactly which settings make an erased memory
leave the files: secure_delete for free pages, FTS5 optimize for the lexical index, and a
WAL checkpoint(TRUNCATE) for the write-ahead log.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agentmem.errors import InvalidInputError
from agentmem.security.erase import (
    enable_secure_delete,
    marker_variants,
    scan_tree_for_markers,
    scrub_sqlite,
    secure_rmtree,
    secure_unlink,
)

MARKER = b"zqxjmarker7731"


def _db_with_erased_row(path: Path, *, secure_delete: bool, journal: str = "delete",
                        fts: bool = False) -> sqlite3.Connection:
    """A database where a row holding MARKER was inserted, committed and then DELETEd."""
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA journal_mode={journal}")
    conn.execute(f"PRAGMA secure_delete={'ON' if secure_delete else 'OFF'}")
    conn.execute("CREATE TABLE entries(id INTEGER PRIMARY KEY, content TEXT)")
    if fts:
        conn.execute("CREATE VIRTUAL TABLE entries_fts USING fts5(id UNINDEXED, content, "
                     "tokenize='porter unicode61')")
    rows = [(i, f"ordinary memory number {i} " * 8) for i in range(300)]
    # Mid-table, so the DELETE leaves the page well filled: deleting from a nearly empty
    # last page makes SQLite rebalance (rewrite) it, which hides the leak by accident.
    rows[150] = (999, f"remember that {MARKER.decode()} is the secret plan")
    conn.executemany("INSERT INTO entries VALUES (?, ?)", rows)
    if fts:
        conn.executemany("INSERT INTO entries_fts VALUES (?, ?)", rows)
    conn.commit()
    if journal == "wal":
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    conn.execute("DELETE FROM entries WHERE id = 999")
    if fts:
        conn.execute("DELETE FROM entries_fts WHERE id = 999")
    conn.commit()
    return conn


# -- the point for the facade: plain DELETE leaves the bytes ------------------------------------

def test_plain_delete_leaves_marker_but_secure_delete_does_not(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    _db_with_erased_row(plain / "catalog.db", secure_delete=False).close()
    assert scan_tree_for_markers(plain, [MARKER]) == {plain / "catalog.db": [MARKER]}

    secure = tmp_path / "secure"
    secure.mkdir()
    _db_with_erased_row(secure / "catalog.db", secure_delete=True).close()
    assert scan_tree_for_markers(secure, [MARKER]) == {}


def test_wal_keeps_marker_until_checkpoint_truncate(tmp_path: Path) -> None:
    conn = _db_with_erased_row(tmp_path / "catalog.db", secure_delete=True, journal="wal")
    try:
        leftovers = scan_tree_for_markers(tmp_path, [MARKER])
        assert tmp_path / "catalog.db-wal" in leftovers  # old page images in the WAL
        report = scrub_sqlite(conn)
        assert report.wal_truncated
        assert scan_tree_for_markers(tmp_path, [MARKER]) == {}
    finally:
        conn.close()


def test_fts5_index_keeps_marker_until_optimize(tmp_path: Path) -> None:
    conn = _db_with_erased_row(tmp_path / "catalog.db", secure_delete=True, journal="wal", fts=True)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        # secure_delete alone is not enough: FTS5 keeps deleted terms in its segments.
        assert tmp_path / "catalog.db" in scan_tree_for_markers(tmp_path, [MARKER])
        report = scrub_sqlite(conn, fts_tables=["entries_fts"])
        assert report.fts_optimized == ("entries_fts",)
        assert scan_tree_for_markers(tmp_path, [MARKER], ignore_case=True) == {}
        # the live rows are still searchable afterwards
        assert conn.execute("SELECT count(*) FROM entries_fts WHERE entries_fts MATCH 'ordinary'").fetchone()[0] == 299
    finally:
        conn.close()


def test_vacuum_cleans_a_file_deleted_without_secure_delete(tmp_path: Path) -> None:
    _db_with_erased_row(tmp_path / "chroma.sqlite3", secure_delete=False).close()
    assert scan_tree_for_markers(tmp_path, [MARKER])
    report = scrub_sqlite(tmp_path / "chroma.sqlite3", vacuum=True)
    assert report.vacuumed
    assert scan_tree_for_markers(tmp_path, [MARKER]) == {}


def test_enable_secure_delete_listener(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db")
    conn.execute("PRAGMA secure_delete=OFF")
    enable_secure_delete(conn)
    assert conn.execute("PRAGMA secure_delete").fetchone()[0] == 1
    conn.close()
    with pytest.raises(InvalidInputError):
        scrub_sqlite(sqlite3.connect(":memory:"), fts_tables=["x; DROP TABLE y"])


# -- the scanner itself -----------------------------------------------------------------------

def test_scan_covers_hidden_nested_and_chunk_boundaries(tmp_path: Path) -> None:
    (tmp_path / "kv" / "ab").mkdir(parents=True)
    (tmp_path / ".hidden").write_bytes(b"xx" + MARKER)
    (tmp_path / "kv" / "ab" / "e1.safetensors").write_bytes(os.urandom(100) + b"OTHER")
    # Marker straddles the 64-byte chunk boundary.
    (tmp_path / "catalog.db-wal").write_bytes(b"\0" * 60 + MARKER + b"\0" * 60)
    (tmp_path / "link").symlink_to(tmp_path / ".hidden")  # not followed: not double-counted
    found = scan_tree_for_markers(tmp_path, [MARKER, b"OTHER", b"absent"], chunk_size=64)
    assert found == {
        tmp_path / ".hidden": [MARKER],
        tmp_path / "catalog.db-wal": [MARKER],
        tmp_path / "kv" / "ab" / "e1.safetensors": [b"OTHER"],
    }
    assert scan_tree_for_markers(tmp_path / ".hidden", [MARKER]) == {tmp_path / ".hidden": [MARKER]}


def test_scan_ignore_case_and_encodings(tmp_path: Path) -> None:
    (tmp_path / "fts").write_bytes(b"...zqxj-secret-plan...")  # an FTS index lower-cases tokens
    (tmp_path / "utf16").write_bytes("ZQXJ-Other".encode("utf-16-le"))
    assert scan_tree_for_markers(tmp_path, [b"ZQXJ-SECRET-PLAN"]) == {}
    assert scan_tree_for_markers(tmp_path, [b"ZQXJ-SECRET-PLAN"], ignore_case=True) == {
        tmp_path / "fts": [b"ZQXJ-SECRET-PLAN"]
    }
    assert list(scan_tree_for_markers(tmp_path, marker_variants("ZQXJ-Other"))) == [tmp_path / "utf16"]


def test_scan_rejects_empty_markers(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError):
        scan_tree_for_markers(tmp_path, [])
    with pytest.raises(InvalidInputError):
        scan_tree_for_markers(tmp_path, [b""])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_scan_skips_fifos(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")  # opening it for reading would block forever
    assert scan_tree_for_markers(tmp_path, [MARKER]) == {}


# -- secure unlink ----------------------------------------------------------------------------

def test_a_reader_with_the_file_mapped_survives_secure_unlink(tmp_path: Path) -> None:
    # A mount maps blob files (EntryStore.map_blob) while another thread or process may forget them. Truncating a
    # mapped file would kill the reader with SIGBUS, so this runs in a child process and checks it exits cleanly.
    target = tmp_path / "e1.kv"
    target.write_bytes(MARKER * 5000)
    code = (
        "import sys\n"
        "from agentmem._fs import map_readonly\n"
        "from agentmem.security.erase import secure_unlink\n"
        "view = map_readonly(sys.argv[1])\n"
        "secure_unlink(sys.argv[1])\n"
        "data = bytes(view)\n"  # touches every page of the mapping after the erase
        "assert len(data) == int(sys.argv[2]) and data.count(0) == len(data), 'erased bytes must read as zeros'\n"
    )
    run = subprocess.run([sys.executable, "-c", code, str(target), str(len(MARKER) * 5000)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"reader died (signal {-run.returncode})" if run.returncode < 0 else run.stderr
    assert not target.exists()


def test_secure_unlink_overwrites_before_unlinking(tmp_path: Path) -> None:
    target = tmp_path / "e1.kv"
    target.write_bytes(MARKER * 1000)
    keep = tmp_path / "hardlink"
    os.link(target, keep)  # a second name lets us observe the bytes after the unlink
    assert secure_unlink(target) is True
    assert not target.exists()
    left = keep.read_bytes()  # zeroed in place (not truncated, so concurrent memory-mapped readers survive)
    assert len(left) == len(MARKER) * 1000 and left.count(0) == len(left)
    assert secure_unlink(target, missing_ok=True) is False
    with pytest.raises(FileNotFoundError):
        secure_unlink(target)


def test_secure_unlink_does_not_follow_symlinks(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"not ours")
    link = tmp_path / "link"
    link.symlink_to(outside)
    secure_unlink(link)
    assert not link.exists() and outside.read_bytes() == b"not ours"
    with pytest.raises(InvalidInputError):
        secure_unlink(tmp_path)


def test_secure_rmtree(tmp_path: Path) -> None:
    seg = tmp_path / "chroma" / "segment"
    seg.mkdir(parents=True)
    for name in ("data_level0.bin", "header.bin", "link_lists.bin"):
        (seg / name).write_bytes(MARKER)
    assert secure_rmtree(tmp_path / "chroma") == 3
    assert not (tmp_path / "chroma").exists()


def test_a_scan_of_an_open_catalog_leaves_its_sqlite_locks_in_place(tmp_path: Path) -> None:
    """Scanning a store that this process has open must not drop this process's SQLite locks.

    Before the scan ran in a child process, it opened and closed catalog.db, -wal and -shm here, which under POSIX
    released every lock this process held on them; a second process closing the store next took itself for the
    last user and deleted -wal and -shm under the open catalog: this process's next connection got "disk I/O
    error" (the fuzz violations of issue #41) and its writes since went to a deleted WAL.
    """
    from agentmem.backends.sqlite.catalog import SqliteCatalog
    from agentmem.ports.catalog import EntryRecord

    def row(i: str) -> EntryRecord:
        return EntryRecord(id=i, user_id="u", kind="turn", text=i, memory_text=i, created_at=0.0)

    db = tmp_path / "catalog.db"
    catalog = SqliteCatalog(str(db))
    catalog.insert([row("e1")], index_texts=["one"])
    assert scan_tree_for_markers(tmp_path, [MARKER]) == {}
    other = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('SELECT count(*) FROM entries'); c.close()"
    subprocess.run([sys.executable, "-c", other, str(db)], check=True, timeout=60)
    assert (tmp_path / "catalog.db-wal").exists(), "another process deleted the WAL of an open catalog"
    catalog.insert([row("e2")], index_texts=["two"])
    second = SqliteCatalog(str(db))  # a new connection of this process (what failed with "disk I/O error")
    assert sorted(r.id for r in second.get(["e1", "e2"])) == ["e1", "e2"]
    second.close()
    catalog.close()
    reopened = SqliteCatalog(str(db))
    assert sorted(r.id for r in reopened.get(["e1", "e2"])) == ["e1", "e2"], "a write went to a deleted WAL"
    reopened.close()


def test_scan_of_a_missing_root_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        scan_tree_for_markers(tmp_path / "nope", [MARKER])
