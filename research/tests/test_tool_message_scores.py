"""research/tool_message_scores.py: every tool output of both sets parses into a call an OpenAI transcript can
carry, and a store of them is stored as tool results named by their tools."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import tool_message_scores as tms  # noqa: E402
from score_stores import TOOLS  # noqa: E402

from agentmem import AgentMemory  # noqa: E402


def test_every_output_parses_into_a_named_call_with_arguments() -> None:
    for line, _ in TOOLS + tms.HELD_OUT:
        name, args, result = tms.tool_call(line)
        assert name and args and result, line
        assert json.loads(json.dumps(args)) == args
    assert tms.tool_call('run_sql("SELECT 1 WHERE a=\'b\'") -> [[1]]')[1] == {"arg": "SELECT 1 WHERE a='b'"}


def test_a_transcript_stores_one_tool_result_named_by_its_tool(tmp_path: Path) -> None:
    with AgentMemory(tmp_path, kv_encoding="off") as mem:
        line = tms.HELD_OUT[0][0]
        rec = mem.get(tms.stored(mem, 0, line, "messages"))
        assert (rec.kind, rec.speaker) == ("tool", "search_flights")
        assert rec.text.startswith('called with {"date": "2026-03-02"') and "TP751" in rec.text
        assert mem.get(tms.stored(mem, 1, line, "line")).text == line
