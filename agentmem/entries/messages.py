"""Chat transcripts as memories: which messages become entries, and with what text.

An agent's transcript in the OpenAI shape (or LangChain messages) holds more than turns: an assistant message that
only calls tools has ``content: null`` (``""`` in LangChain) and its ``tool_calls``; the tool's answer follows as a
``tool`` message naming the call by ``tool_call_id``. A result means little without its question, so the call's
name and arguments are kept *with the result* ('called with {"city": "Paris"}, returned: 21 C', speaker the tool's
name), and the call-only message is not stored on its own. System (and ``developer``) messages are instructions,
not memories.

Example:
    >>> transcript = [
    ...     {"role": "user", "content": "Weather in Paris?"},
    ...     {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
    ...      "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    ...     {"role": "tool", "tool_call_id": "c1", "content": "21 C"}]
    >>> [(m.role, m.speaker, m.text) for m in transcript_memories(transcript)]
    [('user', None, 'Weather in Paris?'), ('tool', 'get_weather', 'called with {"city": "Paris"}, returned: 21 C')]
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentmem.entries.documents import document_parts
from agentmem.errors import InvalidInputError
from agentmem.validation import check_messages

__all__ = ["MessageMemory", "tool_call_of", "tool_result_text", "transcript_memories"]

_LANGCHAIN_ROLES = {"human": "user", "ai": "assistant"}


@dataclass(frozen=True)
class MessageMemory:
    """What one chat message is remembered as (``kind`` is ``"tool"`` for a tool result, else ``"turn"``):
    ``body`` is the message's own text, ``args`` a tool result's call arguments."""

    role: str
    body: str
    speaker: str | None
    args: Any = None

    @property
    def kind(self) -> str:
        return "tool" if self.role == "tool" else "turn"

    @property
    def text(self) -> str:
        """The memory's text: the body, or for a tool result the body after its call's arguments."""
        return self._text(self.body)

    def parts(self, max_words: int | None) -> list[tuple[str, dict[str, Any] | None]]:
        """The memory's text, or for a body longer than ``max_words`` words its parts
        (:func:`~agentmem.entries.documents.document_parts`; a tool result's each keep the call's arguments), each
        with its ``metadata["document"]`` (None when whole).

        Example:
            >>> result = MessageMemory("tool", "one. two. three.", "search", {"q": "x"})
            >>> [(text, info["part"]) for text, info in result.parts(2)]
            [('called with {"q": "x"}, returned: one. two.', 1), ('called with {"q": "x"}, returned: three.', 2)]
        """
        if max_words is None or len(self.body.split()) <= max_words:
            return [(self.text, None)]
        title = self.speaker if self.role == "tool" else None
        return [(self._text(part), info) for part, info in document_parts(self.body, max_words, title=title)]

    def _text(self, body: str) -> str:
        return tool_result_text(body, self.args) if self.role == "tool" else body


@dataclass(frozen=True)
class _Call:
    name: str | None
    args: Any


def tool_result_text(result: str, args: Any = None) -> str:
    """A tool result's memory text, with the arguments it was called with in front of it.

    Example:
        >>> tool_result_text("21 C", {"city": "Paris"})
        'called with {"city": "Paris"}, returned: 21 C'
        >>> tool_result_text("done")
        'returned: done'
    """
    if args:
        return f"called with {json.dumps(args, ensure_ascii=False, sort_keys=True)}, returned: {result}"
    return f"returned: {result}"


def tool_call_of(text: str) -> str | None:
    """The call a tool result's text (:func:`tool_result_text`) says it answered: its arguments as stored (sorted
    JSON); None for a text not in that shape (a tool memory written freely) and for ``returned: ...`` alone, whose
    call is not known (no arguments, or a result stored apart from its call: two such results may answer different
    calls).

    Example:
        >>> tool_call_of('called with {"city": "Oslo"}, returned: rain')
        '{"city": "Oslo"}'
        >>> tool_call_of("returned: 12:04"), tool_call_of("It rained in Oslo.")
        (None, None)
    """
    if not text.startswith(_CALLED):
        return None
    try:
        args, end = _JSON.raw_decode(text, len(_CALLED))
    except ValueError:
        return None
    if not text.startswith(", returned: ", end):
        return None
    return json.dumps(args, ensure_ascii=False, sort_keys=True)


_CALLED = "called with "
_JSON = json.JSONDecoder()


def transcript_memories(messages: Any) -> list[MessageMemory]:
    """The memories a transcript holds, in order (see the module docstring for what is kept and how).

    Raises :class:`~agentmem.errors.InvalidInputError` naming the message for an unknown role or a message with no
    text that is not a call-only assistant message: nothing of the transcript is stored then.

    Example:
        >>> [m.text for m in transcript_memories([{"role": "system", "content": "Be brief."},
        ...                                       {"role": "user", "content": [{"type": "text", "text": "hi"}]}])]
        ['hi']
    """
    messages = check_messages(messages)
    calls = {call_id: call for m in messages for call_id, call in _tool_calls(m)}
    out = []
    for n, message in enumerate(messages):
        role, text, name = _fields(message, n)
        if role == "system":
            continue
        if not text.strip():
            if role == "assistant" and _tool_calls(message):
                continue  # its calls are kept with their results
            raise InvalidInputError(f"messages[{n}] ({role}) has no text content")
        if role == "tool":
            call = calls.get(_get(message, "tool_call_id")) or _Call(None, None)
            out.append(MessageMemory("tool", text, name or call.name, call.args))
        else:
            out.append(MessageMemory(role, text, name))
    return out


def _get(message: Any, key: str) -> Any:
    return message.get(key) if isinstance(message, Mapping) else getattr(message, key, None)


def _fields(message: Any, n: int) -> tuple[str, str, str | None]:
    if isinstance(message, Mapping):
        role = message.get("role")
    else:  # a LangChain message (duck-typed: no import of langchain here)
        kind = getattr(message, "type", None)
        role = _LANGCHAIN_ROLES.get(kind, kind)
    if role == "developer":  # OpenAI's newer name for system instructions
        role = "system"
    if role not in ("user", "assistant", "system", "tool"):
        raise InvalidInputError(f"messages[{n}].role must be user, assistant, system, developer or tool, "
                                f"got {role!r}")
    content = _get(message, "content")
    if isinstance(content, Sequence) and not isinstance(content, str):
        # content parts (OpenAI / LangChain): keep the text parts, leave images and the like out
        texts = (p.get("text") if isinstance(p, Mapping) else p for p in content)
        content = "\n".join(t for t in texts if isinstance(t, str) and t.strip())
    if content is not None and not isinstance(content, str):
        raise InvalidInputError(f"messages[{n}].content must be a string or a list of parts, "
                                f"got {type(content).__name__}")
    return role, content or "", _get(message, "name")


def _tool_calls(message: Any) -> list[tuple[str, _Call]]:
    """(call id, call) of an assistant message's tool calls, OpenAI (``function.arguments`` a JSON string) or
    LangChain (``args`` a dict) shaped."""
    found = []
    for call in _get(message, "tool_calls") or []:
        if not isinstance(call, Mapping) or not call.get("id"):
            continue
        function = call.get("function")
        if isinstance(function, Mapping):
            found.append((call["id"], _Call(function.get("name"), _json_args(function.get("arguments")))))
        else:
            found.append((call["id"], _Call(call.get("name"), call.get("args"))))
    return found


def _json_args(arguments: Any) -> Any:
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # kept as the model wrote it: the memory still says what was asked
