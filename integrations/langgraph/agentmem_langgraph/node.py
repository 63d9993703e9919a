"""``MemoryNode``: recall before each LLM step, remember after it, for any ``MessagesState``-style graph.

Scoping follows LangGraph: the session is ``configurable["thread_id"]``; the user is
``configurable["user_id"]`` (or ``langgraph_user_id``), else the runtime context's ``user_id``, else the
``user_id`` given here. Recall searches all of the user's memories (every thread), never another user's.

Two ways to wire it:

* **Nodes** around your LLM node: ``recall`` puts one memory-context message in the state (replacing the
  previous one), ``remember`` writes the new turn and tool results as memories::

      memory = MemoryNode(mem, model=llm)
      builder = StateGraph(MessagesState)
      builder.add_node("recall", memory.recall)
      builder.add_node("agent", lambda state: {"messages": [llm.invoke(state["messages"])]})
      builder.add_node("remember", memory.remember)
      builder.add_edge(START, "recall"); builder.add_edge("recall", "agent")
      builder.add_edge("agent", "remember"); builder.add_edge("remember", END)

* **Hooks** of ``create_react_agent``: ``pre_model_hook`` returns ``llm_input_messages`` (memories first,
  the state's messages untouched), ``post_model_hook`` remembers::

      agent = create_react_agent(llm, tools, pre_model_hook=memory.pre_model_hook,
                                 post_model_hook=memory.post_model_hook, checkpointer=InMemorySaver())

Mount mode is automatic: :class:`~agentmem_langgraph.ChatAgentMem` mounts the recalled entries' stored KV
(it reads their ids from the context message); any other chat model reads them as a system message. Give
``model=`` so that, for ``ChatAgentMem``, the state carries only the ids and not the texts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any, Literal

from agentmem import AgentMemory, Hit
from agentmem.chat_text import document_parts, tool_result_text
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig

from agentmem_langgraph._context import (
    MARK_KEY,
    context_message,
    is_context,
    message_text,
    resolve_scope,
    state_messages,
)

__all__ = ["MemoryNode"]

log = logging.getLogger("agentmem_langgraph")

MountMode = Literal["auto", "kv", "text"]


def _is_agentmem_model(model: Any) -> bool:
    from agentmem_langgraph.chat_model import ChatAgentMem

    seen = 0
    while model is not None and seen < 8:  # unwrap .bind(...) / .with_config(...) bindings
        if isinstance(model, ChatAgentMem):
            return True
        model, seen = getattr(model, "bound", None), seen + 1
    return False


class MemoryNode:
    """Recall-and-mount before the model, remember after it. See the module docstring for wiring.

    Args:
        memory: the :class:`agentmem.AgentMemory` to read and write.
        model: the chat model of the graph, only used to pick the mount mode (optional).
        mode: ``"auto"`` (KV for ``ChatAgentMem``, text otherwise), ``"kv"`` or ``"text"``.
        user_id: fallback user when neither the config nor the runtime context names one.
        k: how many memories to recall per step.
        kinds / tags: restrict recall to these entry kinds / tags (e.g. ``kinds=["turn", "tool"]``).
        min_score: drop recalled memories scoring below this (``Hit.score``: how likely the memory answers, in
            [0, 1]), on top of the store's one mount policy (``AgentMemory.recall_for_mount``: no assistant replies,
            nothing below ``MemoryConfig.mount_min_score``, 0.3 by default).
        write_tags / ttl: tags and time-to-live given to the memories this node writes.
        user_name: speaker name written with the user's messages (default: the message's ``name``).
        tool_result_words: a tool result longer than this many words (a fetched page) is stored as parts of at
            most that many, each with the call's arguments (``AgentMemory.remember_document``'s cuts), so each
            part is recalled and mounted on its own; None stores every result whole.

    Example:
        >>> memory = MemoryNode(mem, k=3)                                          # doctest: +SKIP
        >>> graph.invoke({"messages": [("user", "hi")]},                            # doctest: +SKIP
        ...              {"configurable": {"thread_id": "t1", "user_id": "alice"}})
    """

    def __init__(
        self,
        memory: AgentMemory,
        *,
        model: Any = None,
        mode: MountMode = "auto",
        user_id: str | None = None,
        k: int = 4,
        kinds: Iterable[str] | None = None,
        tags: Iterable[str] | None = None,
        min_score: float | None = None,
        write_tags: Iterable[str] | None = None,
        ttl: float | timedelta | None = None,
        user_name: str | None = None,
        query_chars: int = 2000,
        tool_result_words: int | None = 150,
    ) -> None:
        if mode not in ("auto", "kv", "text"):
            raise ValueError(f"mode must be 'auto', 'kv' or 'text', got {mode!r}")
        self.memory = memory
        self.model = model
        self.mode = mode
        self.user_id = user_id
        self.k = k
        self.kinds = list(kinds) if kinds is not None else None
        self.tags = list(tags) if tags is not None else None
        self.min_score = min_score
        self.write_tags = list(write_tags) if write_tags is not None else None
        self.ttl = ttl
        self.user_name = user_name
        self.query_chars = query_chars
        self.tool_result_words = tool_result_words

    @property
    def mount_mode(self) -> Literal["kv", "text"]:
        """``kv`` when the model is agentmem's own (its KV is mounted), else ``text`` (a system message)."""
        if self.mode != "auto":
            return self.mode  # type: ignore[return-value]
        return "kv" if _is_agentmem_model(self.model) else "text"

    # --- recall ----------------------------------------------------------------------------------
    def search(self, state: Any, config: RunnableConfig | None = None, runtime: Any = None, *,
               mode: Literal["kv", "text"] | None = None) -> list[Hit]:
        """The memories relevant to the latest messages, leaving out those already in the conversation.

        ``mode`` is the mount mode they are for (default: :attr:`mount_mode`).
        """
        messages = state_messages(state)
        query = self._query(messages)
        if not query:
            return []
        user, thread = resolve_scope(config, runtime, default_user=self.user_id)
        if (mode or self.mount_mode) == "kv" and thread:
            # ChatAgentMem answers through the thread's agentmem session, whose working KV already holds the
            # thread's turns and which recalls k memories minus those: choose exactly what it will mount
            hits = self.memory.recall_for_mount(query, user_id=user, k=self.k, kinds=self.kinds, tags=self.tags,
                                                min_score=self.min_score, asking_session=thread)
            hits = [h for h in hits if h.session_id != thread]
        else:
            present = [m.id for m in messages if m.id]
            # entries written from messages still in the window would only repeat them: skip them in the
            # search itself, so k memories still come back
            filters = {"message_id": {"$nin": present}} if present else None
            hits = self.memory.recall_for_mount(query, user_id=user, k=self.k, kinds=self.kinds, tags=self.tags,
                                                filters=filters, min_score=self.min_score, asking_session=thread)
        return hits

    def recall(self, state: Any, config: RunnableConfig, runtime: Any = None) -> dict[str, Any]:
        """Graph node: replace the state's memory-context message with one for the latest messages."""
        messages = state_messages(state)
        hits = self.search(state, config, runtime)
        update: list[BaseMessage] = [RemoveMessage(id=m.id) for m in messages if is_context(m)]
        # in KV mode an empty context message still matters: it tells the model to mount nothing
        if hits or self.mount_mode == "kv":
            update.append(context_message(hits, mode=self.mount_mode, k=self.k))
        log.debug("recall: %d memories (%s)", len(hits), self.mount_mode)
        return {"messages": update} if update else {}

    def pre_model_hook(self, state: Any, config: RunnableConfig, runtime: Any = None) -> dict[str, Any]:
        """``create_react_agent`` pre-model hook: ``llm_input_messages`` = memories + the conversation.

        The state's ``messages`` are left as they are, so memories never pile up in the history.
        """
        messages = [m for m in state_messages(state) if not is_context(m)]
        hits = self.search(state, config, runtime)
        if not hits and self.mount_mode != "kv":
            return {"llm_input_messages": messages}
        lead = 0
        while lead < len(messages) and isinstance(messages[lead], SystemMessage):
            lead += 1  # keep the caller's own system prompt first
        ctx = context_message(hits, mode=self.mount_mode, k=self.k)
        return {"llm_input_messages": [*messages[:lead], ctx, *messages[lead:]]}

    # --- remember --------------------------------------------------------------------------------
    def remember(self, state: Any, config: RunnableConfig, runtime: Any = None) -> dict[str, Any]:
        """Graph node: store the messages added since the last remembered one (turns and tool results).

        Each remembered message is marked (``response_metadata["agentmem_memory"]["entry_id"]``) by returning it
        again with the same id, so re-running the node, resuming a thread or restarting the process never
        stores a message twice, and an erased memory is not written back.
        """
        messages = state_messages(state)
        pending = self._pending(messages)
        if not pending:
            return {}
        user, thread = resolve_scope(config, runtime, default_user=self.user_id)
        calls = {c["id"]: c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls if c.get("id")}
        items: list[dict[str, Any]] = []
        written, skipped = [], []  # written: (message, index of its first item)
        for m in pending:
            parts = self._entries(m, calls, user=user, thread=thread)
            if parts:
                written.append((m, len(items)))
                items += parts
            else:
                skipped.append(m)
        records = self.memory.remember_many(items) if items else []
        marks = [_mark(m, records[first].id) for m, first in written] + [_mark(m, None) for m in skipped]
        log.debug("remember: %d memories from %d messages", len(records), len(pending))
        return {"messages": marks}

    post_model_hook = remember

    # --- helpers ---------------------------------------------------------------------------------
    def _query(self, messages: Sequence[BaseMessage]) -> str:
        convo = [m for m in messages if not is_context(m) and not isinstance(m, SystemMessage)]
        if not convo:
            return ""
        # what arrived since the model last spoke (a user turn, tool results) is what this step is about
        start = len(convo)
        while start > 0 and not isinstance(convo[start - 1], AIMessage):
            start -= 1
        fresh = convo[start:] or convo[-1:]
        text = "\n".join(t for t in (message_text(m).strip() for m in fresh) if t)
        return text[-self.query_chars:]

    @staticmethod
    def _pending(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        out = []
        for m in reversed(messages):
            if is_context(m):
                continue
            if MARK_KEY in (m.response_metadata or {}):
                break  # everything before the last remembered message was handled by an earlier step
            if isinstance(m, (HumanMessage, AIMessage, ToolMessage)):
                out.append(m)
        out.reverse()
        return out

    def _entries(self, m: BaseMessage, calls: dict[str, Any], *, user: str, thread: str | None) -> list[dict[str, Any]]:
        """The memories one message becomes: none, one, or a long tool result's parts (each with its call's
        arguments, ``metadata["document"]`` numbering them as ``remember_document`` does)."""
        item = self._entry(m, calls, user=user, thread=thread)
        if item is None or item["kind"] != "tool" or self.tool_result_words is None:
            return [] if item is None else [item]
        parts = document_parts(message_text(m).strip(), self.tool_result_words, title=item["speaker"],
                               document_id=m.id or m.tool_call_id)
        if len(parts) < 2:
            return [item]
        args = (calls.get(m.tool_call_id) or {}).get("args")
        return [{**item, "text": tool_result_text(part, args), "metadata": {**item["metadata"], "document": info}}
                for part, info in parts]

    def _entry(self, m: BaseMessage, calls: dict[str, Any], *, user: str, thread: str | None) -> dict[str, Any] | None:
        text = message_text(m).strip()
        if not text:
            return None  # e.g. an AI message that only calls tools: its call is kept with the tool's result
        meta: dict[str, Any] = {"message_id": m.id, "thread_id": thread}
        item: dict[str, Any] = dict(user_id=user, session_id=thread, metadata=meta, tags=self.write_tags,
                                    ttl=self.ttl)
        if isinstance(m, ToolMessage):
            call = calls.get(m.tool_call_id) or {}
            name = m.name or call.get("name") or "tool"
            # a result means little without its question: keep the call's arguments with it; the memory line
            # reads 'Tool get_weather: called with {"city": "Paris"}, returned: 21 C' (as remember_messages writes it)
            meta["tool_call_id"] = m.tool_call_id
            return {**item, "text": tool_result_text(text, call.get("args")), "kind": "tool", "role": "tool",
                    "speaker": name}
        if isinstance(m, HumanMessage):
            return {**item, "text": text, "kind": "turn", "role": "user", "speaker": m.name or self.user_name}
        return {**item, "text": text, "kind": "turn", "role": "assistant", "speaker": m.name}


def _mark(message: BaseMessage, entry_id: str | None) -> BaseMessage:
    meta = {**(message.response_metadata or {}), MARK_KEY: {"entry_id": entry_id}}
    return message.model_copy(update={"response_metadata": meta})
