"""The entry store: catalog row + vector + optional KV blob, written all-or-nothing.

Write order (so a crash leaves only detectable, cleanable leftovers):
    blob → temporary file  →  vector upserted  →  row committed  →  blob renamed into place
Opening the store reconciles: vectors and blobs without a committed row are erased; a committed row
whose blob is still a temporary file gets the rename completed.

Example:
    >>> store = EntryStore(Path("/tmp/mem"))                          # doctest: +SKIP
    >>> store.add([NewEntry(row=..., index_text=..., tags=[...])])     # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentmem._fs import map_readonly, write_synced
from agentmem.config import MemoryConfig
from agentmem.errors import BlobCorruptedError
from agentmem.store.catalog import Catalog, EntryRow
from agentmem.store.filters import Predicate
from agentmem.store.retrieval import fuse, session_boost, spill_over
from agentmem.store.vectors import Embedder, VectorIndex, chroma_where
from agentmem.security.blind import BlindIndex
from agentmem.security.crypto import Cipher, entry_aad
from agentmem.security.erase import secure_unlink

log = logging.getLogger(__name__)

BlobSealer = Callable[[bytes, str], bytes]  # (plaintext, entry id) -> bytes on disk, and the reverse


@dataclass
class NewEntry:
    row: EntryRow
    embed_text: str
    index_text: str
    tags: Sequence[str] = ()
    blob: bytes | None = None  # KV blob bytes (already sealed/encrypted by the caller's policy)


@dataclass
class Scope:
    user_id: str
    session_id: str | None = None
    kinds: Sequence[str] | None = None
    tags: Sequence[str] | None = None
    predicate: Predicate | None = None

    def admits(self, row: EntryRow, now: float) -> bool:
        if row.user_id != self.user_id:
            return False
        if self.session_id is not None and row.session_id != self.session_id:
            return False
        if self.kinds and row.kind not in self.kinds:
            return False
        if row.expires_at is not None and row.expires_at <= now:
            return False
        if self.tags and not set(self.tags) <= set(row.tags):
            return False
        return self.predicate is None or self.predicate(row.metadata_json or {})


@dataclass
class ScoredRow:
    row: EntryRow
    score: float
    scores: dict[str, float] = field(default_factory=dict)


class EntryStore:
    """Catalog (SQLite) + vector index (Chroma) + KV blob directory under one root folder."""

    def __init__(self, root: Path, config: MemoryConfig, *, embedder: Embedder | None = None,
                 cipher: Cipher | None = None) -> None:
        self.root = root
        self.cipher = cipher
        # encrypted stores keep keyed word hashes, not words, in the lexical index
        self._blind_index = BlindIndex(cipher.index_key) if cipher is not None else None
        self.config = config
        root.mkdir(parents=True, exist_ok=True)
        self.kv_dir = root / "kv"
        self.kv_dir.mkdir(exist_ok=True)
        self.catalog = Catalog(str(root / "catalog.db"), busy_timeout_ms=config.busy_timeout_ms)
        # Chroma cannot be encrypted: with a cipher it never gets the text, only vectors and scope fields.
        self.vectors = VectorIndex(root / "chroma", keep_documents=config.keep_text_in_index and cipher is None)
        self.embedder = embedder or Embedder(config.embedding_model, cache_dir=config.cache_dir)
        self._lock = threading.RLock()
        # the lexical search runs beside the query embedding (SQLite, ONNX Runtime and torch release the GIL)
        self._lexical_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentmem-lexical")
        self.reconcile()

    # --- writes --------------------------------------------------------------------------------
    def add(self, entries: Sequence[NewEntry], vectors: np.ndarray | None = None) -> None:
        """Write entries all-or-nothing (see module docstring for the order)."""
        if not entries:
            return
        if vectors is None:
            vectors = self.embedder.encode([e.embed_text for e in entries], batch_size=self.config.embedding_batch_size)
        tmp_paths: list[tuple[Path, Path]] = []
        with self._lock:
            try:
                for e in entries:
                    if e.blob is not None:
                        final = self.blob_path(e.row.id)
                        tmp = _write_tmp(final, self._seal(e.row.id, e.blob))
                        tmp_paths.append((tmp, final))
                        e.row.kv_path = str(final.relative_to(self.root))
                self.vectors.add(
                    [e.row.user_id for e in entries], [e.row.id for e in entries], vectors,
                    [_vector_metadata(e.row) for e in entries], [e.embed_text for e in entries],
                )
                try:
                    index_texts = [e.index_text if self._blind_index is None else self._blind_index.text(e.index_text)
                                   for e in entries]
                    self.catalog.insert([e.row for e in entries], index_texts=index_texts,
                                        tags=[e.tags for e in entries])
                except BaseException:
                    for user in {e.row.user_id for e in entries}:
                        self.vectors.delete([e.row.id for e in entries if e.row.user_id == user], user_id=user)
                    raise
            except BaseException:
                for tmp, _ in tmp_paths:
                    tmp.unlink(missing_ok=True)
                raise
            for tmp, final in tmp_paths:
                os.replace(tmp, final)

    def attach_blob(self, entry_id: str, blob: bytes, **kv_fields: Any) -> bool:
        """Attach (or replace) an entry's KV blob; False if the entry no longer exists."""
        final = self.blob_path(entry_id)
        with self._lock:
            if not self.catalog.existing([entry_id]):
                return False
            tmp = _write_tmp(final, self._seal(entry_id, blob))
            try:
                self.catalog.update_kv(entry_id, kv_path=str(final.relative_to(self.root)), **kv_fields)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            os.replace(tmp, final)
            return True

    def delete(self, ids: Sequence[str]) -> list[EntryRow]:
        """Erase rows, vectors and blobs; returns the rows that existed."""
        deleted: list[EntryRow] = []
        with self._lock:
            for i in range(0, len(ids), 500):
                chunk = list(ids[i : i + 500])
                rows = self.catalog.delete(chunk)  # row first: a crash after it leaves only orphans
                for user in {r.user_id for r in rows}:
                    self.vectors.delete([r.id for r in rows if r.user_id == user], user_id=user)
                for row in rows:
                    if row.kv_path:
                        _erase_file(self.root / row.kv_path)
                deleted += rows
            if deleted:
                self.catalog.scrub(user_ids={r.user_id for r in deleted})
        return deleted

    # --- reads ---------------------------------------------------------------------------------
    def blob_path(self, entry_id: str) -> Path:
        return self.kv_dir / entry_id[:2] / f"{entry_id}.kv"

    def read_blob(self, row: EntryRow) -> bytes:
        if not row.kv_path:
            raise BlobCorruptedError(f"entry {row.id} has no KV blob")
        try:
            data = (self.root / row.kv_path).read_bytes()
        except OSError as exc:
            raise BlobCorruptedError(f"KV blob of entry {row.id} is unreadable: {exc.strerror}") from exc
        if self.cipher is not None:
            data = self.cipher.decrypt(data, aad=entry_aad(row.id, "kv"))  # BlobCorruptedError if tampered
        return data

    def map_blob(self, row: EntryRow) -> bytes | memoryview:
        """The entry's blob for a one-shot read, without copying it when the store is not encrypted.

        Plaintext blobs are memory-mapped (the 94 MB of a 2,048-token mount would otherwise be copied into fresh
        buffers on every mount); encrypted ones are read and decrypted as by :meth:`read_blob`. Safe against a
        concurrent ``forget``: erasure overwrites without truncating, so a reader sees zeros, never a SIGBUS.
        """
        if self.cipher is not None or not row.kv_path:
            return self.read_blob(row)
        try:
            return map_readonly(self.root / row.kv_path)
        except (OSError, ValueError) as exc:
            raise BlobCorruptedError(f"KV blob of entry {row.id} is unreadable: {exc}") from exc

    def _seal(self, entry_id: str, blob: bytes) -> bytes:
        return blob if self.cipher is None else self.cipher.encrypt(blob, aad=entry_aad(entry_id, "kv"))

    def search(self, query: str, scope: Scope, *, k: int, now: float | None = None,
               query_vector: np.ndarray | None = None) -> list[ScoredRow]:
        """Hybrid dense + lexical search within ``scope``; best first, at most ``k``."""
        now = time.time() if now is None else now
        pool = max(self.config.candidate_pool, 4 * k)
        lexical_job = self._lexical_worker.submit(
            self.catalog.lexical_search, query, user_id=scope.user_id, limit=pool,
            blind=self._blind_index.token if self._blind_index else None)
        vec = self.embedder.encode([query])[0] if query_vector is None else query_vector
        lexical = dict(lexical_job.result())
        where = chroma_where(session_id=scope.session_id,
                             kind=list(scope.kinds) if scope.kinds else None)
        hits = self._fused(vec, lexical, scope, where, pool, now, ids=None, k=k)
        if len(hits) < k and (scope.tags or scope.predicate):
            # Restrictive filters can reject the whole candidate pool: search only the admitted ids.
            allowed = [i for page in self.catalog.iter_ids(self.catalog.scope_select(
                user_id=scope.user_id, session_id=scope.session_id, kinds=scope.kinds, tags=scope.tags, alive_at=now))
                for i in page]
            if scope.predicate is not None:
                allowed = [r.id for r in self.catalog.get(allowed) if scope.admits(r, now)]
            if allowed:
                admitted = set(allowed)
                hits = self._fused(vec, {i: s for i, s in lexical.items() if i in admitted}, scope, where,
                                   max(pool, len(allowed)), now, ids=allowed, k=k)
        return hits[:k]

    def _fused(self, vec: np.ndarray, lexical: dict[str, float], scope: Scope, where: dict[str, Any] | None,
               pool: int, now: float, ids: Sequence[str] | None, k: int) -> list[ScoredRow]:
        dense = dict(self.vectors.query(vec, user_id=scope.user_id, n=pool, where=where, ids=ids))
        fused = fuse(dense, lexical)
        places = self.catalog.turn_context(list(fused))
        fused = spill_over(fused, places)
        # neighbours reached by spillover share the session of the turn that reached them
        sessions = {i: p.session_id for i, p in places.items()}
        for place in places.values():
            for neighbour in (*place.before, *place.after):
                sessions.setdefault(neighbour, place.session_id)
        fused = session_boost(fused, sessions)
        ranked = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))
        out: list[ScoredRow] = []
        # Load rows best-first in small pages: materialising the whole pool would cost more than the search.
        step = max(2 * k, 10)
        for start in range(0, len(ranked), step):
            page = ranked[start : start + step]
            rows = {r.id: r for r in self.catalog.get([i for i, _ in page])}
            for entry_id, score in page:
                row = rows.get(entry_id)
                if row is not None and scope.admits(row, now):
                    parts = {"dense": dense[entry_id]} if entry_id in dense else {}
                    if entry_id in lexical:
                        parts["lexical"] = lexical[entry_id]
                    out.append(ScoredRow(row, score, parts))
            if len(out) >= k:
                break
        return out

    # --- recovery ------------------------------------------------------------------------------
    def reconcile(self) -> dict[str, int]:
        """Erase what a crash left without a committed row; finish interrupted blob renames."""
        fixed = {"orphan_vectors": 0, "orphan_blobs": 0, "finished_renames": 0}
        with self._lock:
            vector_ids = self.vectors.all_ids()
            have = self.catalog.existing(vector_ids)
            orphans = [i for i in vector_ids if i not in have]
            self.vectors.delete(orphans)
            fixed["orphan_vectors"] = len(orphans)
            referenced = self.catalog.all_kv_paths()
            for path in self.kv_dir.rglob("*"):
                if not path.is_file():
                    continue
                rel = str(path.relative_to(self.root))
                if path.name.endswith(".tmp"):
                    final_rel, pid = _tmp_target(rel)
                    if pid is not None and pid != os.getpid() and _pid_alive(pid):
                        continue  # another live process is mid-write
                    if final_rel in referenced and not (self.root / final_rel).exists():
                        os.replace(path, self.root / final_rel)
                        fixed["finished_renames"] += 1
                    else:
                        _erase_file(path)
                        fixed["orphan_blobs"] += 1
                elif rel not in referenced:
                    _erase_file(path)
                    fixed["orphan_blobs"] += 1
        if any(fixed.values()):
            log.info("reconciled store %s: %s", self.root, fixed)
        return fixed

    def verify(self) -> dict[str, int]:
        """Consistency report (read-only): every row should have its vector and, if it names one, its blob."""
        with self._lock:
            vector_ids = set(self.vectors.all_ids())
            row_ids: set[str] = set()
            for page in self.catalog.iter_ids(self.catalog.scope_select()):
                row_ids.update(page)
            referenced = self.catalog.all_kv_paths()
            files = {str(p.relative_to(self.root)) for p in self.kv_dir.rglob("*") if p.is_file()}
        return {
            "rows": len(row_ids),
            "vectors": len(vector_ids),
            "blobs": len(files & referenced),
            "rows_missing_vector": len(row_ids - vector_ids),
            "rows_missing_blob": len(referenced - files),
            "orphan_vectors": len(vector_ids - row_ids),
            "orphan_blobs": len(files - referenced),
        }

    def close(self) -> None:
        self._lexical_worker.shutdown(wait=True)
        self.catalog.close()


def _vector_metadata(row: EntryRow) -> dict[str, Any]:
    meta: dict[str, Any] = {"kind": row.kind}
    if row.session_id is not None:
        meta["session_id"] = row.session_id
    return meta


def _write_tmp(final: Path, data: bytes) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    # the name carries the writer's pid: reconcile() leaves a live writer's temp files alone
    tmp = final.with_name(f"{final.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    write_synced(tmp, data)
    return tmp


def _tmp_target(rel: str) -> tuple[str, int | None]:
    base, pid, _tid, _ = rel.rsplit(".", 3)
    try:
        return base, int(pid)
    except ValueError:
        return base, None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _erase_file(path: Path) -> None:
    """Overwrite then unlink, so erased KV does not linger in the file's old blocks (best effort)."""
    secure_unlink(path, missing_ok=True)


__all__ = ["EntryStore", "NewEntry", "Scope", "ScoredRow"]
