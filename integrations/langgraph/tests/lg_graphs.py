"""The graph every integration test wires: START -> recall -> agent -> remember -> END (as docs/langgraph.md shows)."""

from __future__ import annotations

from typing import Any

from langgraph.graph import END, START, MessagesState, StateGraph

from agentmem_langgraph import MemoryNode


def build(memory: MemoryNode, llm: Any, checkpointer: Any, context_schema: Any = None) -> Any:
    """Compile the memory-wrapped chat graph around ``llm`` with ``checkpointer``."""
    builder = StateGraph(MessagesState, context_schema=context_schema)
    builder.add_node("recall", memory.recall)
    builder.add_node("agent", lambda state: {"messages": [llm.invoke(state["messages"])]})
    builder.add_node("remember", memory.remember)
    builder.add_edge(START, "recall")
    builder.add_edge("recall", "agent")
    builder.add_edge("agent", "remember")
    builder.add_edge("remember", END)
    return builder.compile(checkpointer=checkpointer)
