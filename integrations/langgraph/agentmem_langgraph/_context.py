"""What the memory node and the chat model share: the context message, scope resolution, message text.

The node tells the model what it mounted through one ``SystemMessage`` whose id starts with
:data:`CONTEXT_PREFIX` and whose ``additional_kwargs["agentmem"]`` holds ``{"mounted": [entry ids], "mode": ...}``.
Any chat model reads its text (text mode); :class:`~agentmem_langgraph.ChatAgentMem` recognises it, drops the
text and mounts the ids' stored KV instead (KV mode). Only ids and short text ever enter graph state, so
checkpoints stay small and serialisable.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from agentmem import Hit, InvalidInputError
from langchain_core.messages import BaseMessage, SystemMessage

CONTEXT_PREFIX = "agentmem-context"
META_KEY = "agentmem"  # additional_kwargs key of the context message; response_metadata key of answers
MARK_KEY = "agentmem_memory"  # response_metadata key marking a message as stored ({"entry_id": ...})
CONTEXT_HEADER = "Relevant memories from earlier conversations (use them if they help):"


def is_context(message: Any) -> bool:
    """Whether ``message`` is a memory-context message made by the memory node."""
    return isinstance(message, BaseMessage) and str(message.id or "").startswith(CONTEXT_PREFIX)


def context_message(hits: Sequence[Hit], *, mode: str, k: int | None = None) -> SystemMessage:
    """The message that carries recalled memories: their text (text mode) or only their ids (KV mode).

    ``k`` is how many the node asked for (a session recalling again needs it to choose the same entries).
    """
    ids = [h.id for h in hits]
    if mode == "kv":
        # the model mounts the entries' KV; the text only tells a human reading the state what happened
        content = f"[agentmem: {len(ids)} memories mounted as KV]"
    else:
        content = "\n".join([CONTEXT_HEADER, *(f"- {h.memory_text}" for h in hits)])
    return SystemMessage(
        content=content,
        id=f"{CONTEXT_PREFIX}-{uuid.uuid4().hex}",
        additional_kwargs={META_KEY: {"mounted": ids, "mode": mode, **({"k": k} if k is not None else {})}},
    )


def requested_k(messages: Sequence[Any]) -> int | None:
    """The ``k`` the node recalled with, from its context message (None when absent)."""
    for m in messages:
        if is_context(m):
            k = (m.additional_kwargs.get(META_KEY) or {}).get("k")
            if isinstance(k, int) and k > 0:
                return k
    return None


def mounted_ids(messages: Sequence[Any]) -> list[str] | None:
    """Entry ids named by the context message(s) among ``messages``; None when there is none."""
    found: list[str] | None = None
    for m in messages:
        if is_context(m):
            info = m.additional_kwargs.get(META_KEY) or {}
            found = [*(found or []), *(i for i in info.get("mounted", []) if isinstance(i, str))]
    return found


def message_text(message: Any) -> str:
    """Plain text of a LangChain message (content blocks reduced to their text parts)."""
    content = getattr(message, "content", message)
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping) and block.get("type", "text") == "text":
                parts.append(str(block.get("text", "")))
        return "\n".join(p for p in parts if p)
    return str(content or "")


def state_messages(state: Any) -> list[BaseMessage]:
    """The message list of a ``MessagesState``-style state (dict, object with ``.messages``, or a list)."""
    if isinstance(state, Mapping):
        messages = state.get("messages")
    elif isinstance(state, Sequence):
        messages = state
    else:
        messages = getattr(state, "messages", None)
    if messages is None:
        raise InvalidInputError("the state has no 'messages'; the memory node works on MessagesState-style state")
    return list(messages)


def _lookup(source: Any, name: str) -> Any:
    if source is None:
        return None
    if isinstance(source, Mapping):
        return source.get(name)
    return getattr(source, name, None)


def resolve_scope(config: Mapping[str, Any] | None, runtime: Any = None, *,
                  default_user: str | None = None) -> tuple[str, str | None]:
    """``(user_id, thread_id)`` by LangGraph conventions.

    The user is ``configurable["user_id"]`` (or LangMem's ``langgraph_user_id``), else the runtime context's
    ``user_id`` (dict key or attribute), else ``default_user``. The session is ``configurable["thread_id"]``.
    """
    conf = (config or {}).get("configurable") or {}
    user = conf.get("user_id") or conf.get("langgraph_user_id")
    if not user:
        if runtime is None:
            try:  # inside a graph run the runtime is reachable without being passed
                from langgraph.runtime import get_runtime

                runtime = get_runtime()
            except Exception:  # outside a run (plain call, tests): there is simply no runtime context
                runtime = None
        user = _lookup(_lookup(runtime, "context"), "user_id")
    user = user or default_user
    if not user:
        raise InvalidInputError(
            "no user for memory: pass config={'configurable': {'user_id': ...}}, a runtime context with "
            "user_id, or user_id=... when creating the memory node / chat model"
        )
    thread = conf.get("thread_id")
    return str(user), (str(thread) if thread is not None else None)
