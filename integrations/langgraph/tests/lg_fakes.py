"""Test doubles shared by the integration tests (a module, not conftest: the core's tests have a conftest too)."""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage


class RecordingChatModel(GenericFakeChatModel):
    """A scripted chat model (text or tool calls) that records the messages of every call; tools bind to it."""

    calls: list[list[BaseMessage]] = []

    def __init__(self, replies: list[Any], **kwargs: Any) -> None:
        msgs = [r if isinstance(r, BaseMessage) else AIMessage(content=r) for r in replies]
        super().__init__(messages=iter(msgs), calls=[], **kwargs)

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[override]
        self.calls.append(list(messages))
        return super()._generate(messages, stop, run_manager, **kwargs)

    def bind_tools(self, tools, **kwargs):  # type: ignore[override]
        return self

    def system_text(self, call: int = -1) -> str:
        """All system-message text the model saw in one call."""
        return "\n".join(str(m.content) for m in self.calls[call] if m.type == "system")
