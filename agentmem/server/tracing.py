"""OpenTelemetry spans around recall, mount and generate (off unless ``ServerSettings.tracing`` is set).

With tracing off every span comes from OpenTelemetry's no-op tracer, whatever provider the process has, so a
server that did not ask for traces pays nothing and exports nothing. With it on, spans go to the process's global
``TracerProvider`` (set by the embedding application or ``opentelemetry-instrument``); ``agentmem serve --otel``
installs an SDK provider printing spans to stderr when none is set.

Spans (names are stable, attributes are prefixed ``agentmem.``):

* ``agentmem.recall``: one recall (REST route or a chat request's): user, k, hits.
* ``agentmem.generate``: one chat answer (``mem.generate`` or ``Session.send``): user, mode, session, tokens.
* ``agentmem.mount``: child of ``agentmem.generate``, loading and mounting that answer's memories. The engine
  mounts before it prefills, inside one call, so this span starts with ``agentmem.generate`` and lasts the
  engine's ``load`` + ``encode`` + ``mount`` timings; attributes: memories and tokens mounted, fallbacks.

Example:
    >>> tracer = server_tracer(enabled=True)
    >>> with tracer.start_as_current_span("agentmem.recall", attributes={"agentmem.user": "u1"}):
    ...     pass
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

__all__ = ["console_provider_if_unset", "mount_span", "server_tracer"]

TRACER_NAME = "agentmem.server"


def server_tracer(enabled: bool, provider: Any = None) -> trace.Tracer:
    """The tracer routes use: the no-op one when disabled, else ``provider``'s (default: the global provider).

    Example:
        >>> server_tracer(enabled=False).start_span("x").is_recording()
        False
    """
    if not enabled:
        return trace.NoOpTracer()
    return trace.get_tracer(TRACER_NAME, tracer_provider=provider)


def mount_span(tracer: trace.Tracer, start_ns: int, out: Any) -> None:
    """Record the ``agentmem.mount`` child of the current (generate) span from a generation's timings.

    ``start_ns`` is when the generate call began (``time.time_ns()``); ``out`` a ``GenerationResult`` or
    ``TurnResult`` (``timings``, ``mounted``, ``spans``, ``fallbacks``).

    Example (spans kept in memory here; ``agentmem serve --otel`` prints them):
        >>> import time
        >>> from opentelemetry.sdk.trace import TracerProvider
        >>> from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        >>> from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        >>> from agentmem.kv.types import GenerationResult
        >>> provider, spans = TracerProvider(), InMemorySpanExporter()
        >>> provider.add_span_processor(SimpleSpanProcessor(spans))
        >>> result = GenerationResult("Lisbon.", mounted=["m1"], dropped=[], mode="kv", timings={"mount": 0.002},
        ...                           spans=[(56, 81)])
        >>> mount_span(server_tracer(True, provider), time.time_ns(), result)
        >>> dict(spans.get_finished_spans()[0].attributes)
        {'agentmem.memories': 1, 'agentmem.tokens': 25, 'agentmem.fallbacks': 0}
    """
    t = out.timings
    seconds = t.get("load", 0.0) + t.get("encode", 0.0) + t.get("mount", 0.0)
    tokens = sum(end - start for start, end in (getattr(out, "spans", None) or []))
    span = tracer.start_span("agentmem.mount", start_time=start_ns, attributes={
        "agentmem.memories": len(out.mounted), "agentmem.tokens": tokens,
        "agentmem.fallbacks": len(out.fallbacks)})
    span.end(end_time=start_ns + int(seconds * 1e9))


def console_provider_if_unset() -> bool:
    """Install an SDK provider that prints finished spans to stderr, unless the process already has a provider.

    Returns True when it installed one (``agentmem serve --otel`` with nothing configured).

    Example:
        >>> console_provider_if_unset()   # doctest: +SKIP
        True
    """
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    return True
