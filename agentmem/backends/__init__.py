"""Implementations of the ports (:mod:`agentmem.ports`), one module each.

The embedded defaults: :mod:`agentmem.backends.sqlite` (the SQLite catalog, whose SQLAlchemy model and migrations
the PostgreSQL catalog shares), :mod:`agentmem.backends.chroma` (embedded Chroma) and :mod:`agentmem.backends.files`
(blobs on disk).
Server backends (PostgreSQL, pgvector, Chroma over HTTP) sit beside them and register a URL scheme with
:mod:`agentmem.factory`, as do the in-process ones written against the ports alone (``"memory"``:
:mod:`agentmem.backends.memory_catalog`, :mod:`agentmem.backends.in_memory`).
"""
