"""A tool called again with the same arguments: its newer result is what the call returns now
(agentmem/consolidate/tool_calls.py). Plain recall ranks the older result after the newer, a mount leaves it out
(``MountChoice.contradicted``); another call, and the parts of one long result, stand. Through the public API, with
the real embedder."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmem import AgentMemory


def _tool(mem: AgentMemory, n: int, name: str, arguments: str, result: str, session: str | None) -> str:
    call = {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": arguments}}
    recs = mem.remember_messages([{"role": "assistant", "content": None, "tool_calls": [call]},
                                  {"role": "tool", "tool_call_id": f"c{n}", "content": result}],
                                 user_id="u", session_id=session)
    return recs[0].id


def test_the_same_call_again_leaves_its_older_result_out_of_the_mount(tmp_path: Path) -> None:
    with AgentMemory(tmp_path, kv_encoding="off") as mem:
        old = _tool(mem, 1, "order_status", '{"order": "A-17"}', "processing, not shipped yet", "s1")
        physio = _tool(mem, 2, "get_appointment", '{"who": "physio"}', "Wednesday 19 March, 5 pm", "s1")
        new = _tool(mem, 3, "order_status", '{"order": "A-17"}', "shipped with DHL, arrives Friday", "s2")
        question = "What is the status of my order A-17?"
        ranked = [h.id for h in mem.recall(question, user_id="u", k=3)]
        assert ranked.index(new) < ranked.index(old), ranked
        choice = mem.mount_choice(question, user_id="u")
        assert new in [h.id for h in choice.mounted] and old not in [h.id for h in choice.mounted]
        assert [h.id for h in choice.contradicted] == [old]
        assert mem.get(old).status == "active"  # recall's check only: the older result stays stored, as said
        # another call of the same tool (other arguments) stands beside it
        other = _tool(mem, 4, "order_status", '{"order": "B-2"}', "processing, not shipped yet", "s3")
        both = mem.mount_choice("Have my orders shipped?", user_id="u", k=4)
        assert {new, other} <= {h.id for h in both.mounted} and old not in {h.id for h in both.mounted}
        assert physio not in {h.id for h in both.contradicted}


def test_the_parts_of_one_long_result_do_not_replace_each_other(tmp_path: Path) -> None:
    with AgentMemory(tmp_path, kv_encoding="off", message_max_words=12) as mem:
        result = ("Flight TP751 departs Oslo at 10:40 from gate D7. It arrives in Lisbon at 14:05 local time. "
                  "Checked bags up to 23 kg are included. Seats 14A and 14B are reserved for you.")
        _tool(mem, 1, "get_booking", '{"ref": "XK3P"}', result, None)
        parts = mem.list(user_id="u")
        assert len(parts) >= 3 and {p.metadata["document"]["part"] for p in parts} == set(range(1, len(parts) + 1))
        choice = mem.mount_choice("What are the details of my flight booking XK3P?", user_id="u", k=4)
        assert choice.contradicted == []


@pytest.mark.parametrize(("name", "first", "second", "question"), [
    ("get_balance", ('{"account": "savings"}', "8,421 EUR"), ('{"account": "checking"}', "1,204 EUR"),
     "How much money do I have?"),
    ("get_weather", ('{"city": "Oslo"}', "rain, 9 C"), ('{"city": "Rome"}', "sunny, 24 C"), "What's the weather like?"),
    ("stock_quote", ('{"symbol": "ACME"}', "132.40 USD, -1.8%"), ('{"symbol": "GLOBX"}', "88.10 USD, +0.4%"),
     "How are my stocks doing?"),
], ids=["balance", "weather", "stocks"])
def test_results_of_different_calls_of_one_tool_both_stand(tmp_path: Path, name: str, first: tuple[str, str],
                                                          second: tuple[str, str], question: str) -> None:
    # the check of statements (the pairwise model) does not judge tool results: before, it hid the savings
    # balance behind the checking one, as if the newer result replaced it
    with AgentMemory(tmp_path, kv_encoding="off") as mem:
        ids = {_tool(mem, 1, name, *first, "s1"), _tool(mem, 2, name, *second, "s2")}
        choice = mem.mount_choice(question, user_id="u", k=4)
        assert not ids & {h.id for h in choice.contradicted}
        assert ids <= {h.id for h in mem.recall(question, user_id="u", k=2)}
