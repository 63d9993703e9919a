"""An OpenAI chat request read whole: its fields checked, its messages turned into the local model's prompt.

Every field of the request is honoured or refused; none is silently dropped:

* ``messages``: ``system`` / ``developer`` messages are the instructions, earlier ``user`` / ``assistant`` turns
  (an assistant's ``tool_calls`` included) and ``tool`` results are the conversation, the last message (``user``
  or ``tool``) is what is answered. The local model's prompt keeps its memories right after a fixed preamble
  (their KV was computed after it, docs/architecture.md), so instructions, tools and earlier turns are written
  after the memories, in the user slot, in that order.
* ``tools`` / ``tool_choice``: tools are rendered through the model's chat template (:mod:`agentmem.kv.tools`)
  and ``<tool_call>`` answers come back as ``tool_calls``. ``"required"`` or a named function constrains decoding
  to a call (JSON schema of ``{"name", "arguments"}``); ``"none"`` leaves the tools out of the prompt.
* ``response_format``: ``json_object`` / ``json_schema`` constrain decoding to that schema
  (:mod:`agentmem.kv.json_constraint`).
* ``stop`` (up to 4 strings), ``seed``, ``n`` (only 1), ``temperature``, ``top_p``, ``max_tokens`` /
  ``max_completion_tokens``, ``stream`` / ``stream_options``, ``user``.
* Fields that change nothing at their neutral value (``logprobs: false``, ``frequency_penalty: 0`` ...) are
  accepted at that value; anything else is a 400 naming the field.

Example:
    >>> req = ChatRequest(model="m", messages=[{"role": "system", "content": "Be brief."},
    ...                                        {"role": "user", "content": "Hi"}])
    >>> convo = read_conversation(req)
    >>> convo.instructions, convo.query
    (['Be brief.'], 'Hi')
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentmem.errors import InvalidInputError
from agentmem.chat_text import choose_tools, format_tool_call, tool_call_schema
from agentmem.validation import check_logit_bias, check_stop

__all__ = ["AgentMemOptions", "ChatRequest", "Conversation", "content_text", "last_user_text", "read_conversation"]

# OpenAI fields accepted only at the value that changes nothing (clients such as LangChain send some of them)
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False), "top_logprobs": (None, 0), "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0), "store": (None, False), "metadata": (None, {}),
    "service_tier": (None, "auto", "default"), "modalities": (None, ["text"]), "prediction": (None,),
    "parallel_tool_calls": (None, True, False),  # calls are returned as the model writes them, one or several
}
_ROLES = ("system", "developer", "user", "assistant", "tool")


class AgentMemOptions(BaseModel):
    """The request's ``agentmem`` extension field (``extra_body={"agentmem": {...}}``)."""

    model_config = ConfigDict(extra="forbid")
    k: int | None = Field(default=None, gt=0)
    mode: Literal["kv", "text"] | None = None
    remember: bool = True


class ChatRequest(BaseModel):
    """An OpenAI chat completion request; fields agentmem does not support are refused by :func:`read_conversation`."""

    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    user: str | None = None
    n: int = Field(default=1, ge=1, le=1)
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None
    agentmem: AgentMemOptions = Field(default_factory=AgentMemOptions)


@dataclass
class Conversation:
    """What a chat request asks, ready for the local model (or, in proxy mode, for the upstream one)."""

    instructions: list[str]  # system / developer messages, in order
    earlier: list[str]  # earlier turns as "User: ..." / "Assistant: ..." / "Tool x returned: ..." lines
    last: str  # the message answered (a tool result is written as such)
    query: str  # what memories are recalled for: the last user message's text
    ends_with_user: bool  # the last message is the user's (then it is remembered as their turn)
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI function tools offered to the model
    forced_tools: list[dict[str, Any]] = field(default_factory=list)  # a call to one of these is required
    schema: dict[str, Any] | None = None  # the JSON schema the answer must follow (response_format)
    stop: list[str] = field(default_factory=list)
    logit_bias: dict[int, float] = field(default_factory=dict)  # {token id: bias}, added to the logits

    def prompt(self, tools_prompt: str = "") -> str:
        """The text put in the user slot after the mounted memories: instructions, tools, earlier turns, last.

        Example:
            >>> Conversation(["Be brief."], ["User: hi", "Assistant: hello"], "how are you?", "how are you?",
            ...              True).prompt()
            'Be brief.\\n\\nEarlier in this conversation:\\nUser: hi\\nAssistant: hello\\n\\nhow are you?'
        """
        parts = [*self.instructions, tools_prompt]
        if self.earlier:
            parts.append("Earlier in this conversation:\n" + "\n".join(self.earlier))
        return "\n\n".join(p for p in [*parts, self.last] if p)

    def constraint(self) -> dict[str, Any] | None:
        """The JSON schema decoding is held to: a forced tool call's, else the response format's, else None."""
        if self.forced_tools:
            return tool_call_schema(self.forced_tools)
        return self.schema


def content_text(content: Any, where: str) -> str:
    """A message's text: a string, or the ``text`` parts of a content-part list (other parts are refused).

    Example:
        >>> content_text([{"type": "text", "text": "hi"}], "messages[0].content")
        'hi'
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise InvalidInputError(f"{where}[{i}] is not a text part ({kind!r}); only text content is supported")
            texts.append(part["text"])
        return "\n".join(texts)
    raise InvalidInputError(f"{where} must be a string or a list of text parts")


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of the last non-empty user message: what memories are recalled for.

    Example:
        >>> last_user_text([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])
        'Hi'
    """
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            text = content_text(messages[i].get("content"), f"messages[{i}].content").strip()
            if text:
                return text
    raise InvalidInputError("messages must hold a non-empty user message")


def exchange_turns(messages: Sequence[Mapping[str, Any]], question: str, answer: str) -> list[dict[str, Any]]:
    """What a chat exchange adds to the conversation, as messages to remember: the question and the answer; for a
    request that brings tool results back (it ends with ``tool`` messages), the results with the assistant
    message whose calls they answer (its text left out: that request remembered it) and the answer.

    Example:
        >>> call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        >>> asked = [{"role": "user", "content": "q"}]
        >>> [m["role"] for m in exchange_turns(asked, "q", "Looking.")]
        ['user', 'assistant']
        >>> back = [*asked, {"role": "assistant", "content": "Looking.", "tool_calls": [call]},
        ...         {"role": "tool", "tool_call_id": "c1", "content": "42"}]
        >>> [(m["role"], m["content"]) for m in exchange_turns(back, "q", "It is 42.")]
        [('assistant', None), ('tool', '42'), ('assistant', 'It is 42.')]
    """
    start = len(messages)
    while start > 0 and messages[start - 1].get("role") == "tool":
        start -= 1
    if start == len(messages):
        turns: list[dict[str, Any]] = [{"role": "user", "content": question}]
    else:
        calls = messages[start - 1].get("tool_calls") if start > 0 else None
        turns = [{"role": "assistant", "content": None, "tool_calls": calls}] if calls else []
        turns += [dict(m) for m in messages[start:]]
    return turns + ([{"role": "assistant", "content": answer}] if answer.strip() else [])


def _refuse_unsupported(body: ChatRequest) -> None:
    for name, value in (body.model_extra or {}).items():
        if name not in _NEUTRAL:
            raise InvalidInputError(f"{name} is not supported by agentmem's chat completions endpoint")
        if value not in _NEUTRAL[name]:
            raise InvalidInputError(f"{name} is only supported at {_NEUTRAL[name][1]!r} (got {value!r})")


def _line(m: Mapping[str, Any], i: int, names: Mapping[str, str]) -> str:
    """One earlier message as a line of the conversation (an assistant's calls written as the model writes them)."""
    role, text = m["role"], content_text(m.get("content"), f"messages[{i}].content").strip()
    if role == "assistant":
        calls = [format_tool_call(c["function"]["name"], _arguments(c, i)) for c in m.get("tool_calls") or []]
        return "Assistant: " + " ".join([text, *calls]).strip()
    if role == "tool":
        return _tool_result(m, text, names)
    return f"User: {text}"


def _tool_result(m: Mapping[str, Any], text: str, names: Mapping[str, str]) -> str:
    name = m.get("name") or names.get(str(m.get("tool_call_id")), "")
    return f"Tool {name} returned: {text}" if name else f"Tool result: {text}"


def _arguments(call: Mapping[str, Any], i: int) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise InvalidInputError(f"messages[{i}].tool_calls needs function.name on every call")
    args = fn.get("arguments") or "{}"
    try:
        parsed = json.loads(args) if isinstance(args, str) else args
    except ValueError as exc:
        raise InvalidInputError(f"messages[{i}].tool_calls arguments must be a JSON object string") from exc
    if not isinstance(parsed, Mapping):
        raise InvalidInputError(f"messages[{i}].tool_calls arguments must be a JSON object string")
    return dict(parsed)


def _check_messages(messages: Sequence[dict[str, Any]]) -> None:
    for i, m in enumerate(messages):
        if m.get("role") not in _ROLES:
            raise InvalidInputError(f"messages[{i}].role must be one of {', '.join(_ROLES)} (got {m.get('role')!r})")
    if messages[-1]["role"] not in ("user", "tool"):
        raise InvalidInputError("messages must end with a user message or a tool result")


def read_conversation(body: ChatRequest) -> Conversation:
    """The conversation a request asks to continue, every field checked (400s name the field).

    Example:
        >>> read_conversation(ChatRequest(model="m", messages=[{"role": "user", "content": "Hi"}])).last
        'Hi'
    """
    _refuse_unsupported(body)
    msgs = body.messages
    _check_messages(msgs)
    names = {str(c.get("id")): c["function"]["name"] for m in msgs if m["role"] == "assistant"
             for c in m.get("tool_calls") or [] if isinstance(c, Mapping) and isinstance(c.get("function"), Mapping)}
    instructions = [content_text(m.get("content"), f"messages[{i}].content").strip() for i, m in enumerate(msgs)
                    if m["role"] in ("system", "developer")]
    turns = [(i, m) for i, m in enumerate(msgs) if m["role"] not in ("system", "developer")]
    *before, (last_i, last_m) = turns
    last_text = content_text(last_m.get("content"), f"messages[{last_i}].content").strip()
    if not last_text:
        raise InvalidInputError(f"messages[{last_i}].content must not be empty")
    query = last_user_text(msgs)
    tools, forced = _read_tools(body)
    return Conversation(
        instructions=[t for t in instructions if t], earlier=[_line(m, i, names) for i, m in before],
        last=_tool_result(last_m, last_text, names) if last_m["role"] == "tool" else last_text, query=query,
        ends_with_user=last_m["role"] == "user", tools=tools, forced_tools=forced,
        schema=_read_response_format(body.response_format, bool(tools)), stop=_read_stop(body.stop),
        logit_bias=check_logit_bias(body.logit_bias),
    )


def _read_tools(body: ChatRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(tools offered, tools one of which must be called)`` from ``tools`` and ``tool_choice``."""
    tools = body.tools or []
    for i, t in enumerate(tools):
        fn = t.get("function")
        if t.get("type") != "function" or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise InvalidInputError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}")
    return choose_tools(tools, body.tool_choice)


def _read_response_format(fmt: Mapping[str, Any] | None, with_tools: bool) -> dict[str, Any] | None:
    kind = (fmt or {}).get("type", "text")
    if kind == "text":
        return None
    if with_tools:
        raise InvalidInputError("response_format json is not supported together with tools; send one of them")
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        schema = ((fmt or {}).get("json_schema") or {}).get("schema")
        if not isinstance(schema, Mapping):
            raise InvalidInputError("response_format json_schema needs json_schema.schema (a JSON schema object)")
        return dict(schema)
    raise InvalidInputError(f"response_format type must be text, json_object or json_schema, got {kind!r}")


def _read_stop(stop: str | list[str] | None) -> list[str]:
    return check_stop([stop] if isinstance(stop, str) else stop)  # OpenAI also takes one string
