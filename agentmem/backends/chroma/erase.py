"""Erasure that reaches Chroma's files: erased vectors must not stay in ``chroma.sqlite3`` or HNSW segments.

Measured with Chroma 1.5.9 (``tests/unit/test_hardening_erasure.py``): ``collection.delete(ids)`` only marks HNSW
elements deleted (the float32 vectors stay in ``data_level0.bin``), the write-ahead log rows move to free pages,
and even ``delete_collection`` leaves the segment directories and those free pages on disk. So after deleting a
user's vectors:

* a collection left empty is dropped;
* a collection that still holds live vectors is **rebuilt**: the live vectors are copied into a fresh collection
  (``<name>-rebuild``), the old one is dropped, and the copy is renamed into place;
* the dropped collection's segment directories are overwritten and removed (:func:`secure_rmtree`), and
  ``chroma.sqlite3`` is vacuumed with ``secure_delete`` on, its full-text index optimised;
* freed heap memory is overwritten (:func:`scrub_freed_memory`, glibc's ``M_PERTURB``): Chroma's HNSW writer
  persists buffers it never initialised, and without this a *bystander's* ``data_level0.bin`` carried bytes of
  buffers the process had freed, such as another user's just-erased vectors.

Crash safety: the old collection is dropped only once the copy is complete, so a crash leaves either the old
collection (plus a partial copy, discarded by :func:`recover_rebuilds`) or the complete copy under its temporary
name (renamed by :func:`recover_rebuilds`). Cost: one pass over the user's live vectors and one ``VACUUM`` of
``chroma.sqlite3`` per erasure batch.

Example:
    >>> import chromadb
    >>> client, cosine = chromadb.PersistentClient(path="erase"), {"hnsw": {"space": "cosine"}}
    >>> col = client.create_collection("u-1", configuration=cosine, embedding_function=None)
    >>> col.add(ids=["a", "b"], embeddings=[[1.0, 0.0], [0.0, 1.0]], documents=["the door code is swordfish", "hi"])
    >>> col.delete(ids=["a"])  # only marked deleted: its vector and text stay in Chroma's files
    {'deleted': 1}
    >>> col = erase_collection_residue(client, "u-1", Path("erase"), cosine)  # rebuilt from its live vectors
    >>> col.get()["ids"], b"swordfish" in Path("erase/chroma.sqlite3").read_bytes()
    (['b'], False)
"""

from __future__ import annotations

import ctypes
import logging
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from agentmem.security.erase import scrub_sqlite, secure_rmtree

log = logging.getLogger(__name__)

REBUILD_SUFFIX = "-rebuild"
_PAGE = 1000
_CHROMA_FTS = "embedding_fulltext_search"


def erase_collection_residue(client: Any, name: str, chroma_dir: Path, configuration: dict[str, Any]) -> Any | None:
    """Drop collection ``name`` if it is empty, else rebuild it from its live vectors; wipe what the old one left.

    Returns the collection now standing under ``name`` (None when it was dropped or did not exist).

    Example:
        >>> import chromadb
        >>> client = chromadb.PersistentClient(path="emptied")
        >>> client.create_collection("u-1", embedding_function=None).add(ids=["a"], embeddings=[[1.0, 0.0]])
        >>> client.get_collection("u-1").delete(ids=["a"])
        {'deleted': 1}
        >>> erase_collection_residue(client, "u-1", Path("emptied"), {}), client.list_collections()  # left empty
        (None, [])
    """
    col = _get(client, name)
    if col is None:
        return None
    old_segments = segment_dirs(chroma_dir, str(col.id))
    if col.count() == 0:
        client.delete_collection(name)
        fresh = None
    else:
        fresh = _rebuild(client, col, name, configuration)
    for folder in old_segments:
        if folder.is_dir():
            secure_rmtree(folder)
    scrub_chroma_sqlite(chroma_dir)
    return fresh


def _rebuild(client: Any, col: Any, name: str, configuration: dict[str, Any]) -> Any:
    tmp_name = name + REBUILD_SUFFIX
    if _get(client, tmp_name) is not None:
        client.delete_collection(tmp_name)  # a partial copy from an interrupted rebuild
    fresh = client.create_collection(tmp_name, embedding_function=None, configuration=configuration)
    offset = 0
    while True:
        page = col.get(include=["embeddings", "metadatas", "documents"], limit=_PAGE, offset=offset)
        if not page["ids"]:
            break
        documents = page.get("documents")
        fresh.upsert(ids=page["ids"], embeddings=page["embeddings"], metadatas=page["metadatas"],
                     documents=documents if documents and any(d is not None for d in documents) else None)
        offset += len(page["ids"])
    client.delete_collection(name)  # only now: the copy is complete
    fresh.modify(name=name)
    return fresh


def has_rebuilds(client: Any) -> bool:
    """Whether an interrupted rebuild left a ``<name>-rebuild`` collection (cheap: lists names only).

    Example:
        >>> import chromadb
        >>> client = chromadb.PersistentClient(path="rebuilds")
        >>> has_rebuilds(client)
        False
        >>> _ = client.create_collection("u-1" + REBUILD_SUFFIX, embedding_function=None)  # a crash left a copy
        >>> has_rebuilds(client)
        True
    """
    return any(_name(c).endswith(REBUILD_SUFFIX) for c in client.list_collections())


def recover_rebuilds(client: Any) -> int:
    """Finish or discard rebuilds a crash interrupted; returns how many were found.

    Example:
        >>> import chromadb
        >>> client = chromadb.PersistentClient(path="recover")
        >>> _ = client.create_collection("u-1-rebuild", embedding_function=None)  # complete, the old one dropped
        >>> recover_rebuilds(client), [c.name for c in client.list_collections()]  # renamed into place
        (1, ['u-1'])
    """
    names = [_name(c) for c in client.list_collections()]
    found = 0
    for tmp_name in (n for n in names if n.endswith(REBUILD_SUFFIX)):
        found += 1
        target = tmp_name[: -len(REBUILD_SUFFIX)]
        if target in names:
            client.delete_collection(tmp_name)  # the old collection is intact: the copy was partial
        else:
            client.get_collection(tmp_name, embedding_function=None).modify(name=target)
            log.info("finished an interrupted vector rebuild for collection %s", target)
    return found


def segment_dirs(chroma_dir: Path, collection_id: str) -> list[Path]:
    """The on-disk segment directories of a collection (read from Chroma's ``segments`` table).

    Example:
        >>> segment_dirs(Path("/nonexistent"), "x")
        []
    """
    db = chroma_dir / "chroma.sqlite3"
    if not db.is_file():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        ids = [r[0] for r in conn.execute("SELECT id FROM segments WHERE collection = ?", (collection_id,))]
    except sqlite3.Error:
        return []
    finally:
        conn.close()
    return [chroma_dir / i for i in ids]


def scrub_chroma_sqlite(chroma_dir: Path) -> None:
    """Optimise Chroma's full-text index and VACUUM ``chroma.sqlite3`` (secure_delete on) so deleted rows,
    vectors in its log included, leave its free pages.

    Example:
        >>> import chromadb
        >>> client = chromadb.PersistentClient(path="scrub")
        >>> client.create_collection("u-1", embedding_function=None).add(
        ...     ids=["a", "b"], embeddings=[[1.0, 0.0], [0.0, 1.0]], documents=["the door code is swordfish"] * 2)
        >>> client.delete_collection("u-1"); db = Path("scrub/chroma.sqlite3")
        >>> b"swordfish" in db.read_bytes()  # the deleted rows' pages are free, not wiped
        True
        >>> scrub_chroma_sqlite(Path("scrub")); b"swordfish" in db.read_bytes()
        False
    """
    db = chroma_dir / "chroma.sqlite3"
    if not db.is_file():
        return
    conn = sqlite3.connect(db, timeout=30)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        conn.execute("PRAGMA secure_delete=ON")
        scrub_sqlite(conn, fts_tables=[_CHROMA_FTS] if _CHROMA_FTS in tables else [], vacuum=True)
    finally:
        conn.close()


_M_PERTURB = -6  # glibc mallopt(3)
_PERTURB_BYTE = 0xA5
_perturbed = False


def scrub_freed_memory() -> bool:
    """Ask glibc to overwrite heap memory when it is freed and when it is handed out again (``M_PERTURB``).

    Process-wide and idempotent; a no-op (False) off glibc or with ``AGENTMEM_MALLOC_PERTURB=0``. Large blocks
    (mmap-backed, e.g. tensors) are unaffected: they come fresh from the kernel, zeroed.

    Example:
        >>> scrub_freed_memory() in (True, False)
        True
    """
    global _perturbed
    if _perturbed:
        return True
    if not sys.platform.startswith("linux") or os.environ.get("AGENTMEM_MALLOC_PERTURB", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(None)
        _perturbed = bool(libc.mallopt(_M_PERTURB, _PERTURB_BYTE))
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return _perturbed


def _name(collection: Any) -> str:
    return collection.name if hasattr(collection, "name") else str(collection)


def _get(client: Any, name: str) -> Any | None:
    try:
        return client.get_collection(name, embedding_function=None)
    except Exception:  # chromadb raises NotFoundError (a ValueError subclass in some versions)
        return None


__all__ = ["REBUILD_SUFFIX", "erase_collection_residue", "has_rebuilds", "recover_rebuilds", "scrub_chroma_sqlite",
           "scrub_freed_memory", "segment_dirs"]
