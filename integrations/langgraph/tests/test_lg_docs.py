"""docs/langgraph.md's python blocks are executed as written, in order, in one namespace, as a reader running the
page would (on a tiny model, for speed; the quick start also verbatim on SmolLM2 in the slow run)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "langgraph.md"


def blocks() -> list[str]:
    """Every python block of the page, in order."""
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def quick_start() -> str:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "docs/langgraph.md has no python block under '## Quick start'"
    return blocks[0]


def test_quick_start_is_short():
    code = quick_start()
    assert len([line for line in code.splitlines() if line.strip()]) <= 14
    assert 'AgentMemory("./memdata")' in code


def test_quick_start_runs_on_a_tiny_model(tmp_path, monkeypatch, capsys, tiny_lm):
    monkeypatch.chdir(tmp_path)
    # the same code, with the embedded SmolLM2 swapped for the tiny random model so it runs in seconds
    code = quick_start().replace('AgentMemory("./memdata")', 'AgentMemory("./memdata", model=TINY)')
    namespace = {"TINY": tiny_lm}
    exec(compile(code, str(DOC), "exec"), namespace)
    mem = namespace["mem"]
    told = mem.list(user_id="alice", session_id="1")[0]
    assert told.text == "My dog is called Rex."
    assert told.id in namespace["out"]["messages"][-1].response_metadata["agentmem"]["mounted"]
    assert capsys.readouterr().out.strip()
    mem.close()


def test_every_block_of_the_page_runs_in_order(tmp_path, monkeypatch, capsys, tiny_lm):
    monkeypatch.chdir(tmp_path)
    namespace = {"TINY": tiny_lm}
    found = blocks()
    assert len(found) >= 5 and found[0] == quick_start()
    for i, code in enumerate(found):
        code = code.replace('AgentMemory("./memdata")', 'AgentMemory("./memdata", model=TINY)')
        exec(compile(code, f"{DOC}[block {i}]", "exec"), namespace)
    mem = namespace["mem"]
    # the middleware block: the hosted model's turn was remembered through the middleware
    assert namespace["out"]["messages"][-1].content == "Yes, a dog called Rex."
    assert [r.text for r in mem.list(user_id="alice", session_id="3")] == ["Do I have a pet?",
                                                                          "Yes, a dog called Rex."]
    assert any(r.text == "I live in Lyon." for r in mem.list(user_id="alice"))  # the "as nodes" graph stored it
    # the retriever block: alice's dog (her earlier question may rank first), never another user's memory
    assert "My dog is called Rex." in [d.page_content for d in namespace["docs"]]
    assert {d.id for d in namespace["docs"]} <= {r.id for r in mem.list(user_id="alice")}
    assert namespace["msg"].response_metadata["agentmem"]["user_id"] == "alice"  # the ChatAgentMem block
    mem.close()


@pytest.mark.slow
def test_quick_start_runs_verbatim_on_smollm2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(quick_start(), str(DOC), "exec"), namespace)
    told = namespace["mem"].list(user_id="alice", session_id="1")[0]
    assert told.id in namespace["out"]["messages"][-1].response_metadata["agentmem"]["mounted"]
    namespace["mem"].close()
