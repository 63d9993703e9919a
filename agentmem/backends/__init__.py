"""Implementations of the ports (:mod:`agentmem.ports`), one module each.

The embedded defaults live where they always did (:mod:`agentmem.store.catalog` for SQLite,
:mod:`agentmem.store.vectors` for embedded Chroma); blobs on disk are :mod:`agentmem.backends.files`.
Server backends (PostgreSQL, pgvector, Chroma over HTTP) sit beside them and register a URL scheme with
:mod:`agentmem.factory`.
"""
