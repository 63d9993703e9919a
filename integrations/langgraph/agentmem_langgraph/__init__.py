"""LangGraph integration for agentmem: a memory node, a KV-mounting chat model and a ``BaseStore``.

Only agentmem's public API is used (``from agentmem import ...``); the agentmem core never imports LangGraph.

Example:
    >>> from agentmem import AgentMemory
    >>> from agentmem_langgraph import AgentMemStore, ChatAgentMem, MemoryNode
    >>> mem = AgentMemory("./memdata")                                            # doctest: +SKIP
    >>> memory = MemoryNode(mem)                                                  # doctest: +SKIP
    >>> agent = create_react_agent(llm, tools, pre_model_hook=memory.pre_model_hook,   # doctest: +SKIP
    ...                            post_model_hook=memory.post_model_hook, checkpointer=InMemorySaver())
"""

from agentmem_langgraph._context import CONTEXT_PREFIX, is_context
from agentmem_langgraph.chat_model import ChatAgentMem
from agentmem_langgraph.node import MemoryNode
from agentmem_langgraph.store import AgentMemStore, render_value

__all__ = ["CONTEXT_PREFIX", "AgentMemStore", "ChatAgentMem", "MemoryNode", "is_context", "render_value"]
