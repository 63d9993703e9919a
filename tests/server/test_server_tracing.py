"""OpenTelemetry spans of the server (recall / generate / mount), caught with the SDK's in-memory exporter.

The app runs in this process under a real uvicorn server on a loopback port (so the exporter sees its spans) and is
driven over HTTP by httpx and the official openai client; a tiny random model, real SQLite / Chroma / MiniLM.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import openai
import pytest
import uvicorn
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentmem import AgentMemory
from agentmem.server import ServerSettings, create_app
from server_helpers import free_port


@contextmanager
def _serving(mem: AgentMemory, tracing: bool, provider: TracerProvider) -> Iterator[str]:
    settings = ServerSettings(auth=False, fidelity_share=0.0, tracing=tracing)
    app = create_app(mem, keys=None, settings=settings, mcp=False, tracer_provider=provider)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def traced(tmp_path_factory, tiny_model_dir):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    mem = AgentMemory(tmp_path_factory.mktemp("traced") / "store", model=str(tiny_model_dir))
    for text in ("I moved to Lyon last May.", "My sister is called Ines.", "I play the violin."):
        mem.remember(text, user_id="t1")
    yield mem, provider, exporter
    mem.close()


def _chat(url: str, **extra) -> dict:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    r = client.chat.completions.create(model="x", user="t1", max_tokens=3,
                                       messages=[{"role": "user", "content": "Which city did I move to last May?"}],
                                       **extra)  # a question whose memory scores over the mount threshold (0.3)
    return r.model_extra["agentmem"]


def test_spans_around_recall_generate_and_mount(traced):
    mem, provider, exporter = traced
    exporter.clear()
    with _serving(mem, True, provider) as url:
        r = httpx.post(f"{url}/v1/memories/recall", json={"query": "Lyon", "user_id": "t1", "k": 2}, timeout=60)
        assert r.status_code == 200
        ext = _chat(url, extra_body={"agentmem": {"remember": False}})
    spans = exporter.get_finished_spans()
    recalls = [s for s in spans if s.name == "agentmem.recall"]
    assert len(recalls) == 2  # the REST route's and the chat request's
    assert recalls[0].attributes["agentmem.user"] == "t1" and recalls[0].attributes["agentmem.hits"] == 2
    (gen,) = [s for s in spans if s.name == "agentmem.generate"]
    (mount,) = [s for s in spans if s.name == "agentmem.mount"]
    assert gen.attributes["agentmem.mode"] == "kv" and gen.attributes["agentmem.completion_tokens"] >= 1
    assert mount.parent is not None and mount.parent.span_id == gen.context.span_id
    assert mount.context.trace_id == gen.context.trace_id
    assert gen.start_time <= mount.start_time <= mount.end_time <= gen.end_time
    assert mount.attributes["agentmem.memories"] == len(ext["mounted"]) >= 1
    assert mount.attributes["agentmem.tokens"] == sum(m["tokens"] for m in ext["mounted"])


def test_session_turn_spans_report_positions(traced):
    mem, provider, exporter = traced
    exporter.clear()
    with _serving(mem, True, provider) as url:
        ext = _chat(url, extra_headers={"X-AgentMem-Session": "trace-s1"},
                    extra_body={"agentmem": {"remember": False}})
    (mount,) = [s for s in exporter.get_finished_spans() if s.name == "agentmem.mount"]
    assert ext["mounted"] and all(m["position"] > 0 and m["tokens"] > 0 for m in ext["mounted"])
    assert mount.attributes["agentmem.tokens"] == sum(m["tokens"] for m in ext["mounted"])


def test_no_spans_unless_configured(traced):
    mem, provider, exporter = traced
    exporter.clear()
    with _serving(mem, False, provider) as url:  # the same provider, tracing off: nothing is recorded
        httpx.post(f"{url}/v1/memories/recall", json={"query": "Lyon", "user_id": "t1"}, timeout=60)
        _chat(url, extra_body={"agentmem": {"remember": False}})
    assert exporter.get_finished_spans() == ()
