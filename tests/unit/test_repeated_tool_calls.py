"""A tool called again with the same arguments: its newer result is what the call returns now
(agentmem/consolidate/tool_calls.py). On write it supersedes the earlier result (``event="UPDATE"``, history kept,
``restore`` undoes it); with consolidation off, recall ranks the older result after the newer and a mount leaves it
out (``MountChoice.contradicted``). Another call, and the parts of one long result, stand. Through the public API,
with the real embedder."""

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


def test_the_same_call_again_supersedes_its_older_result_on_write(tmp_path: Path) -> None:
    with AgentMemory(tmp_path, kv_encoding="off") as mem:
        old = _tool(mem, 1, "order_status", '{"order": "A-17"}', "processing, not shipped yet", "s1")
        other = _tool(mem, 2, "order_status", '{"order": "B-2"}', "processing, not shipped yet", "s1")
        calls = [{"id": "c3", "type": "function", "function": {"name": "order_status",
                                                              "arguments": '{"order": "A-17"}'}}]
        new = mem.remember_messages([{"role": "assistant", "content": None, "tool_calls": calls},
                                     {"role": "tool", "tool_call_id": "c3", "content": "shipped with DHL"}],
                                    user_id="u", session_id="s2")[0]
        assert (new.event, new.superseded_ids) == ("UPDATE", (old,))
        assert mem.get(old).status == "superseded" and mem.get(other).status == "active"  # another call stands
        question = "What is the status of my order A-17?"
        assert old not in [h.id for h in mem.recall(question, user_id="u", k=5)]
        assert old in [h.id for h in mem.recall(question, user_id="u", k=5, include_superseded=True)]
        assert [v.op for v in mem.history(old)] == ["add", "supersede"]
        assert mem.restore(old).status == "active"  # the write got it wrong: undo it


def _as_given(mem: AgentMemory, name: str, arguments: str, result: str, session: str) -> str:
    text = f"called with {arguments}, returned: {result}"  # as remember_messages writes it
    return mem.remember_many([dict(text=text, user_id="u", kind="tool", role="tool", speaker=name,
                                   session_id=session)], consolidate=False)[0].id


def test_results_stored_as_given_are_settled_by_recall(tmp_path: Path) -> None:
    # written without consolidation (a bulk load, results stored before the write rule): recall ranks the older
    # result after the newer and a mount leaves it out
    with AgentMemory(tmp_path, kv_encoding="off") as mem:
        old = _as_given(mem, "order_status", '{"order": "A-17"}', "processing, not shipped yet", "s1")
        physio = _as_given(mem, "get_appointment", '{"who": "physio"}', "Wednesday 19 March, 5 pm", "s1")
        new = _as_given(mem, "order_status", '{"order": "A-17"}', "shipped with DHL, arrives Friday", "s2")
        assert mem.get(old).status == "active"  # nothing superseded on write
        question = "What is the status of my order A-17?"
        ranked = [h.id for h in mem.recall(question, user_id="u", k=3)]
        assert ranked.index(new) < ranked.index(old), ranked
        choice = mem.mount_choice(question, user_id="u")
        assert new in [h.id for h in choice.mounted] and old not in [h.id for h in choice.mounted]
        assert [h.id for h in choice.contradicted] == [old]
        # another call of the same tool (other arguments) stands beside it
        other = _as_given(mem, "order_status", '{"order": "B-2"}', "processing, not shipped yet", "s3")
        both = mem.mount_choice("Have my orders shipped?", user_id="u", k=4)
        assert {new, other} <= {h.id for h in both.mounted} and old not in {h.id for h in both.mounted}
        assert physio not in {h.id for h in both.contradicted}


def test_the_parts_of_one_long_result_stand_together_and_go_together(tmp_path: Path) -> None:
    with AgentMemory(tmp_path, kv_encoding="off", message_max_words=12) as mem:
        result = ("Flight TP751 departs Oslo at 10:40 from gate D7. It arrives in Lisbon at 14:05 local time. "
                  "Checked bags up to 23 kg are included. Seats 14A and 14B are reserved for you.")
        _tool(mem, 1, "get_booking", '{"ref": "XK3P"}', result, None)
        parts = mem.list(user_id="u")
        assert len(parts) >= 3 and {p.metadata["document"]["part"] for p in parts} == set(range(1, len(parts) + 1))
        assert all(p.status == "active" for p in parts)  # one text's parts never replace each other
        assert mem.mount_choice("What are the details of my flight booking XK3P?", user_id="u", k=4).contradicted == []
        # the booking asked for again: its first part replaces every part of the earlier result
        call = {"id": "c2", "type": "function", "function": {"name": "get_booking", "arguments": '{"ref": "XK3P"}'}}
        again = mem.remember_messages([{"role": "assistant", "content": None, "tool_calls": [call]},
                                       {"role": "tool", "tool_call_id": "c2", "content": result.replace("D7", "D9")}],
                                      user_id="u")
        assert set(again[0].superseded_ids) == {p.id for p in parts}
        assert all(r.event == "ADD" for r in again[1:]) and {mem.get(p.id).status for p in parts} == {"superseded"}


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
