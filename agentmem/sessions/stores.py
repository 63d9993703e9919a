"""The cold tier of session KV from ``MemoryConfig.session_store_url``.

Example:
    >>> import tempfile, pathlib
    >>> open_cold_store(None, pathlib.Path(tempfile.mkdtemp())).name
    'cold'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agentmem.backends.file_sessions import FileSessionStore
from agentmem.errors import InvalidInputError
from agentmem.ports.sessions import SessionTierStore

__all__ = ["build", "open_cold_store"]


def open_cold_store(url: str | None, root: Path) -> SessionTierStore:
    """``None`` or ``file:///dir``: files (under ``root`` by default); ``redis://…``: Redis, shared by workers.

    Example:
        >>> open_cold_store("redis://127.0.0.1:6379/1", Path("unused"))                 # doctest: +SKIP
    """
    if url is None:
        return FileSessionStore(root)
    scheme = urlsplit(url).scheme
    if scheme == "file":
        return FileSessionStore(Path(urlsplit(url).path))
    if scheme in ("redis", "rediss", "unix"):
        from agentmem.backends.redis_sessions import RedisSessionStore

        return RedisSessionStore(url)
    raise InvalidInputError(f"session_store_url: unknown scheme in {url!r} (use file:///dir or redis://host:port/db)")


def build(url: str | None, ctx: Any) -> SessionTierStore:
    """Factory builder (``agentmem.factory``, port ``session_store``): files under ``<store>/sessions`` by default.

    Example:
        >>> # factory.build("session_store", "redis://127.0.0.1:6379/1", ctx)
    """
    return open_cold_store(url, Path(ctx.root) / "sessions")
