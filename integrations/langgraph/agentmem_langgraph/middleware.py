"""``AgentMemMiddleware``: agentmem as the long-term memory of a LangChain 1.x ``create_agent`` agent.

LangChain 1.x agents take **middleware** (``langchain.agents.middleware.AgentMiddleware``) instead of
``create_react_agent``'s pre/post model hooks. This one wraps every model call:

* ``wrap_model_call`` recalls the memories relevant to what arrived since the model last spoke and hands the
  model one memory-context message in front of the conversation (the agent's state is not touched, so memories
  never pile up in the history);
* ``after_model`` stores the new messages (user and assistant turns, tool results) as memories, marking each
  so that nothing is stored twice.

With :class:`~agentmem_langgraph.ChatAgentMem` as the agent's model the context message carries only entry
ids and the model mounts their stored KV; any other chat model reads the memories as a system message. Users
and sessions follow LangGraph: ``configurable["user_id"]`` (or the runtime context's ``user_id``) and
``configurable["thread_id"]``.

Example:
    >>> from langchain.agents import create_agent
    >>> agent = create_agent(llm, tools, middleware=[AgentMemMiddleware(mem)])          # doctest: +SKIP
    >>> agent.invoke({"messages": [("user", "hi")]},                                  # doctest: +SKIP
    ...              {"configurable": {"user_id": "alice", "thread_id": "1"}})
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import Any, Literal

from agentmem import AgentMemory
from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain_core.messages import SystemMessage
from langgraph.config import get_config
from langgraph.runtime import Runtime
from typing_extensions import TypedDict, Unpack

from agentmem_langgraph._context import context_message, is_context
from agentmem_langgraph.node import MemoryNode, MountMode, _is_agentmem_model

__all__ = ["AgentMemMiddleware"]


class MemoryOptions(TypedDict, total=False):
    """:class:`~agentmem_langgraph.MemoryNode`'s options, which the middleware passes on."""

    mode: MountMode
    user_id: str | None
    k: int
    kinds: Iterable[str] | None
    tags: Iterable[str] | None
    min_score: float | None
    write_tags: Iterable[str] | None
    ttl: float | timedelta | None
    user_name: str | None
    tool_result_words: int | None


class AgentMemMiddleware(AgentMiddleware):
    """Recall before each model call, remember after it, for ``langchain.agents.create_agent``.

    Args:
        memory: the :class:`agentmem.AgentMemory` to read and write.
        mode: ``"auto"`` (KV when the agent's model is ``ChatAgentMem``, text otherwise), ``"kv"`` or ``"text"``.
        user_id: fallback user when neither the config nor the runtime context names one.
        k / kinds / tags / min_score: what to recall (as :class:`~agentmem_langgraph.MemoryNode`).
        write_tags / ttl / user_name / tool_result_words: for the memories it writes (a long tool result is stored
            as parts, as :class:`~agentmem_langgraph.MemoryNode` does).

    Example:
        >>> agent = create_agent(ChatAgentMem(memory=mem), [],                              # doctest: +SKIP
        ...                      middleware=[AgentMemMiddleware(mem, k=3)], checkpointer=InMemorySaver())
    """

    def __init__(self, memory: AgentMemory, **options: Unpack[MemoryOptions]) -> None:
        super().__init__()
        # the node does the recalling and remembering; the middleware only places it around the model call
        self.node = MemoryNode(memory, **options)

    @property
    def name(self) -> str:
        """The middleware's node-name prefix in the agent graph."""
        return "AgentMemMiddleware"

    def _mode(self, model: Any) -> Literal["kv", "text"]:
        if self.node.mode != "auto":
            return self.node.mode  # type: ignore[return-value]
        return "kv" if _is_agentmem_model(model) else "text"

    def _with_memories(self, request: ModelRequest) -> ModelRequest:
        """The request with one memory-context message in front of the conversation (any older one dropped)."""
        mode = self._mode(request.model)
        state = {**request.state, "messages": request.messages}
        hits = self.node.search(state, get_config(), request.runtime, mode=mode)
        messages = [m for m in request.messages if not is_context(m)]
        if not hits and mode != "kv":  # in KV mode an empty context still says "mount nothing"
            return request.override(messages=messages)
        lead = 0
        while lead < len(messages) and isinstance(messages[lead], SystemMessage):
            lead += 1  # system messages the caller put in the conversation stay first
        ctx = context_message(hits, mode=mode, k=self.node.k)
        return request.override(messages=[*messages[:lead], ctx, *messages[lead:]])

    def wrap_model_call(self, request: ModelRequest,
                        handler: Callable[[ModelRequest], ModelResponse]) -> ModelResponse:
        """Recall and hand the memories to the model with this call's messages."""
        return handler(self._with_memories(request))

    async def awrap_model_call(self, request: ModelRequest,
                               handler: Callable[[ModelRequest], Awaitable[ModelResponse]]) -> ModelResponse:
        """Async :meth:`wrap_model_call` (recall runs on a worker thread, which ``asyncio.to_thread`` gives the
        caller's context, so the run's config names the same user and thread there)."""
        return await handler(await asyncio.to_thread(self._with_memories, request))

    def after_model(self, state: AgentState, runtime: Runtime) -> dict[str, Any] | None:
        """Store the messages added since the last stored one (turns, tool results) as memories."""
        return self.node.remember(state, get_config(), runtime) or None

    async def aafter_model(self, state: AgentState, runtime: Runtime) -> dict[str, Any] | None:
        """Async :meth:`after_model` (on a worker thread: agentmem's API is blocking)."""
        return await asyncio.to_thread(self.after_model, state, runtime)
