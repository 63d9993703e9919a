"""Request bodies of the REST API and the JSON form of records (pydantic; unknown fields are an error).

Example:
    >>> RememberBody(text="I moved to Lyon.", user_id="u1").kind
    'turn'
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentmem.types import json_ready

__all__ = ["DocumentBody", "ForgetBody", "MessageIn", "MessagesBody", "OffloadBody", "RecallBody", "RememberBody",
           "SendBody", "SessionOpenBody", "UpdateBody", "record_json"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RememberBody(_Body):
    text: str
    user_id: str
    session_id: str | None = None
    kind: str = "turn"
    role: str | None = None
    speaker: str | None = None
    timestamp: str | None = Field(default=None, description="When it happened (ISO 8601); default now.")
    tags: list[str] | None = None
    ttl: float | None = Field(default=None, description="Seconds until the entry expires.")
    metadata: dict[str, Any] | None = None


class DocumentBody(_Body):
    text: str
    user_id: str
    title: str | None = Field(default=None, description="Opens every part's text, so a part says what it is from.")
    max_words: int = Field(default=150, description="Words per part at most (about 200 tokens at 150).")
    kind: str = "knowledge"
    session_id: str | None = None
    timestamp: str | None = Field(default=None, description="When it was written (ISO 8601); default now.")
    tags: list[str] | None = None
    ttl: float | None = Field(default=None, description="Seconds until the parts expire.")
    metadata: dict[str, Any] | None = None


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI messages carry more fields (tool_call_id, ...)
    role: str
    content: Any = None  # an assistant message that only calls tools may leave it out
    name: str | None = None


class MessagesBody(_Body):
    messages: list[MessageIn]
    user_id: str
    session_id: str | None = None
    timestamp: str | None = None
    tags: list[str] | None = None
    ttl: float | None = None
    metadata: dict[str, Any] | None = None


class RecallBody(_Body):
    query: str
    user_id: str
    k: int = 5
    session_id: str | None = None
    kinds: list[str] | None = None
    tags: list[str] | None = None
    filters: dict[str, Any] | None = None


class UpdateBody(_Body):
    text: str
    tags: list[str] | None = None
    metadata: dict[str, Any] | None = None
    ttl: float | None = None
    reason: str | None = Field(default=None, description="Why it changed (kept in the history).")


class ForgetBody(_Body):
    user_id: str
    session_id: str | None = None
    tags: list[str] | None = None


class SessionOpenBody(_Body):
    user_id: str
    session_id: str | None = Field(default=None, description="Omit to get a new id.")


class SendBody(_Body):
    user_id: str
    text: str
    k: int = 4
    max_new_tokens: int = 64
    mode: Literal["kv", "history-text", "text"] = "kv"
    remember: bool = True


class OffloadBody(_Body):
    user_id: str
    to: Literal["warm", "disk"] = "disk"


def record_json(record: Any) -> dict[str, Any]:
    """A :class:`~agentmem.MemoryRecord` / :class:`~agentmem.Hit` as JSON-ready data (datetimes as ISO 8601)."""
    data = json_ready(record)
    if data.get("kv"):
        data["kv"].pop("path", None)  # where blobs live on the server's disk is not the client's business
    return data
