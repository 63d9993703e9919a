"""Where a server keeps its API keys: the one opening the server and the CLI reach them through.

The server and the CLI use agentmem's public API only (``.importlinter``), never the ports, backends or factory;
this module is the smallest surface that lets them open the key store the factory builds: one function, the record
type and the port's Protocol to type it with. Making, hashing and checking keys stays the server's
(:class:`agentmem.server.KeyStore`).

Example:
    >>> import pathlib, tempfile
    >>> store = pathlib.Path(tempfile.mkdtemp()) / "memdata"
    >>> records = open_api_keys(store)                        # <store>/api_keys.db, created 0600
    >>> records.records(), (store / "api_keys.db").is_file()
    ([], True)
"""

from __future__ import annotations

from pathlib import Path

from agentmem.factory import KEYS_FILE, build_api_keys
from agentmem.ports.api_keys import ApiKeyRecord, ApiKeyRecords


def open_api_keys(store_path: str | Path | None, *, url: str | None = None) -> ApiKeyRecords:
    """The API-key records of the store at ``store_path`` (``api_keys.db`` there, made private), or of the key
    store ``url`` names instead: ``sqlite:///path/to/keys.db``, ``postgresql://...`` (one set of keys for several
    servers), or ``memory`` (in-process, nothing kept).

    Example:
        >>> open_api_keys(None, url="memory").get("no-such-key") is None
        True
    """
    return build_api_keys(store_path, url)


__all__ = ["KEYS_FILE", "ApiKeyRecord", "ApiKeyRecords", "open_api_keys"]
