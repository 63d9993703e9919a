"""A LangGraph ReAct agent with one tool whose results become memories, recalled in later sessions.

``create_react_agent`` gets agentmem through its two hooks: ``pre_model_hook`` recalls the user's memories
relevant to the latest messages and puts them in front of the model's input; ``post_model_hook`` stores the
new turn and every tool result (with the call that produced it) as memories. Threads are checkpointed with
LangGraph's SQLite saver; the memory and the checkpoints live in one directory and survive restarts.

The model must call tools, which agentmem's small local model cannot do, so the example ships a stand-in:
``ScriptedToolCaller`` calls ``get_weather`` when asked about a city and answers from the tool result, or
from a remembered tool result when the injected memories already hold one. Replace it with any tool-calling
chat model, e.g. ``ChatOpenAI(model="gpt-4o-mini")``: nothing else changes.

``--script``: Alice asks for two forecasts (tool calls); after a restart, in a new session, she asks again
and the agent answers from memory without calling the tool; Bob asks the same and, having no such memory,
gets a tool call. Exits with status 1 if memory was not used or crossed users.

    python examples/langgraph_agent.py --script
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

from agentmem import AgentMemory  # noqa: E402
from agentmem_langgraph import MemoryNode, is_context  # noqa: E402
from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.prebuilt import create_react_agent  # noqa: E402

FORECASTS = {"lisbon": "sunny, 24 C", "oslo": "rain all day, 9 C", "tokyo": "cloudy, 18 C"}


@tool
def get_weather(city: str) -> str:
    """Today's forecast for a city."""
    return f"{city.title()}: {FORECASTS.get(city.lower(), 'no forecast available')}"


class ScriptedToolCaller(BaseChatModel):
    """Stand-in for a tool-calling LLM, so the example runs offline and deterministically.

    It records the memory lines it was shown (``seen_memories``) and whether it called the tool.
    """

    seen_memories: list[list[str]] = []
    tool_calls_made: int = 0

    @property
    def _llm_type(self) -> str:
        return "scripted-tool-caller"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedToolCaller:
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        memories = [line[2:] for m in messages if is_context(m) for line in str(m.content).splitlines()
                    if line.startswith("- ")]
        self.seen_memories.append(memories)
        last_human = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        question = str(messages[last_human].content)
        city = next((c for c in FORECASTS if c in question.lower()), None)
        results = [m for m in messages[last_human + 1:] if isinstance(m, ToolMessage)]
        if results:
            reply = AIMessage(content=f"Here is the forecast: {results[-1].content}.")
        elif city and (known := [m for m in memories if "get_weather" in m and city in m.lower()]):
            forecast = re.sub(r"^.*returned: ", "", known[0])  # 'Tool get_weather: called with {...}, returned: X'
            reply = AIMessage(content=f"You checked earlier: {forecast} (from memory, no tool call).")
        elif city:
            self.tool_calls_made += 1
            reply = AIMessage(content="", tool_calls=[
                {"name": "get_weather", "args": {"city": city.title()}, "id": f"call-{self.tool_calls_made}"}])
        else:
            reply = AIMessage(content="I can look up the weather in Lisbon, Oslo or Tokyo.")
        return ChatResult(generations=[ChatGeneration(message=reply)])


def build_agent(mem: AgentMemory, conn: sqlite3.Connection, model: BaseChatModel) -> Any:
    memory = MemoryNode(mem, model=model, k=3)
    return create_react_agent(model, [get_weather], pre_model_hook=memory.pre_model_hook,
                              post_model_hook=memory.post_model_hook, checkpointer=SqliteSaver(conn))


def ask(agent: Any, model: ScriptedToolCaller, user: str, thread: str, text: str) -> tuple[str, int, list[str]]:
    """One user message; returns (answer, tool calls made, memory lines the model saw on its first step)."""
    calls_before, steps_before = model.tool_calls_made, len(model.seen_memories)
    state = agent.invoke({"messages": [("user", text)]}, {"configurable": {"user_id": user, "thread_id": thread}})
    answer = str(state["messages"][-1].content)
    seen = model.seen_memories[steps_before] if len(model.seen_memories) > steps_before else []
    print(f"\n[{user} | {thread}] {user}: {text}")
    for line in seen:
        print(f"  memory shown to the model: {line}")
    calls = model.tool_calls_made - calls_before
    print(f"  tool calls: {calls}")
    print(f"  agent: {answer}")
    return answer, calls, seen


def run_script(data: Path) -> int:
    failures: list[str] = []
    model = ScriptedToolCaller()

    with AgentMemory(data / "memory", kv_encoding="off") as mem:  # text mode only: no local LLM needed
        conn = sqlite3.connect(str(data / "checkpoints.sqlite"), check_same_thread=False)
        agent = build_agent(mem, conn, model)
        print("=== session 1: Alice plans a trip ===")
        for text in ["What's the weather in Lisbon today?", "And in Oslo?"]:
            _, calls, _ = ask(agent, model, "alice", "trip-planning", text)
            if calls != 1:
                failures.append(f"expected a tool call for {text!r}")
        stored = [r.text for r in mem.list(user_id="alice", kinds=["tool"])]
        print("\n  tool results stored as memories:", *(f"\n    - {t}" for t in stored))
        conn.close()

    print("\n--- restart: memory and checkpoints re-opened ---")
    with AgentMemory(data / "memory", kv_encoding="off") as mem:
        conn = sqlite3.connect(str(data / "checkpoints.sqlite"), check_same_thread=False)
        agent = build_agent(mem, conn, model)
        print("\n=== session 2: Alice packs, in a new thread ===")
        answer, calls, _ = ask(agent, model, "alice", "packing", "Do I need an umbrella in Oslo?")
        if calls or "rain" not in answer:
            failures.append("Alice's earlier Oslo forecast was not recalled from memory")
        print("\n=== Bob, same question ===")
        answer, calls, seen = ask(agent, model, "bob", "bob-1", "Do I need an umbrella in Oslo?")
        if any("Oslo" in line for line in seen) or calls != 1:
            failures.append("Bob was shown Alice's memories, or got no tool call")
        conn.close()

    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nOK: tool results became memories, were recalled in a later session, and stayed with their user.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--script", action="store_true", help="run the scripted sessions (the only mode)")
    parser.add_argument("--data", help="directory for memory and checkpoints (default: a temporary one)")
    args = parser.parse_args(argv)
    if not args.script:
        parser.error("this example is scripted: pass --script")
    data = Path(args.data) if args.data else Path(tempfile.mkdtemp(prefix="agentmem-agent-"))
    data.mkdir(parents=True, exist_ok=True)
    try:
        return run_script(data)
    finally:
        if not args.data:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
