"""Prometheus metrics of one server: recall and mount latency, KV hit rate, fallbacks, tiers, TTFT, fidelity, errors.

Each app gets its own registry (several apps may live in one test process). Tier bytes and sessions per tier are
read from ``mem.sessions.stats()`` at scrape time, so they are never stale. They are store-wide (every tenant's
sessions), so they sit in a registry of their own that only the operator's scrape renders (``store_wide=True``; the
app decides who that is, as for ``/v1/stats``).

Example:
    >>> from agentmem import AgentMemory
    >>> mem = AgentMemory("./memdata")
    >>> m = ServerMetrics(mem)
    >>> m.recall_seconds.observe(0.004)
    >>> b"agentmem_recall_seconds_count 1.0" in m.render()
    True
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["ServerMetrics", "fallback_reason"]

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_KL = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0)


def fallback_reason(reason: str) -> str:
    """A bounded label for a fallback reason: its first words, without ids or numbers."""
    head = re.split(r"[:(]", str(reason), maxsplit=1)[0]
    head = re.sub(r"[0-9a-f]{8,}|\d+", "", head).strip().lower()
    return re.sub(r"\s+", "_", head)[:40] or "unknown"


class _TierCollector(Collector):
    def __init__(self, mem: Any) -> None:
        self._mem = mem

    def collect(self) -> Iterable[GaugeMetricFamily]:
        tier_bytes = GaugeMetricFamily("agentmem_session_tier_bytes", "Bytes of session KV per tier", labels=["tier"])
        tier_sessions = GaugeMetricFamily("agentmem_session_tier_sessions", "Sessions per tier", labels=["tier"])
        try:
            stats = self._mem.sessions.stats()
        except Exception:  # a closed store during shutdown: export nothing rather than fail the scrape
            stats = {}
        for tier in ("hot", "warm", "cold"):
            if isinstance(stats.get(tier), dict):
                tier_bytes.add_metric([tier], float(stats[tier].get("bytes", 0)))
                tier_sessions.add_metric([tier], float(stats[tier].get("sessions", 0)))
        yield tier_bytes
        yield tier_sessions


class ServerMetrics:
    """The metrics one server exports at ``/metrics``."""

    def __init__(self, mem: Any) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.recall_seconds = Histogram("agentmem_recall_seconds", "Recall latency", buckets=_LATENCY, registry=r)
        self.mount_seconds = Histogram("agentmem_mount_seconds", "Load + mount latency of a chat request's memories",
                                       buckets=_LATENCY, registry=r)
        self.ttft_seconds = Histogram("agentmem_ttft_seconds", "Time to first token of a chat request",
                                      ["mode"], buckets=_LATENCY, registry=r)
        self.kv_mounts = Counter("agentmem_kv_mounts", "Memories mounted from stored KV (hit) or not (miss)",
                                 ["result"], registry=r)
        self.fallbacks = Counter("agentmem_fallbacks", "Memories that could not be mounted from stored KV",
                                 ["reason"], registry=r)
        self.chat_requests = Counter("agentmem_chat_requests", "Chat completions served", ["mode"], registry=r)
        self.errors = Counter("agentmem_errors", "Error responses", ["status", "type"], registry=r)
        self.fidelity_kl = Histogram("agentmem_fidelity_kl", "KL(text || kv) on the first answer tokens of scored "
                                     "chat requests", buckets=_KL, registry=r)
        self.fidelity_last = Gauge("agentmem_fidelity_kl_last", "The latest fidelity KL", registry=r)
        self.fidelity_top1 = Gauge("agentmem_fidelity_top1_agree_last", "Share of the latest scored answer's tokens "
                                   "whose most likely next token is the same in kv and text mode", registry=r)
        self.chat_cancelled = Counter("agentmem_chat_cancelled", "Chat requests abandoned before their answer was "
                                      "delivered (client hung up, or shutdown): decode stopped, turns not kept",
                                      registry=r)
        self.chat_in_flight = Gauge("agentmem_chat_in_flight", "Chat requests admitted and not yet finished "
                                    "(answering, streaming, or writing their turns)", registry=r)
        self.chat_rejected = Counter("agentmem_chat_rejected", "Chat requests refused by an admission cap (429)",
                                     registry=r)
        self.decoded_tokens = Counter("agentmem_decoded_tokens", "Answer tokens decoded for chat requests",
                                      ["outcome"], registry=r)
        self.cancel_overrun = Histogram("agentmem_cancel_overrun_pieces", "Answer pieces decoded after a chat "
                                        "request was cancelled (the decode stops before its next step)",
                                        buckets=(0, 1, 2, 4, 8, 16, 64), registry=r)
        self.store_registry = CollectorRegistry()  # every tenant's figures: the operator's scrape only
        self.store_registry.register(_TierCollector(mem))

    def observe_chat(self, mode: str, ttft_s: float, mount_s: float, mounted: int,
                     fallbacks: list[tuple[str, str]]) -> None:
        """Record one chat request (mode ``kv``/``text``; fallbacks are ``(id, reason)``)."""
        self.chat_requests.labels(mode=mode).inc()
        self.ttft_seconds.labels(mode=mode).observe(ttft_s)
        if mode == "text":
            return
        self.mount_seconds.observe(mount_s)
        self.kv_mounts.labels(result="hit").inc(max(0, mounted - len(fallbacks)))
        self.kv_mounts.labels(result="miss").inc(len(fallbacks))
        for _, reason in fallbacks:
            self.fallbacks.labels(reason=fallback_reason(reason)).inc()

    def hit_rate(self) -> float | None:
        """Share of mounted memories that came from stored KV (None before any mount)."""
        hit = self.kv_mounts.labels(result="hit")._value.get()
        miss = self.kv_mounts.labels(result="miss")._value.get()
        return None if hit + miss == 0 else hit / (hit + miss)

    def render(self, *, store_wide: bool = True) -> bytes:
        """The text exposition format; ``store_wide``: with the store-wide session tier gauges.

        Example:
            >>> from agentmem import AgentMemory
            >>> b"agentmem_session_tier_bytes" in ServerMetrics(AgentMemory("./memdata")).render(store_wide=False)
            False
        """
        out = generate_latest(self.registry)
        return out + generate_latest(self.store_registry) if store_wide else out
