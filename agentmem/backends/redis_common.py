"""What the Redis backends share: a client from a ``redis://`` URL (plus agentmem's ``prefix=`` option), the
glob escaping ``SCAN MATCH`` needs, and compare-and-set lease scripts.

Example:
    >>> client, prefix = redis_client(redis_url + "?prefix=app1:", "agentmem:")  # redis_url: redis://127.0.0.1:6379/0
    >>> prefix, client.ping()
    ('app1:', True)
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from agentmem.errors import InvalidInputError

__all__ = ["LEASE_ACQUIRE", "LEASE_RELEASE", "connect", "escape_glob", "redis_client"]

# Take or renew a lease: free, expired (Redis dropped the key) or already ours -> (re)set with the new expiry.
LEASE_ACQUIRE = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
LEASE_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def connect(url: str | None, client: Any, prefix: str, owner: str) -> tuple[Any, str]:
    """The client and key prefix a Redis backend uses: ``client`` as given, else one built from ``url``.

    Example:
        >>> client, prefix = connect(redis_url, None, "agentmem:", "RedisBlobStore")
        >>> prefix, connect(None, client, "mine:", "RedisBlobStore") == (client, "mine:")
        ('agentmem:', True)
        >>> connect(None, None, "agentmem:", "RedisBlobStore")
        Traceback (most recent call last):
        agentmem.errors.InvalidInputError: RedisBlobStore needs a url or a client
    """
    if client is not None:
        return client, prefix
    if url is None:
        raise InvalidInputError(f"{owner} needs a url or a client")
    return redis_client(url, prefix)


def redis_client(url: str, default_prefix: str) -> tuple[Any, str]:
    """A ``redis.Redis`` for ``url`` and the key prefix to use (``?prefix=`` in the URL, else ``default_prefix``).

    Example:
        >>> redis_client(redis_url, "agentmem:")[1], redis_client(redis_url + "?prefix=", "agentmem:")[1]
        ('agentmem:', '')
        >>> redis_client("http://127.0.0.1:6379", "agentmem:")
        Traceback (most recent call last):
        agentmem.errors.InvalidInputError: not a redis URL: 'http://127.0.0.1:6379'
    """
    try:
        import redis
    except ImportError as exc:  # an optional extra: say how to get it
        raise InvalidInputError(f"{url!r} needs the redis client: pip install 'agentmem[redis]'") from exc
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise InvalidInputError(f"not a redis URL: {url!r}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefix = next((v for k, v in query if k == "prefix"), default_prefix)
    rest = urlencode([(k, v) for k, v in query if k != "prefix"])
    client = redis.Redis.from_url(urlunsplit(parts._replace(query=rest)))
    return client, prefix


def escape_glob(text: str) -> str:
    """``text`` as a literal inside a Redis glob pattern (``SCAN MATCH``).

    Example:
        >>> escape_glob("a*b")
        'a\\\\*b'
    """
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
