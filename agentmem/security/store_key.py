"""Which cipher a store opens with, and the refusal to put a key on a store that already holds plaintext.

A key passed to (or found in ``$AGENTMEM_ENCRYPTION_KEY`` for) a store that was written without one used to
create ``encryption.json`` silently; every old entry then failed to decrypt (``BlobCorruptedError``) and the
store no longer opened without the key. Now that is refused before anything is written.

Example:
    >>> from agentmem import AgentMemory
    >>> with AgentMemory("./plain", kv_encoding="off") as mem:
    ...     _ = mem.remember("I live in Lyon.", user_id="u1")
    >>> open_cipher(Path("plain"), None) is None
    True
    >>> open_cipher(Path("plain"), "correct horse battery staple")
    Traceback (most recent call last):
    agentmem.errors.EncryptionError: the store at plain was written without encryption, but an encryption key ...
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from agentmem.errors import EncryptionError
from agentmem.security.crypto import DEFAULT_ENV_VAR, KeyMaterial, Cipher, is_encrypted_store

_DATA_DIRS = ("kv", "sessions")


def open_cipher(path: Path, key: KeyMaterial | None) -> Cipher | None:
    """The store's cipher: from ``key``, else ``$AGENTMEM_ENCRYPTION_KEY``; None for a plaintext store.

    Raises :class:`EncryptionError` for an encrypted store opened without a key, a wrong key, or a key given
    for a store that already holds plaintext entries (nothing is written in any of these cases).

    Example:
        >>> Path("memdata").mkdir()
        >>> cipher = open_cipher(Path("memdata"), "correct horse battery staple")      # a new store: encrypted
        >>> open_cipher(Path("memdata"), None)
        Traceback (most recent call last):
        agentmem.errors.EncryptionError: the store at memdata is encrypted: pass encryption_key= or set ...
    """
    from_env = key is None and bool(os.environ.get(DEFAULT_ENV_VAR))
    if key is None and not from_env:
        if is_encrypted_store(path):
            raise EncryptionError(f"the store at {path} is encrypted: pass encryption_key= or set {DEFAULT_ENV_VAR}")
        return None
    if not is_encrypted_store(path) and holds_plaintext(path):
        source = f"${DEFAULT_ENV_VAR} is set" if from_env else "an encryption key was given"
        raise EncryptionError(
            f"the store at {path} was written without encryption, but {source}: its entries cannot be read "
            f"under a key. Open it without a key (unset {DEFAULT_ENV_VAR}), or copy its entries into a new "
            "encrypted store; nothing was changed"
        )
    if from_env:
        return Cipher.from_env(DEFAULT_ENV_VAR, store_dir=path)
    return Cipher.for_store(path, key)  # type: ignore[arg-type]


def holds_plaintext(path: Path) -> bool:
    """Whether a store directory without a key check already has entries, KV blobs or session files.

    Example:
        >>> holds_plaintext(Path("/nonexistent"))
        False
    """
    for name in _DATA_DIRS:
        folder = path / name
        if folder.is_dir() and any(p.is_file() for p in folder.rglob("*")):
            return True
    catalog = path / "catalog.db"
    if not catalog.is_file():
        return False
    try:
        # read-only: refusing to open must not create or change anything
        conn = sqlite3.connect(f"file:{catalog}?mode=ro", uri=True, timeout=10)
        try:
            return conn.execute("SELECT 1 FROM entries LIMIT 1").fetchone() is not None
        finally:
            conn.close()
    except sqlite3.Error:  # no entries table yet: a catalog created but never written
        return False


__all__ = ["holds_plaintext", "open_cipher"]
