"""Fixtures for the LangGraph integration tests: a fresh AgentMemory per test (the embedder is loaded once per
process, so a store costs well under a second) and a tiny random local LLM for KV mode."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

from agentmem import AgentMemory  # noqa: E402


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    # The embedder and the tiny LLM run single sentences: on a shared 2-core machine, torch's default thread
    # pool oversubscribes the CPUs and makes each embedding ~10x slower. Restored after each test, so the rest
    # of the suite keeps its own setting.
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def mem(tmp_path: Path) -> Iterator[AgentMemory]:
    with AgentMemory(tmp_path / "mem", kv_encoding="off") as m:
        yield m


@pytest.fixture
def tiny_lm():
    """A tiny random Llama (no download): outputs are junk but deterministic, code paths are the real ones."""
    testing = pytest.importorskip("agentmem.kv.testing")
    return testing.tiny_causal_lm("llama", seed=0)
