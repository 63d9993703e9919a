"""Fixtures for the LangGraph integration tests: a fresh AgentMemory per test (the embedder is loaded once per
process, so a store costs well under a second), fake chat models that record what they were shown, and a tiny
random local LLM for KV mode."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

from agentmem import AgentMemory  # noqa: E402
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage  # noqa: E402


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


class RecordingChatModel(GenericFakeChatModel):
    """A scripted chat model (text or tool calls) that records the messages of every call; tools bind to it."""

    calls: list[list[BaseMessage]] = []

    def __init__(self, replies: list[Any], **kwargs: Any) -> None:
        msgs = [r if isinstance(r, BaseMessage) else AIMessage(content=r) for r in replies]
        super().__init__(messages=iter(msgs), calls=[], **kwargs)

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[override]
        self.calls.append(list(messages))
        return super()._generate(messages, stop, run_manager, **kwargs)

    def bind_tools(self, tools, **kwargs):  # type: ignore[override]
        return self

    def system_text(self, call: int = -1) -> str:
        """All system-message text the model saw in one call."""
        return "\n".join(str(m.content) for m in self.calls[call] if m.type == "system")


@pytest.fixture
def tiny_lm():
    """A tiny random Llama (no download): outputs are junk but deterministic, code paths are the real ones."""
    testing = pytest.importorskip("agentmem.kv.testing")
    return testing.tiny_causal_lm("llama", seed=0)
