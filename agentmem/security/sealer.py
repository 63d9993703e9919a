"""The one place that seals data at rest: entry text columns, KV blobs and session files.

A store has a :class:`Sealer` whether or not it is encrypted: without a cipher every method hands its input
back (an encrypted session file met without a key is refused, so a missing key never reads as garbage). Each value
is bound to where it lives by its associated data (``entry_aad``: entry id + field; ``session_aad``: the session's
hashed location), so a sealed value copied to another entry or field fails authentication.

Example:
    >>> from agentmem.security.crypto import Cipher
    >>> s = Sealer(Cipher(Cipher.generate_key()))
    >>> token = s.seal_text("e1", "text", "I live in Lisbon")
    >>> token.startswith("amenc1:"), s.open_text("e1", "text", token)
    (True, 'I live in Lisbon')
    >>> Sealer(None).seal_blob("e1", b"kv")
    b'kv'
"""

from __future__ import annotations

from agentmem.errors import EncryptionError
from agentmem.security.crypto import Cipher, entry_aad, is_encrypted


def session_aad(key: str) -> bytes:
    """Associated data binding an encrypted session file to its (hashed) location.

    Example:
        >>> session_aad("ab12")
        b'agentmem:session:ab12'
    """
    return f"agentmem:session:{key}".encode()


class Sealer:
    """Seal / open the store's values with ``cipher`` (None: a plaintext store, values pass through)."""

    def __init__(self, cipher: Cipher | None) -> None:  # noqa: D107 - see class docstring
        self.cipher = cipher

    @property
    def encrypted(self) -> bool:
        """Whether values are encrypted.

        Example:
            >>> Sealer(None).encrypted
            False
        """
        return self.cipher is not None

    # --- entry text columns (text, memory_text, history) -------------------------------------------------
    def seal_text(self, entry_id: str, field: str, value: str) -> str:
        """``value`` as stored in column ``field`` of entry ``entry_id``.

        Example:
            >>> Sealer(None).seal_text("e1", "text", "hi")
            'hi'
        """
        return value if self.cipher is None else self.cipher.encrypt_text(value, aad=entry_aad(entry_id, field))

    def open_text(self, entry_id: str, field: str, value: str) -> str:
        """The plaintext of a stored column value (:class:`BlobCorruptedError` if it was altered or moved).

        Example:
            >>> Sealer(None).open_text("e1", "text", "hi")
            'hi'
        """
        return value if self.cipher is None else self.cipher.decrypt_text(value, aad=entry_aad(entry_id, field))

    # --- KV blobs ----------------------------------------------------------------------------------------
    def seal_blob(self, entry_id: str, blob: bytes) -> bytes:
        """An entry's KV blob as stored.

        Example:
            >>> Sealer(None).seal_blob("e1", b"kv")
            b'kv'
        """
        return blob if self.cipher is None else self.cipher.encrypt(blob, aad=entry_aad(entry_id, "kv"))

    def open_blob(self, entry_id: str, data: bytes | memoryview) -> bytes | memoryview:
        """A stored KV blob's plaintext (plaintext stores: ``data`` itself, not copied).

        Example:
            >>> Sealer(None).open_blob("e1", b"kv")
            b'kv'
        """
        return data if self.cipher is None else self.cipher.decrypt(bytes(data), aad=entry_aad(entry_id, "kv"))

    # --- session files -----------------------------------------------------------------------------------
    def seal_session(self, key: str, data: bytes) -> bytes:
        """A session file's bytes as written to the cold tier.

        Example:
            >>> Sealer(None).seal_session("ab12", b"state")
            b'state'
        """
        return data if self.cipher is None else self.cipher.encrypt(data, aad=session_aad(key))

    def open_session(self, key: str, blob: bytes) -> bytes:
        """A session file's plaintext; an encrypted file read without a key is an :class:`EncryptionError`.

        Example:
            >>> Sealer(None).open_session("ab12", b"state")
            b'state'
        """
        if self.cipher is not None:
            return self.cipher.decrypt(blob, aad=session_aad(key))
        if is_encrypted(blob):
            raise EncryptionError("this session file is encrypted; open the store with its key")
        return blob


__all__ = ["Sealer", "session_aad"]
