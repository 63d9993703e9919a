"""Tool calling and true streaming with ChatAgentMem.

No tool-tuned model is available here, so the model is a tiny random Llama whose decoding is constrained by a
scripted logits processor (it forces the tokens of a scripted reply, the way a grammar constraint would): the
tool rendering, the parsing into ``AIMessage.tool_calls``, the graph, the tool run and the memories are all real.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import create_react_agent

from agentmem import AgentMemory, InvalidInputError
from agentmem.kv.testing import CHATML_TEMPLATE, CHATML_TOOLS_TEMPLATE, tiny_causal_lm
from agentmem_langgraph import ChatAgentMem, MemoryNode

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
FINAL = "It is 21 C and sunny in Paris."


class Script:
    """Forces each generation to spell out the next scripted reply, then end (EOS); a decoding constraint."""

    def __init__(self, tokenizer, replies: list[str], *, pause_at: int | None = None,
                 resume: threading.Event | None = None) -> None:
        self.replies = [tokenizer(r, add_special_tokens=False).input_ids for r in replies]
        self.eos = tokenizer.eos_token_id
        self.call = -1
        self.pause_at, self.resume = pause_at, resume
        self.resumed_in_time: bool | None = None

    def __call__(self, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        n = ids.shape[-1]
        if n == 0:
            self.call += 1
        if self.pause_at is not None and n == self.pause_at and self.resumed_in_time is None:
            # Decoding waits here, mid-answer, until the consumer has seen a first chunk: with a replayed stream
            # (chunks only after decoding ended) the wait times out.
            self.resumed_in_time = self.resume.wait(timeout=30)
        reply = self.replies[min(self.call, len(self.replies) - 1)]
        want = reply[n] if n < len(reply) else self.eos
        out = torch.full_like(scores, float("-inf"))
        out[..., want] = 0.0
        return out


@pytest.fixture
def toolmem(tmp_path):
    model, tok = tiny_causal_lm("llama", seed=0, chat_template=CHATML_TOOLS_TEMPLATE)
    # the byte-level tiny tokenizer spends one token per byte: the tool instructions alone are ~450 tokens
    model.config.max_position_embeddings = 2048
    with AgentMemory(tmp_path / "mem", model=(model, tok)) as mem:
        yield mem, tok


CALLS: list[str] = []


@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    CALLS.append(city)
    return f"21 C and sunny in {city}"


def test_tools_are_rendered_through_the_chat_template(toolmem, tiny_lm):
    mem, _ = toolmem
    schema = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                               "parameters": {"type": "object", "properties": {}}}}
    rendered = mem.tool_prompt([schema])
    assert rendered.startswith("# Tools") and '"name": "get_weather"' in rendered
    assert rendered.endswith("within <tool_call></tool_call> XML tags.")  # the template's own words
    # a template without tool support gets Hermes-style instructions instead
    with AgentMemory(mem.path.parent / "plain", model=tiny_causal_lm("llama", chat_template=CHATML_TEMPLATE)) as m2:
        assert "You are provided with function signatures" in m2.tool_prompt([schema])


def test_bound_tools_come_back_as_tool_calls(toolmem):
    mem, tok = toolmem
    llm = ChatAgentMem(memory=mem, user_id="alice", max_new_tokens=120, logits_processor=Script(tok, [CALL]))
    msg = llm.bind_tools([get_weather]).invoke("What is the weather in Paris?")
    assert isinstance(msg, AIMessage) and msg.content == ""
    assert [(c["name"], c["args"]) for c in msg.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert msg.tool_calls[0]["id"].startswith("call_")


def test_react_agent_runs_a_tool_and_its_result_is_mounted_later(toolmem):
    mem, tok = toolmem
    CALLS.clear()
    llm = ChatAgentMem(memory=mem, max_new_tokens=120, logits_processor=Script(tok, [CALL, FINAL]))
    node = MemoryNode(mem, model=llm, k=2)
    agent = create_react_agent(llm, [get_weather], pre_model_hook=node.pre_model_hook,
                               post_model_hook=node.post_model_hook, checkpointer=InMemorySaver())
    out = agent.invoke({"messages": [("user", "What is the weather in Paris?")]},
                       {"configurable": {"user_id": "alice", "thread_id": "t1"}})
    assert CALLS == ["Paris"]
    tool_msgs = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.content for m in tool_msgs] == ["21 C and sunny in Paris"]
    assert out["messages"][-1].content == FINAL and not out["messages"][-1].tool_calls
    # the tool result is a kind="tool" memory (with the call's arguments) ...
    tools = mem.list(user_id="alice", kinds=["tool"])
    assert len(tools) == 1 and "21 C and sunny in Paris" in tools[0].text and '"city": "Paris"' in tools[0].text
    # ... and a later conversation mounts it as KV
    later = ChatAgentMem(memory=mem, user_id="alice", k=2, max_new_tokens=2)
    info = later.invoke("What was the weather in Paris?",
                        config={"configurable": {"thread_id": "t2"}}).response_metadata["agentmem"]
    assert tools[0].id in info["mounted"] and info["mode"] == "kv"


def test_stream_yields_the_first_chunk_before_decoding_ends(toolmem):
    mem, tok = toolmem
    text = "Lyon, since last May, with the dog."
    seen = threading.Event()
    script = Script(tok, [text], pause_at=12, resume=seen)
    llm = ChatAgentMem(memory=mem, user_id="alice", max_new_tokens=80, logits_processor=script)
    chunks = []
    for chunk in llm.stream("Where do I live?"):
        chunks.append(chunk)
        seen.set()
    assert script.resumed_in_time is True  # decoding was still waiting at token 12 when the first chunk arrived
    assert "".join(c.content for c in chunks) == text and len(chunks) > 3
    assert chunks[-1].response_metadata["agentmem"]["mode"] == "kv"


def test_astream_is_true_streaming_too_and_stop_strings_cut_it(toolmem):
    mem, tok = toolmem
    seen = threading.Event()
    script = Script(tok, ["Lyon, since May. STOP and more"], pause_at=8, resume=seen)
    llm = ChatAgentMem(memory=mem, user_id="alice", max_new_tokens=80, logits_processor=script)

    async def consume() -> list[str]:
        out = []
        async for chunk in llm.astream("Where do I live?", stop=[" STOP"]):
            out.append(chunk.content)
            seen.set()
        return out

    pieces = asyncio.run(consume())
    assert script.resumed_in_time is True
    assert "".join(pieces) == "Lyon, since May."


def test_stream_inside_a_thread_streams_the_session_turn(toolmem):
    mem, _ = toolmem
    llm = ChatAgentMem(memory=mem, user_id="alice", max_new_tokens=12)
    chunks = list(llm.stream("Where do I live?", thread_id="t-stream"))
    info = chunks[-1].response_metadata["agentmem"]
    assert info["thread_id"] == "t-stream" and chunks[-1].response_metadata["agentmem_memory"]["by"] == "session"
    streamed = "".join(c.content for c in chunks)
    stored = [r.text for r in mem.list(user_id="alice", session_id="t-stream")]
    assert stored[-1] == streamed.strip() or streamed.strip() in stored[-1]  # the session stored what was streamed
    assert len([c for c in chunks if c.content]) > 1


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                   "required": ["city"], "additionalProperties": False}}}
CLOCK_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize("choice, names", [
    ("get_weather", {"get_weather"}), ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"}),
    ("any", {"get_weather", "get_time"}), ("required", {"get_weather", "get_time"}),
])
def test_a_required_tool_choice_always_comes_back_as_a_call(toolmem, choice, names):
    """LangChain's ``bind_tools(..., tool_choice=...)`` forcing a call: decoding is held to a call of the named
    tool(s) (``tool_call_schema``), so even this untrained random model returns one, with valid arguments."""
    mem, _ = toolmem
    llm = ChatAgentMem(memory=mem, user_id="u1", max_new_tokens=120, use_session=False)
    msg = llm.bind_tools([WEATHER_TOOL, CLOCK_TOOL], tool_choice=choice).invoke("What is the weather in Paris?")
    assert len(msg.tool_calls) == 1 and msg.tool_calls[0]["name"] in names
    if msg.tool_calls[0]["name"] == "get_weather":
        assert set(msg.tool_calls[0]["args"]) == {"city"} and len(msg.tool_calls[0]["args"]["city"]) <= 8


def test_tool_choice_none_leaves_the_tools_out_and_a_wrong_name_is_refused(toolmem):
    mem, tok = toolmem
    script = Script(tok, [CALL])
    llm = ChatAgentMem(memory=mem, user_id="u1", max_new_tokens=80, use_session=False, logits_processor=script)
    out = llm.bind_tools([WEATHER_TOOL], tool_choice="none").invoke("What is the weather in Paris?")
    # the tools were not offered, so the prompt is the plain question's (far shorter than with ~450 tool tokens)
    assert out.usage_metadata["input_tokens"] < 300
    with pytest.raises(InvalidInputError, match="tool_choice"):
        llm.bind_tools([WEATHER_TOOL], tool_choice="get_time").invoke("What is the weather in Paris?")


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_call_cut_short_comes_back_as_an_invalid_tool_call(toolmem, stream):
    """A call that max_new_tokens cut off is not valid JSON: LangChain's ``invalid_tool_calls`` hold it, with the
    reason, and the content is empty (an agent must not take the fragment for an answer)."""
    mem, _ = toolmem
    llm = ChatAgentMem(memory=mem, user_id="u1", max_new_tokens=6, use_session=False).bind_tools(
        [WEATHER_TOOL], tool_choice="get_weather")
    if stream:
        msg = None
        for chunk in llm.stream("What is the weather in Paris?"):
            msg = chunk if msg is None else msg + chunk
    else:
        msg = llm.invoke("What is the weather in Paris?")
    assert msg.tool_calls == [] and msg.content == ""
    assert len(msg.invalid_tool_calls) == 1 and msg.invalid_tool_calls[0]["args"].startswith("{")
    assert msg.response_metadata["finish_reason"] == "length"
    if not stream:
        assert "max_new_tokens" in msg.invalid_tool_calls[0]["error"]


def test_an_answer_says_why_it_ended(toolmem):
    """``response_metadata["finish_reason"]``, as LangChain's chat models report it: "length" when max_new_tokens
    cut the answer (this random model never stops on its own), on invoke and on the streamed last chunk."""
    mem, _ = toolmem
    llm = ChatAgentMem(memory=mem, user_id="u1", max_new_tokens=4, use_session=False)
    whole = llm.invoke("Hello?")
    streamed = None
    for chunk in llm.stream("Hello?"):
        streamed = chunk if streamed is None else streamed + chunk
    for msg in (whole, streamed):
        assert msg.response_metadata["finish_reason"] == "length"
        assert "finish_reason" not in msg.response_metadata["agentmem"]
