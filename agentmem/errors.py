"""One error hierarchy for agentmem.

Every error inherits :class:`AgentMemError` and, where one fits, the nearest builtin, so
``except ValueError`` keeps working for callers that do not know agentmem.
"""

from __future__ import annotations


class AgentMemError(Exception):
    """Root of every error agentmem raises on purpose."""


class InvalidInputError(AgentMemError, ValueError):
    """An argument is malformed: empty text, unknown kind, negative TTL, bad filter, k <= 0, ..."""


class NotFoundError(AgentMemError, KeyError):
    """No entry (or session) with that id exists for this store."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "not found"


class SecretDetectedError(InvalidInputError):
    """Text holds a secret and the store's secret policy is ``reject``; nothing was stored."""


class FingerprintMismatchError(AgentMemError):
    """A KV blob was made by a different model (or dtype/tokenizer) than the one loaded."""


class BlobCorruptedError(AgentMemError):
    """A KV blob on disk is unreadable, truncated, or failed authentication."""


class UnsupportedModelError(AgentMemError, TypeError):
    """The model cannot have its KV re-positioned exactly (e.g. learned absolute positions)."""


class EncryptionError(AgentMemError):
    """Encryption is misconfigured: a wrong or missing key for data encrypted at rest."""


class StaleEntryError(AgentMemError):
    """A trained entry no longer matches its document or model and must be retrained."""


class SessionBusyError(AgentMemError, TimeoutError):
    """Another worker holds this session's lease (it is serving it); route the session to that worker, or retry
    once it has offloaded the session (idle offload, ``mem.sessions.offload``, or closing)."""


__all__ = [
    "AgentMemError",
    "BlobCorruptedError",
    "EncryptionError",
    "FingerprintMismatchError",
    "InvalidInputError",
    "NotFoundError",
    "SecretDetectedError",
    "SessionBusyError",
    "StaleEntryError",
    "UnsupportedModelError",
]
