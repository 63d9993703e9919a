"""The examples run non-interactively (--script) and pass their own checks; run in-process to share the
already-loaded embedder."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_langgraph_agent_script(capsys):
    assert load("langgraph_agent").main(["--script"]) == 0
    out = capsys.readouterr().out
    assert "(from memory, no tool call)" in out and "OK:" in out


def test_multi_session_chatbot_script_on_a_tiny_model(tmp_path, capsys):
    assert load("multi_session_chatbot").main(["--script", "--model", "tiny", "--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("--- restart") == 2 and "OK:" in out
    assert "mounted 1 memories" in out or "mounted 2 memories" in out or "mounted 3 memories" in out


@pytest.mark.slow
def test_multi_session_chatbot_script_on_smollm2(capsys):
    # the README's demo on the embedded model, shortened answers to keep it quick
    assert load("multi_session_chatbot").main(["--script", "--max-new-tokens", "8"]) == 0
    assert "OK:" in capsys.readouterr().out
