"""A model's answer text in the shapes chat APIs want: tool calls out of it, stop strings cut from it.

Every chat adapter over agentmem needs these (the server's OpenAI-compatible endpoint, the LangChain chat model in
``agentmem_langgraph``, or your own): a model that calls tools writes ``<tool_call>{...}</tool_call>`` blocks in its
text (``tool_call_schema`` is the JSON schema decoding is held to when a call is required, ``choose_tools`` reads
a request's ``tool_choice``), and a caller's ``stop`` strings end an answer wherever they first appear, even split
across streamed pieces. The engine uses the same functions (``agentmem.kv.tools``, ``agentmem.kv.streaming``); this
module is their public name, so adapters depend on the public API only. ``tool_result_text`` is the memory text of a
tool's result with its call's arguments, as ``remember_messages`` writes it; ``split_document`` cuts a long text (a
fetched page) into the parts ``remember_document`` stores, and ``document_parts`` numbers them as it does
(``metadata["document"]``).

Example:
    >>> from agentmem.chat_text import cut_at_stop, format_tool_call, parse_tool_calls
    >>> text, calls = parse_tool_calls('Let me look. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>')
    >>> text, calls[0]["name"], calls[0]["args"]
    ('Let me look.', 'get_weather', {'city': 'Oslo'})
    >>> cut_at_stop("The answer is 4.\\nObservation: done", ["Observation:"])
    'The answer is 4.\\n'
"""

from __future__ import annotations

from agentmem.kv.streaming import StopCut, cut_at_stop
from agentmem.entries.documents import document_parts, split_document
from agentmem.entries.messages import tool_result_text
from agentmem.kv.tools import choose_tools, format_tool_call, parse_tool_calls, tool_call_schema

__all__ = ["StopCut", "choose_tools", "cut_at_stop", "document_parts", "format_tool_call", "parse_tool_calls",
           "split_document", "tool_call_schema", "tool_result_text"]
