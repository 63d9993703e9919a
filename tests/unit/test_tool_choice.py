"""``agentmem.chat_text.choose_tools``: the one reading of ``tool_choice`` behind the server's OpenAI endpoint and
``ChatAgentMem`` (both shapes, OpenAI's and LangChain's, read the same)."""

from __future__ import annotations

import pytest

from agentmem import InvalidInputError
from agentmem.chat_text import choose_tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("choice", [None, "auto", False])
def test_the_model_decides(choice):
    assert choose_tools([WEATHER, TIME], choice) == ([WEATHER, TIME], [])


@pytest.mark.parametrize("choice", ["required", "any", True])
def test_a_call_of_any_tool_is_required(choice):
    assert choose_tools([WEATHER, TIME], choice) == ([WEATHER, TIME], [WEATHER, TIME])


@pytest.mark.parametrize("choice", ["get_time", {"type": "function", "function": {"name": "get_time"}},
                                    {"name": "get_time"}])
def test_one_named_tool_is_required_in_every_shape(choice):
    assert choose_tools([WEATHER, TIME], choice) == ([WEATHER, TIME], [TIME])


def test_none_offers_no_tools():
    assert choose_tools([WEATHER], "none") == ([], [])


def test_a_required_call_without_tools_and_an_unknown_name_are_refused_by_name():
    with pytest.raises(InvalidInputError, match="tool_choice 'required' needs tools"):
        choose_tools(None, "required")
    with pytest.raises(InvalidInputError, match=r"one of the tools \(get_weather, get_time\), got 'get_date'"):
        choose_tools([WEATHER, TIME], {"type": "function", "function": {"name": "get_date"}})
