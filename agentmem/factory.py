"""Build each port from a URL in :class:`~agentmem.config.MemoryConfig`, through a small scheme registry.

``None`` (the default) means the embedded implementation under the store path: SQLite catalog, embedded Chroma,
files. Other backends register a builder for their scheme with :func:`register`; a builder takes the URL and a
:class:`BuildContext` (store path, config, cipher and, for vectors, the catalog already built, so ``pgvector`` can
share its database).

Example:
    >>> from agentmem.factory import register, scheme_of
    >>> scheme_of("postgresql+psycopg://u@127.0.0.1/db"), scheme_of(None), scheme_of("pgvector")
    ('postgresql', 'embedded', 'pgvector')
    >>> from agentmem.backends.in_memory import MemoryBlobStore
    >>> register("blobs", "scratch", lambda url, ctx: MemoryBlobStore())    # MemoryConfig(blob_url="scratch://")
    >>> type(build("blobs", "scratch://", BuildContext(root=Path("store"), config=MemoryConfig()))).__name__
    'MemoryBlobStore'
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import numpy as np

from agentmem.config import MemoryConfig
from agentmem.errors import InvalidInputError
from agentmem.ports import BlobStore, Catalog, Embedder, VectorIndex
from agentmem.ports.admission import AdmissionCounters
from agentmem.ports.api_keys import ApiKeyRecords
from agentmem.ports.abilities import JoinsCatalogTransaction

Port = Literal["catalog", "vectors", "blobs", "session_store", "embedder", "api_keys", "admission"]
Builder = Callable[[str | None, "BuildContext"], Any]


@dataclass
class BuildContext:
    """What a builder may need besides its URL."""

    root: Path
    config: MemoryConfig
    cipher: Any = None
    catalog: Any = None  # set before vectors are built


_BUILDERS: dict[tuple[str, str], Builder] = {}
_LAZY: dict[tuple[str, str], str] = {}  # (port, scheme) -> "module:function", imported on first use
_lock = threading.Lock()


def register(port: Port, scheme: str, builder: Builder | str) -> None:
    """Make ``scheme`` URLs of ``port`` build with ``builder`` (a callable, or ``"module:function"`` imported
    lazily so optional drivers load only when used). A later registration replaces an earlier one.

    Example:
        >>> register("blobs", "redis", "agentmem.backends.redis_blobs:build")   # imported on first use
        >>> "redis" in schemes("blobs")
        True
    """
    with _lock:
        if isinstance(builder, str):
            _LAZY[(port, scheme)] = builder
            _BUILDERS.pop((port, scheme), None)
        else:
            _BUILDERS[(port, scheme)] = builder
            _LAZY.pop((port, scheme), None)


def schemes(port: Port) -> list[str]:
    """The schemes registered for ``port``.

    Example:
        >>> "embedded" in schemes("catalog")
        True
    """
    with _lock:
        return sorted({s for p, s in (*_BUILDERS, *_LAZY) if p == port})


def scheme_of(url: str | None) -> str:
    """The registry key of a URL: ``None`` → ``embedded``; ``postgresql+psycopg://`` → ``postgresql``;
    ``chroma+http://`` → ``chroma+http``; a bare word (``pgvector``) is its own scheme."""
    if url is None:
        return "embedded"
    scheme = url.split("://", 1)[0] if "://" in url else url
    if scheme.startswith("postgresql") or scheme == "postgres":
        return "postgresql"
    return scheme


def build(port: Port, url: str | None, ctx: BuildContext) -> Any:
    """Build ``port`` from ``url``; :class:`InvalidInputError` names the field and the known schemes if none fits.

    Example:
        >>> ctx = BuildContext(root=Path("."), config=MemoryConfig())
        >>> build("catalog", "memory", ctx).__class__.__name__
        'MemoryCatalog'
        >>> build("catalog", "mysql://db", ctx)
        Traceback (most recent call last):
        agentmem.errors.InvalidInputError: catalog_url: no backend for 'mysql://db' (known schemes: embedded, ...)
    """
    key = (port, scheme_of(url))
    with _lock:
        builder = _BUILDERS.get(key)
        lazy = _LAZY.get(key)
    if builder is None and lazy is not None:
        import importlib

        module, _, name = lazy.partition(":")
        builder = getattr(importlib.import_module(module), name)
    if builder is None:
        field = {"vectors": "vector_url", "blobs": "blob_url", "admission": "limits_url"}.get(port, f"{port}_url")
        raise InvalidInputError(f"{field}: no backend for {url!r} (known schemes: {', '.join(schemes(port))})")
    return builder(url, ctx)


def build_catalog(ctx: BuildContext) -> Any:
    """The catalog named by ``ctx.config.catalog_url``."""
    return build("catalog", ctx.config.catalog_url, ctx)


def build_vectors(ctx: BuildContext) -> Any:
    """The vector index named by ``ctx.config.vector_url`` (after the catalog: pgvector shares its database)."""
    return build("vectors", ctx.config.vector_url, ctx)


def build_blobs(ctx: BuildContext) -> Any:
    """The blob store named by ``ctx.config.blob_url``."""
    return build("blobs", ctx.config.blob_url, ctx)


def build_session_store(ctx: BuildContext) -> Any:
    """The cold tier of session KV named by ``ctx.config.session_store_url`` (files under ``<root>/sessions``)."""
    return build("session_store", ctx.config.session_store_url, ctx)


def build_session_manager(ctx: BuildContext, *, engine: Callable[[], Any], retrieve: Callable[..., list[Any]],
                          remember_turn: Callable[[str, str, str, str], Any], scan: Callable[[str], str],
                          kb_version: Callable[[], Any], embed_texts: Callable[[list[str]], Any]) -> Any:
    """A store's session cache manager (:class:`agentmem.sessions.SessionManager`; its arguments are described
    there): hot and warm tiers under ``<root>/sessions``, the cold tier from :func:`build_session_store`, and a topic
    detector over ``embed_texts`` when ``ctx.config.topic_switch_threshold`` is set."""
    from agentmem.sessions import SessionManager
    from agentmem.sessions.topic import TopicDetector

    threshold = ctx.config.topic_switch_threshold
    return SessionManager(
        engine=engine, retrieve=retrieve, remember_turn=remember_turn, scan=scan, kb_version=kb_version,
        root=ctx.root / "sessions", config=ctx.config, cipher=ctx.cipher, cold_store=build_session_store(ctx),
        topic=None if threshold is None else TopicDetector(embed_texts, threshold=threshold))


@dataclass(frozen=True)
class StoreParts:
    """The entry store's ports and the optional abilities decided for them once, here (parts never probe).

    ``joint_vectors``: the vector index itself when it writes inside the catalog's insert transaction
    (:class:`~agentmem.ports.abilities.JoinsCatalogTransaction`, and the catalog it joins is this one), else None.
    """

    catalog: Catalog
    vectors: VectorIndex
    blobs: BlobStore
    joint_vectors: JoinsCatalogTransaction | None = None


def build_store_parts(ctx: BuildContext, *, catalog: Catalog | None = None, vectors: VectorIndex | None = None,
                      blobs: BlobStore | None = None) -> StoreParts:
    """The catalog, vector index and blob store (those not given built from ``ctx.config``'s URLs, the catalog
    first: pgvector shares its database) and their abilities.

    Example:
        >>> config = MemoryConfig(catalog_url="memory", vector_url="memory", blob_url="memory")
        >>> parts = build_store_parts(BuildContext(root=Path("."), config=config))
        >>> type(parts.vectors).__name__, parts.joint_vectors is None     # it writes outside the catalog's transaction
        ('MemoryVectorIndex', True)
    """
    catalog = catalog if catalog is not None else build_catalog(ctx)
    ctx.catalog = catalog
    vectors = vectors if vectors is not None else build_vectors(ctx)
    blobs = blobs if blobs is not None else build_blobs(ctx)
    joint = vectors if isinstance(vectors, JoinsCatalogTransaction) and vectors.catalog is catalog else None
    return StoreParts(catalog, vectors, blobs, joint)


def build_embedder(ctx: BuildContext) -> Any:
    """The sentence embedder (``embedding_model`` path; the bundled MiniLM by default)."""
    return build("embedder", None, ctx)


def query_encoder(embedder: Embedder) -> Callable[[str], np.ndarray]:
    """How ``embedder`` embeds a search query, decided once where the store is built: its own ``encode_query``
    where it is a :class:`~agentmem.ports.QueryEmbedder`, else ``encode``'s one row (LangChain's ``embed_query`` /
    ``embed_documents`` split, the query side optional).

    The ability is looked up by name, not with ``isinstance(embedder, QueryEmbedder)``: on Python 3.11 a runtime
    Protocol's isinstance evaluates every member, ``dim`` included, which loads MiniLM's model. Recall then calls
    the returned function with no test per query.

    Example:
        >>> import numpy as np
        >>> class Twos:
        ...     dim = 2
        ...     def encode(self, texts, *, batch_size=64):
        ...         return np.full((len(texts), 2), np.sqrt(0.5), np.float32)
        >>> query_encoder(Twos())("hi").tolist() == Twos().encode(["hi"])[0].tolist()
        True
    """
    encode_query = getattr(embedder, "encode_query", None)
    if callable(encode_query):
        return encode_query
    return lambda text: embedder.encode([text])[0]


def build_api_keys(store_path: str | Path | None, url: str | None = None) -> ApiKeyRecords:
    """A server's API-key records: ``api_keys.db`` in the store directory ``store_path`` (``url`` None, the
    default), ``sqlite:///path/to/file.db``, ``postgresql://...`` (several servers share the keys), or ``memory``
    (in-process, nothing kept).

    Example:
        >>> build_api_keys(None, "memory").records()
        []
    """
    if store_path is None and url is None:
        raise InvalidInputError("API keys: give the store directory or a key store URL")
    return build("api_keys", url, BuildContext(root=Path(store_path or "."), config=MemoryConfig()))


# --- embedded defaults ------------------------------------------------------------------------------
def build_admission(url: str | None = None) -> AdmissionCounters:
    """A server's admission counters (its caps on chat requests in flight): in this process (``url`` None or
    ``"memory"``), or in Redis (``redis://...``), shared by every server on it.

    Example:
        >>> type(build_admission()).__name__, type(build_admission("memory")).__name__
        ('MemoryAdmissionCounters', 'MemoryAdmissionCounters')
    """
    return build("admission", url, BuildContext(root=Path("."), config=MemoryConfig()))


KEYS_FILE = "api_keys.db"


def _sqlite_api_keys(url: str | None, ctx: BuildContext) -> Any:
    """``api_keys.db`` in the store directory (made 0700 / the file 0600 before SQLite opens it: key hashes are
    nobody else's), or the file a ``sqlite:///`` URL names."""
    from agentmem._fs import private_dir, private_file
    from agentmem.backends.sqlite.api_keys import SqliteApiKeyRecords

    if url is None:
        path = private_dir(ctx.root.expanduser().resolve()) / KEYS_FILE
    else:
        path = Path(url.split("sqlite:///", 1)[-1]).expanduser().resolve()
        private_dir(path.parent)
    return SqliteApiKeyRecords(private_file(path))


def _sqlite_catalog(url: str | None, ctx: BuildContext) -> Any:
    from agentmem._fs import private_file
    from agentmem.backends.sqlite.catalog import SqliteCatalog

    return SqliteCatalog(str(private_file(ctx.root / "catalog.db")), busy_timeout_ms=ctx.config.busy_timeout_ms)


def _sqlite_url_catalog(url: str | None, ctx: BuildContext) -> Any:
    from agentmem.backends.sqlite.catalog import SqliteCatalog

    path = (url or "").split("sqlite:///", 1)[-1] or ":memory:"
    return SqliteCatalog(path, busy_timeout_ms=ctx.config.busy_timeout_ms)


def _chroma_local(url: str | None, ctx: BuildContext) -> Any:
    from agentmem.backends.chroma.index import ChromaVectorIndex

    path = ctx.root / "chroma" if url is None else Path(url.split("://", 1)[1])
    # Chroma cannot be encrypted: with a cipher it never gets the text, only vectors and scope fields.
    return ChromaVectorIndex(path, keep_documents=ctx.config.keep_text_in_index and ctx.cipher is None)


def _files(url: str | None, ctx: BuildContext) -> Any:
    from agentmem.backends.files import FileBlobStore

    return FileBlobStore(ctx.root if url is None else Path(url.split("://", 1)[1]))


def _session_files(url: str | None, ctx: BuildContext) -> Any:
    """The cold tier of session KV as files: under ``<store>/sessions``, or ``file:///dir``."""
    from agentmem.backends.file_sessions import FileSessionStore

    return FileSessionStore(ctx.root / "sessions" if url is None else Path(urlsplit(url).path))


def _redis_sessions(url: str | None, ctx: BuildContext) -> Any:
    """The cold tier of session KV in Redis (``redis://``, ``rediss://``, ``unix://``), shared by workers."""
    from agentmem.backends.redis_sessions import RedisSessionStore

    return RedisSessionStore(url)


def _minilm(url: str | None, ctx: BuildContext) -> Any:
    from agentmem.embed.minilm import MiniLMEmbedder

    return MiniLMEmbedder(ctx.config.embedding_model, cache_dir=ctx.config.cache_dir,
                    query_tower=query_tower_path(ctx.config.query_tower, ctx.config.embedding_model))


def query_tower_path(setting: str | None, embedding_model: str | None) -> Path | None:
    """The query tower file ``setting`` names (``MemoryConfig.query_tower``): "auto" → the bundled tower for the
    bundled model (none for another model, or where the package has none), None → off, else that path.

    Example:
        >>> query_tower_path(None, None) is None
        True
        >>> query_tower_path("auto", "/models/other") is None
        True
    """
    from agentmem.embed.query_tower import BUNDLED_TOWER

    if setting is None:
        return None
    if setting == "auto":
        return BUNDLED_TOWER if embedding_model is None and BUNDLED_TOWER.is_file() else None
    return Path(setting)


register("catalog", "embedded", _sqlite_catalog)
register("catalog", "sqlite", _sqlite_url_catalog)
register("vectors", "embedded", _chroma_local)
register("vectors", "chroma", _chroma_local)  # chroma:///abs/path
register("blobs", "embedded", _files)
register("blobs", "file", _files)  # file:///abs/path (blobs under <path>/kv)
register("embedder", "embedded", _minilm)
register("api_keys", "embedded", _sqlite_api_keys)
register("api_keys", "sqlite", _sqlite_api_keys)
register("api_keys", "memory", "agentmem.backends.memory_api_keys:build_api_keys")
register("api_keys", "postgresql", "agentmem.backends.postgres:build_api_keys")  # shared by several servers
register("catalog", "postgresql", "agentmem.backends.postgres:build_catalog")
register("vectors", "pgvector", "agentmem.backends.pgvector:build_vectors")
register("vectors", "chroma+http", "agentmem.backends.chroma_http:build_vectors")
register("catalog", "memory", "agentmem.backends.memory_catalog:build_catalog")  # in-process: tests, notebooks
register("vectors", "memory", "agentmem.backends.in_memory:build_vectors")
register("blobs", "memory", "agentmem.backends.in_memory:build_blobs")
for _scheme in ("embedded", "memory"):
    register("admission", _scheme, "agentmem.backends.memory_admission:build")
for _scheme in ("redis", "rediss", "unix"):
    register("admission", _scheme, "agentmem.backends.redis_admission:build")  # caps shared by several servers
    register("blobs", _scheme, "agentmem.backends.redis_blobs:build")
    register("session_store", _scheme, _redis_sessions)
for _scheme in ("embedded", "file"):
    register("session_store", _scheme, _session_files)

__all__ = ["KEYS_FILE", "BuildContext", "StoreParts", "build", "build_api_keys", "build_blobs", "build_catalog",
           "build_embedder", "build_session_manager", "build_session_store", "build_store_parts", "build_vectors",
           "query_encoder", "register", "scheme_of", "schemes"]
