"""Shared fixtures: a fresh store in a temp dir, with real SQLite, real Chroma and the bundled MiniLM."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# Tests never touch the network: any attempt to reach a model hub fails fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ.pop("AGENTMEM_ENCRYPTION_KEY", None)

from agentmem import AgentMemory  # noqa: E402


@pytest.fixture
def mem_path(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def mem(mem_path: Path, request: pytest.FixtureRequest) -> Iterator[AgentMemory]:
    # indirect parametrisation passes MemoryConfig overrides: @pytest.mark.parametrize("mem", [{...}], indirect=True)
    with AgentMemory(mem_path, **getattr(request, "param", {})) as m:
        yield m
