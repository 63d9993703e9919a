"""Tool calling for the local LLM: tool schemas rendered through the model's chat template, calls parsed back.

Rendering. Templates that take ``tools`` (Qwen2/2.5/3, Llama 3.1+, Hermes, Mistral ...) decide themselves how a
model was trained to see tool definitions. The engine's prompt layout is fixed (shared preamble, mounted memories,
then the question), so the template's tool section is cut out of a rendering of a marker system message with and
without ``tools`` (the text the template adds) and put in front of the question. Templates without tool support
(SmolLM2's) get the same Hermes-style instructions as text.

Parsing. Calls are read in the Hermes / Qwen format the instructions ask for,
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, or a bare JSON object with ``name`` (small models
often drop the tags). Unparseable JSON is left in the text (nothing is invented). Raw control characters inside
strings are accepted (``strict=False``): byte-level tokens can write them, constrained decoding included.

Example:
    >>> schema = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    >>> text, calls = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>')
    >>> text, calls[0]["name"], calls[0]["args"]
    ('', 'get_weather', {'city': 'Oslo'})
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from agentmem.errors import InvalidInputError

__all__ = ["choose_tools", "format_tool_call", "parse_tool_calls", "render_tools", "tool_call_schema"]

_MARK = "\x00agentmem-system\x00"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def _fallback(schemas: Sequence[Mapping[str, Any]]) -> str:
    lines = "\n".join(json.dumps(s, ensure_ascii=False, sort_keys=True) for s in schemas)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
        'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def render_tools(tokenizer: Any, schemas: Sequence[Mapping[str, Any]]) -> str:
    """The tool instructions for ``schemas`` (OpenAI function-tool dicts) as the model's chat template renders them.

    Example:
        >>> from agentmem.kv.testing import CHATML_TOOLS_TEMPLATE, tiny_tokenizer
        >>> tokenizer = tiny_tokenizer(CHATML_TOOLS_TEMPLATE)
        >>> schema = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
        >>> "get_weather" in render_tools(tokenizer, [schema])
        True
    """
    if not schemas:
        return ""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and "tools" in template:
        msgs = [{"role": "system", "content": _MARK}, {"role": "user", "content": _MARK}]
        try:
            with_tools = tokenizer.apply_chat_template(msgs, tools=list(schemas), tokenize=False)
            without = tokenizer.apply_chat_template(msgs, tokenize=False)
        except Exception:  # a template that mentions tools but fails on them: plain instructions instead
            with_tools = without = ""
        added = _inserted(str(with_tools), str(without))
        if added and all(s["function"]["name"] in added for s in schemas if "function" in s):
            return added.replace(_MARK, "").strip()
    return _fallback(schemas)


def _inserted(longer: str, shorter: str) -> str:
    """The text ``longer`` has between its common prefix and common suffix with ``shorter``."""
    start = 0
    while start < min(len(longer), len(shorter)) and longer[start] == shorter[start]:
        start += 1
    end = 0
    while end < min(len(longer), len(shorter)) - start and longer[-1 - end] == shorter[-1 - end]:
        end += 1
    return longer[start : len(longer) - end]


def _call(obj: Any) -> dict[str, Any] | None:
    if not isinstance(obj, Mapping) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args, strict=False)
        except ValueError:
            return None
    if not isinstance(args, Mapping):
        return None
    return {"name": obj["name"], "args": dict(args), "id": f"call_{uuid.uuid4().hex[:24]}", "type": "tool_call"}


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split a model answer into its remaining text and LangChain-style tool calls (``name``/``args``/``id``).

    Example:
        >>> parse_tool_calls('Let me check. <tool_call>{"name": "f", "arguments": {}}</tool_call>')[1][0]["name"]
        'f'
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for match in _CALL.finditer(text):
        try:
            call = _call(json.loads(match.group(1), strict=False))
        except ValueError:
            call = None
        if call is None:
            continue  # not a call we can run: leave its text where it is
        kept.append(text[pos : match.start()])
        pos = match.end()
        calls.append(call)
    kept.append(text[pos:])
    rest = "".join(kept).strip()
    if not calls and rest.startswith("{") and rest.endswith("}"):
        try:
            call = _call(json.loads(rest, strict=False))
        except ValueError:
            call = None
        if call is not None:
            return "", [call]
    return rest, calls


def format_tool_call(name: str, args: Mapping[str, Any]) -> str:
    """A call as the model is asked to write it (used to replay earlier calls in the prompt)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': dict(args)}, ensure_ascii=False)}</tool_call>"


def tool_call_schema(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The JSON schema of a call of one of ``tools`` (OpenAI function tools) as the model writes it,
    ``{"name": ..., "arguments": {...}}``: what decoding is held to when a call is required (``tool_choice``).

    Example:
        >>> tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        >>> tool_call_schema([tool])["properties"]["name"]
        {'enum': ['f']}
    """
    calls = []
    for tool in tools:
        fn = tool["function"]
        calls.append({"type": "object", "properties": {"name": {"enum": [fn["name"]]},
                                                       "arguments": fn.get("parameters") or {"type": "object"}},
                      "required": ["name", "arguments"], "additionalProperties": False})
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def choose_tools(tools: Sequence[Mapping[str, Any]] | None,
                 choice: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(tools offered, tools one of which must be called)`` for a ``tool_choice`` in the shapes OpenAI and
    LangChain send: ``None`` / ``"auto"`` / ``False`` (the model decides), ``"none"`` (no tools offered),
    ``"required"`` / ``"any"`` / ``True`` (a call of any tool), or one tool by name (``"get_weather"``,
    ``{"type": "function", "function": {"name": ...}}``, ``{"name": ...}``). Raises
    :class:`~agentmem.errors.InvalidInputError` naming the problem for a choice without tools or an unknown name.

    Example:
        >>> tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
        >>> [len(t) for t in choose_tools([tool], {"type": "function", "function": {"name": "get_weather"}})]
        [1, 1]
        >>> choose_tools([tool], "none"), [len(t) for t in choose_tools([tool], "auto")]
        (([], []), [1, 0])
    """
    offered = [dict(t) for t in tools or []]
    if choice is None or choice is False or choice == "auto":
        return offered, []
    if choice == "none":
        return [], []
    if not offered:
        raise InvalidInputError(f"tool_choice {choice!r} needs tools")
    if choice is True or choice in ("required", "any"):
        return offered, offered
    name = choice if isinstance(choice, str) else None
    if isinstance(choice, Mapping):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else choice.get("name")
    named = [t for t in offered if t["function"]["name"] == name]
    if not named:
        raise InvalidInputError(f"tool_choice must be 'auto', 'none', 'required', 'any' or one of the tools "
                                f"({', '.join(t['function']['name'] for t in offered)}), got {name or choice!r}")
    return offered, named
