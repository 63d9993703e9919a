"""The ``--backend`` choice shared by the benchmarks: start the servers a backend needs, give the store's URLs.

``embedded`` needs nothing; ``postgres`` starts PostgreSQL + pgvector (catalog and vectors in one database);
``chroma-server`` starts ``chroma run`` (vectors there, catalog in SQLite). Servers come from tests/servers.py
(loopback, temp data dir) and are stopped by PID on exit; with ``keep`` their data dir stays, and a later run
on the same ``base`` starts the server on it again.

Example:
    >>> with backend_urls("embedded", Path("/tmp/x")) as urls:
    ...     urls
    {}
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BACKENDS = ("embedded", "postgres", "chroma-server")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.servers


@contextlib.contextmanager
def backend_urls(backend: str, base: Path, *, keep: bool = False) -> Iterator[dict[str, str]]:
    """Start what ``backend`` needs under ``base``; yield the ``AgentMemory`` keyword arguments naming it.

    Example:
        >>> with backend_urls("postgres", Path("/tmp/b")) as urls:     # doctest: +SKIP
        ...     sorted(urls)
        ['catalog_url', 'vector_url']
    """
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    if backend == "embedded":
        yield {}
        return
    from tests import servers

    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)  # a PostgreSQL server user must reach its data dir
    if backend == "postgres":
        server = _sized_postgres(servers, base / "pg")
        urls = {"catalog_url": server.url, "vector_url": "pgvector"}
    elif backend == "chroma-server":
        server = servers.start_chroma(base / "chroma")
        urls = {"vector_url": server.url}
    else:
        raise ValueError(f"unknown backend {backend!r}; one of {BACKENDS}")
    try:
        yield urls
    finally:
        server.stop(remove_data=not keep)


# A server sized for the data it serves, as a deployment would be (PostgreSQL's default is 128 MB): at 100,000
# entries the HNSW index (195 MB) and the vector heap (156 MB) did not fit, and every search copied ~300 pages in
# from the OS cache (HNSW scan p50/p95 1.6/4.0 ms at 128 MB, 1.2/1.9 ms at 1 GB; docs/backends.md, session 5).
SHARED_BUFFERS = "1GB"


def _sized_postgres(servers: Any, data: Path) -> Any:
    """``servers.start_postgres(data)`` with ``shared_buffers`` = SHARED_BUFFERS (set once in the data dir's
    ``postgresql.auto.conf``; the server restarts the one time it is changed)."""
    from sqlalchemy import create_engine, text

    server = servers.start_postgres(data)
    engine = create_engine(server.url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            if conn.execute(text("SHOW shared_buffers")).scalar() == SHARED_BUFFERS:
                return server
            conn.execute(text(f"ALTER SYSTEM SET shared_buffers = '{SHARED_BUFFERS}'"))
    finally:
        engine.dispose()
    server.stop(remove_data=False)
    return servers.start_postgres(data)


__all__ = ["BACKENDS", "SHARED_BUFFERS", "backend_urls"]
