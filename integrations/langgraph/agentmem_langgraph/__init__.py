"""LangGraph integration for agentmem: LangChain 1.x agent middleware, a memory node, a KV-mounting chat model, a
``BaseStore`` and a retriever.

Only agentmem's public API is used (``from agentmem import ...``); the agentmem core never imports LangGraph.

Example:
    >>> from agentmem import AgentMemory
    >>> from agentmem_langgraph import AgentMemMiddleware, ChatAgentMem
    >>> from langchain.agents import create_agent
    >>> mem = AgentMemory("./memdata")                                            # doctest: +SKIP
    >>> agent = create_agent(ChatAgentMem(memory=mem), tools,                      # doctest: +SKIP
    ...                      middleware=[AgentMemMiddleware(mem)], checkpointer=InMemorySaver())
"""

from agentmem_langgraph._context import CONTEXT_PREFIX, is_context
from agentmem_langgraph.chat_model import ChatAgentMem
from agentmem_langgraph.middleware import AgentMemMiddleware
from agentmem_langgraph.node import MemoryNode
from agentmem_langgraph.retriever import AgentMemRetriever
from agentmem_langgraph.store import AgentMemStore, render_value

__all__ = ["CONTEXT_PREFIX", "AgentMemMiddleware", "AgentMemRetriever", "AgentMemStore", "ChatAgentMem", "MemoryNode",
           "is_context", "render_value"]
