"""Admission counters in Redis, shared by every server on it (``[server] limits_url = "redis://host:port/db"``): a
user's cap on chat requests in flight holds across the servers behind a load balancer, not per server.

Each counter ``name`` is a hash ``<prefix>held:<name>`` (ticket → amount) beside a sorted set ``<prefix>until:<name>``
(ticket → lease end, in Redis's own clock, so servers' clocks do not matter); each ticket lists its counters in the
set ``<prefix>ticket:<ticket>``. Every operation is one Lua script, so checking the caps and taking the shares is
atomic across servers; shares whose lease ended are dropped before counting, and keys carry a Redis expiry no
shorter than their longest lease, so nothing is left behind by a server that died.

Example:
    >>> from agentmem.ports.admission import Claim
    >>> counters = RedisAdmissionCounters(redis_url)      # redis_url: redis://127.0.0.1:6379/0, say
    >>> counters.acquire("t1", [Claim("user:u1", 1, cap=2)], lease_s=30), counters.held("user:u1")
    (None, 1)
    >>> counters.release("t1"); counters.held("user:u1")
    0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentmem.backends.redis_common import connect
from agentmem.ports.admission import Claim, Refusal

__all__ = ["RedisAdmissionCounters", "build"]

# Lua helpers every script starts with: Redis's clock in ms, dropping ended leases, keeping a key alive for ``ms``.
_COMMON = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function drop_ended(held, ends, now)
  local ended = redis.call('ZRANGEBYSCORE', ends, '-inf', now)
  if #ended > 0 then
    redis.call('HDEL', held, unpack(ended))
    redis.call('ZREMRANGEBYSCORE', ends, '-inf', now)
  end
end
local function keep_for(key, ms)
  local ttl = redis.call('PTTL', key)
  if ttl < ms then redis.call('PEXPIRE', key, ms) end
end
local function total(held)
  local sum = 0
  for _, v in ipairs(redis.call('HVALS', held)) do sum = sum + tonumber(v) end
  return sum
end
"""

# KEYS: held_1, until_1, held_2, until_2, ..., the ticket's set. ARGV: ticket, lease ms, then amount, cap per claim.
# Returns nil when every share was taken, else {index of the first claim over its cap (1-based), units held}.
_ACQUIRE = _COMMON + """
local ticket, lease = ARGV[1], tonumber(ARGV[2])
local now, n = now_ms(), (#KEYS - 1) / 2
for i = 1, n do
  drop_ended(KEYS[2 * i - 1], KEYS[2 * i], now)
  local held = total(KEYS[2 * i - 1])
  if held + tonumber(ARGV[1 + 2 * i]) > tonumber(ARGV[2 + 2 * i]) then return {i, held} end
end
for i = 1, n do
  redis.call('HSET', KEYS[2 * i - 1], ticket, ARGV[1 + 2 * i])
  redis.call('ZADD', KEYS[2 * i], now + lease, ticket)
  keep_for(KEYS[2 * i - 1], lease)
  keep_for(KEYS[2 * i], lease)
  redis.call('SADD', KEYS[#KEYS], KEYS[2 * i - 1] .. '\\n' .. KEYS[2 * i])
end
keep_for(KEYS[#KEYS], lease)
return nil
"""

# KEYS: the tickets' sets. ARGV: lease ms, then the tickets (in KEYS' order).
_RENEW = _COMMON + """
local lease, now = tonumber(ARGV[1]), now_ms()
for i, key in ipairs(KEYS) do
  for _, pair in ipairs(redis.call('SMEMBERS', key)) do
    local held, ends = string.match(pair, '^(.*)\\n(.*)$')
    if redis.call('ZADD', ends, 'XX', 'CH', now + lease, ARGV[1 + i]) > 0 then
      keep_for(held, lease)
      keep_for(ends, lease)
    end
  end
  if redis.call('EXISTS', key) == 1 then keep_for(key, lease) end
end
return 0
"""

# KEYS: the ticket's set. ARGV: the ticket.
_RELEASE = """
for _, pair in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local held, ends = string.match(pair, '^(.*)\\n(.*)$')
  redis.call('HDEL', held, ARGV[1])
  redis.call('ZREM', ends, ARGV[1])
end
redis.call('DEL', KEYS[1])
return 0
"""

# KEYS: held, ends.
_HELD = _COMMON + """
drop_ended(KEYS[1], KEYS[2], now_ms())
return total(KEYS[1])
"""


class RedisAdmissionCounters:
    """Leased shares of named counters in Redis; implements :class:`~agentmem.ports.admission.AdmissionCounters`.

    Args:
        url: ``redis://host:port/db`` (``?prefix=`` overrides the key prefix), or give ``client`` instead.
        prefix: prepended to every key, so several deployments can share one database.
    """

    def __init__(self, url: str | None = None, *, client: Any = None, prefix: str = "agentmem:admission:") -> None:
        self.client, self.prefix = connect(url, client, prefix, "RedisAdmissionCounters")
        self._acquire = self.client.register_script(_ACQUIRE)
        self._renew = self.client.register_script(_RENEW)
        self._release = self.client.register_script(_RELEASE)
        self._held = self.client.register_script(_HELD)

    def _keys(self, name: str) -> list[str]:
        return [f"{self.prefix}held:{name}", f"{self.prefix}until:{name}"]

    def _ticket(self, ticket: str) -> str:
        return f"{self.prefix}ticket:{ticket}"

    def acquire(self, ticket: str, claims: Sequence[Claim], *, lease_s: float) -> Refusal | None:
        keys = [k for claim in claims for k in self._keys(claim.name)] + [self._ticket(ticket)]
        args = [ticket, _ms(lease_s)] + [v for claim in claims for v in (int(claim.amount), int(claim.cap))]
        over = self._acquire(keys=keys, args=args)
        if over is None:
            return None
        index, held = over
        return Refusal(claims[int(index) - 1], int(held))

    def renew(self, tickets: Sequence[str], *, lease_s: float) -> None:
        if tickets:
            self._renew(keys=[self._ticket(t) for t in tickets], args=[_ms(lease_s), *tickets])

    def release(self, ticket: str) -> None:
        self._release(keys=[self._ticket(ticket)], args=[ticket])

    def held(self, name: str) -> int:
        return int(self._held(keys=self._keys(name)))

    def close(self) -> None:
        self.client.close()


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def build(url: str | None, ctx: Any) -> RedisAdmissionCounters:
    """The factory's builder (``limits_url = "redis://..."``, ``rediss://``, ``unix://``)."""
    return RedisAdmissionCounters(url)
