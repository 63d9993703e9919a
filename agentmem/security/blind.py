"""Blind lexical index: keyed hashes of words, so full-text search works on encrypted stores.

With encryption at rest the catalog cannot keep plaintext in its FTS5 index. Each content word is
replaced by HMAC-SHA256(key, word) truncated to 12 hex chars; queries are blinded the same way, so
exact-word matching and BM25 still work while the index reveals only word-frequency patterns
(documented in docs/security.md). Stemming is lost: "moved" no longer matches "move".

Example:
    >>> b = BlindIndex(bytes(32))
    >>> b.text("Lyon lyon!") == b.text("LYON lyon")
    True
"""

from __future__ import annotations

import hashlib
import hmac
import re

_WORD = re.compile(r"[A-Za-z0-9]+")


class BlindIndex:
    def __init__(self, index_key: bytes) -> None:
        self._key = index_key  # Cipher.index_key: a subkey, never the encryption key itself

    def token(self, word: str) -> str:
        return "b" + hmac.new(self._key, word.lower().encode(), hashlib.sha256).hexdigest()[:12]

    def text(self, text: str) -> str:
        return " ".join(self.token(w) for w in _WORD.findall(text))


__all__ = ["BlindIndex"]
