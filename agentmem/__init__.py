"""agentmem: long-term memory for LLM agents, stored as a KV cache bank."""

from agentmem.config import MemoryConfig
from agentmem.errors import (
    AgentMemError,
    BlobCorruptedError,
    EncryptionError,
    FingerprintMismatchError,
    InvalidInputError,
    NotFoundError,
    SecretDetectedError,
    SessionBusyError,
    StaleEntryError,
    UnsupportedModelError,
)
from agentmem.memory import AgentMemory
from agentmem.aio import AsyncAgentMemory  # noqa: E402  (after AgentMemory, which it wraps)
from agentmem.types import Hit, KvInfo, MemoryRecord

__version__ = "0.1.0"

__all__ = [
    "AgentMemError",
    "AgentMemory",
    "AsyncAgentMemory",
    "BlobCorruptedError",
    "EncryptionError",
    "FingerprintMismatchError",
    "Hit",
    "InvalidInputError",
    "KvInfo",
    "MemoryConfig",
    "MemoryRecord",
    "NotFoundError",
    "SecretDetectedError",
    "SessionBusyError",
    "StaleEntryError",
    "UnsupportedModelError",
]
