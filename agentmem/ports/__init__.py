"""The ports: one small ``typing.Protocol`` per replaceable part of the store.

Each implementation (embedded SQLite / Chroma / files, PostgreSQL, pgvector, Chroma server, Redis) satisfies one of
these structurally and passes the same conformance suite (``tests/conformance/``). :mod:`agentmem.factory` builds
them from URLs in :class:`~agentmem.config.MemoryConfig`; instances may also be handed to ``AgentMemory`` directly.

Example:
    >>> from agentmem.ports import BlobStore, Catalog, Embedder, VectorIndex
    >>> from agentmem.backends.files import FileBlobStore
    >>> import tempfile, pathlib
    >>> isinstance(FileBlobStore(pathlib.Path(tempfile.mkdtemp())), BlobStore)
    True
"""

from agentmem.ports.admission import AdmissionCounters, Claim, Refusal
from agentmem.ports.blobs import BlobStore
from agentmem.ports.catalog import Catalog
from agentmem.ports.api_keys import ApiKeyRecord, ApiKeyRecords
from agentmem.ports.embedder import Embedder, QueryEmbedder
from agentmem.ports.sessions import SessionTierStore
from agentmem.ports.vectors import VectorIndex, query_each_space

__all__ = ["AdmissionCounters", "ApiKeyRecord", "ApiKeyRecords", "BlobStore", "Catalog", "Claim", "Embedder",
           "QueryEmbedder", "Refusal", "SessionTierStore", "VectorIndex", "query_each_space"]
