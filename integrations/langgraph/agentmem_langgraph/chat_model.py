"""``ChatAgentMem``: a LangChain chat model over agentmem's local LLM that mounts memories as KV.

Memories are not pasted into the prompt as text: their precomputed KV is mounted in front of it
(``mem.generate``), so the model skips re-encoding them. Inside a thread (``configurable["thread_id"]``) it
talks through ``mem.session(thread_id)``, whose working KV of the conversation is reused from turn to turn.

Which memories: the ids named by the memory node's context message (or ``config["metadata"]["agentmem_mounted"]``)
when there are any, else its own recall of ``k`` memories. The answer's ``response_metadata["agentmem"]``
says what was mounted, what was dropped and where the time went.

Example:
    >>> from agentmem import AgentMemory
    >>> from agentmem_langgraph import ChatAgentMem
    >>> mem = AgentMemory("./memdata")                                            # doctest: +SKIP
    >>> llm = ChatAgentMem(memory=mem, user_id="u1", k=4, max_new_tokens=48)      # doctest: +SKIP
    >>> msg = llm.invoke("Where do I live?")                                       # doctest: +SKIP
    >>> msg.content, msg.response_metadata["agentmem"]["mounted"]                 # doctest: +SKIP
"""

from __future__ import annotations

import contextvars
import inspect
import json
import logging
import queue
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple

from agentmem import InvalidInputError
from agentmem.chat_text import StopCut, choose_tools, cut_at_stop, format_tool_call, parse_tool_calls, tool_call_schema
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, SystemMessage, ToolMessage
from langchain_core.messages.tool import invalid_tool_call
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables.config import ensure_config
from pydantic import ConfigDict, Field

from agentmem_langgraph._context import (
    MARK_KEY,
    META_KEY,
    is_context,
    message_text,
    mounted_ids,
    requested_k,
    resolve_scope,
)

__all__ = ["MARK_KEY", "ChatAgentMem"]

log = logging.getLogger("agentmem_langgraph")

_ID_PARAMS = ("entry_ids", "ids", "memory_ids")  # what the core may call "mount exactly these entries"
_NO_ENTRY_TAG = "agentmem-langgraph:none"
_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')  # the tool name at the start of a call written as JSON


class _Answer(NamedTuple):
    """One call of the memory: its text, agentmem's info (``response_metadata["agentmem"]``), LangChain's usage
    metadata, the stored-turn mark, why it ended ("length" / "stop") and whether decoding was held to a tool call."""

    text: str
    info: dict[str, Any]
    usage: dict[str, int] | None
    mark: Any
    finish_reason: str
    call_required: bool


class ChatAgentMem(BaseChatModel):
    """Chat model that answers with agentmem's local LLM, memories mounted as KV.

    Args:
        memory: the :class:`agentmem.AgentMemory` (its ``model=`` is the LLM used).
        user_id: default user (else ``configurable``/``metadata`` ``user_id`` or the runtime context's).
        k: memories to recall when the memory node has not chosen them.
        mode: ``"kv"`` (mount stored KV), ``"kv+fix"`` (plus a few recomputed tokens) or ``"text"`` (baseline).
        max_new_tokens: answer length limit.
        use_session: inside a thread, reuse the conversation's working KV through ``mem.session`` (which also
            remembers both turns itself; the answer is marked so the memory node does not store them again).
        history_messages: without a session, how many earlier messages are replayed into the prompt.
        measure_baseline: also time the same turn with memories (and history) re-encoded as text, in a dry run
            that changes nothing, and report it as ``baseline_ttft`` next to ``timings["ttft"]``. It costs one
            extra prefill per call: for demos and benchmarks.

        logits_processor: constrain decoding (transformers' ``(ids, scores) -> scores`` convention), e.g. a grammar
            that keeps a small model's tool calls well-formed.
        temperature: sampling temperature; 0 decodes greedily (the same answer every time); None (default) keeps
            the local model's own settings (its ``generation_config``: SmolLM2's samples).
        model_name: the name answers and traces report (``response_metadata["model_name"]``, LangSmith's
            ``ls_model_name``); the model itself is the memory's.

    Tools: ``bind_tools`` renders the tools through the local model's chat template (``mem.tool_prompt``) and
    answers parse ``<tool_call>{...}</tool_call>`` into ``AIMessage.tool_calls``. A tool-using turn answers
    through ``mem.generate`` with the conversation replayed as text (the tool instructions must not be stored as a
    session turn). ``stream()`` yields text as it is decoded; with tools bound the answer comes as one chunk,
    because a call can only be parsed once it is complete.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: Any = Field(exclude=True)
    user_id: str | None = None
    k: int = 4
    mode: Literal["kv", "kv+fix", "text"] = "kv"
    max_new_tokens: int = 64
    kinds: list[str] | None = None
    tags: list[str] | None = None
    use_session: bool = True
    history_messages: int = 6
    measure_baseline: bool = False
    logits_processor: Any = Field(default=None, exclude=True)
    model_name: str = "agentmem"
    temperature: float | None = Field(default=None, ge=0)

    @property
    def _llm_type(self) -> str:
        return "agentmem"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"k": self.k, "mode": self.mode, "max_new_tokens": self.max_new_tokens,
                "memory": str(getattr(self.memory, "path", ""))}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        """What LangSmith traces record of a call (LangChain's standard parameters).

        Example:
            >>> ChatAgentMem(memory=mem, max_new_tokens=48)._get_ls_params()["ls_max_tokens"]   # doctest: +SKIP
            48
        """
        name = kwargs.get("model") or self.model_name  # a per-call name (bind(model=...)) is what the trace shows
        params = LangSmithParams(ls_provider="agentmem", ls_model_name=name, ls_model_type="chat",
                                 ls_max_tokens=int(kwargs.get("max_new_tokens", self.max_new_tokens)))
        if self.temperature is not None:
            params["ls_temperature"] = self.temperature
        if stop:
            params["ls_stop"] = stop
        return params

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any) -> Any:
        """Bind tools (LangChain tools, functions, pydantic models or OpenAI tool dicts) to the model.

        Example:
            >>> agent = create_react_agent(ChatAgentMem(memory=mem), [get_weather])       # doctest: +SKIP
        """
        from langchain_core.utils.function_calling import convert_to_openai_tool

        schemas = [convert_to_openai_tool(t) for t in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=schemas, **kwargs)

    # --- LangChain entry points ------------------------------------------------------------------
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        answer = self._answer(messages, run_manager, kwargs)
        message = self._message(answer, cut_at_stop(answer.text, stop), tools=bool(kwargs.get("tools")))
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _metadata(self, answer: _Answer) -> dict[str, Any]:
        """The message's ``response_metadata``: why the answer ended, agentmem's info, the model name and the
        stored-turn mark."""
        meta: dict[str, Any] = {"finish_reason": answer.finish_reason, META_KEY: answer.info,
                                "model_name": self.model_name}
        if answer.mark is not None:
            meta[MARK_KEY] = answer.mark
        return meta

    def _message(self, answer: _Answer, text: str, *, tools: bool) -> AIMessage:
        """The answer (its ``text`` cut at the stop strings) as an AIMessage, with its tool calls when ``tools``."""
        meta = self._metadata(answer)
        calls: list[dict[str, Any]] = []
        invalid: list[Any] = []
        if tools:
            text, calls = parse_tool_calls(text)
            if not calls and answer.call_required:
                # decoding was held to a call, so the text is one that did not finish (max_new_tokens): LangChain's
                # place for it is invalid_tool_calls, where an agent sees the error, not an answer in the content
                invalid = [invalid_tool_call(name=_called_name(text), args=text, id=None,
                                             error=f"the required tool call was cut short ({answer.finish_reason}: "
                                                   "raise max_new_tokens)")]
                text = ""
        return AIMessage(content=text, tool_calls=calls, invalid_tool_calls=invalid, response_metadata=meta,
                         usage_metadata=answer.usage)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        # The answer is decoded on a worker thread whose per-token text goes through a queue: each piece is
        # yielded here as soon as the decoder produced it, not after the whole answer.
        if kwargs.get("tools"):
            answer = self._answer(messages, run_manager, kwargs)
            whole = self._message(answer, cut_at_stop(answer.text, stop), tools=True)
            yield ChatGenerationChunk(message=AIMessageChunk(
                content=whole.content, response_metadata=whole.response_metadata, usage_metadata=answer.usage,
                tool_call_chunks=[{"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i,
                                   "type": "tool_call_chunk"} for i, c in enumerate(whole.tool_calls)],
                # a call cut short as is: as a chunk, LangChain would parse its JSON as a partial call
                invalid_tool_calls=whole.invalid_tool_calls,
                chunk_position="last",
            ))
            return
        pieces: queue.Queue = queue.Queue()
        done = object()
        result: dict[str, Any] = {}

        def work() -> None:
            try:
                result["out"] = self._answer(messages, run_manager, {**kwargs, "on_text": pieces.put})
            except BaseException as exc:  # handed to the consumer, raised there
                result["error"] = exc
            finally:
                pieces.put(done)

        context = contextvars.copy_context()  # the graph's config and callbacks live in context variables
        worker = threading.Thread(target=context.run, args=(work,), name="agentmem-stream", daemon=True)
        worker.start()
        cut = StopCut(stop)
        while (piece := pieces.get()) is not done:
            text = cut.feed(piece)
            if text:
                yield self._chunk(text, run_manager)
        worker.join()
        if "error" in result:
            raise result["error"]
        answer = result["out"]
        last = ChatGenerationChunk(message=AIMessageChunk(
            content=cut.rest(), response_metadata=self._metadata(answer), usage_metadata=answer.usage,
            chunk_position="last"))
        if run_manager is not None:
            run_manager.on_llm_new_token(str(last.message.content), chunk=last)
        yield last

    @staticmethod
    def _chunk(text: str, run_manager: Any) -> ChatGenerationChunk:
        chunk = ChatGenerationChunk(message=AIMessageChunk(content=text))
        if run_manager is not None:
            run_manager.on_llm_new_token(text, chunk=chunk)
        return chunk

    # _agenerate / _astream: BaseChatModel's defaults run the sync versions in an executor, which is what a
    # CPU-bound local model wants anyway.

    # --- the call ----------------------------------------------------------------------------------
    def _answer(self, messages: Sequence[BaseMessage], run_manager: Any,
                kwargs: Mapping[str, Any]) -> _Answer:
        if self.memory is None:
            raise InvalidInputError("ChatAgentMem needs memory=AgentMemory(...)")
        user, thread = self._scope(run_manager, kwargs)
        meta = dict(getattr(run_manager, "metadata", None) or {})
        ids = kwargs.get("mounted_ids")
        if ids is None:
            ids = meta.get("agentmem_mounted")
        if ids is None:
            ids = mounted_ids(messages)
        convo = [m for m in messages if not is_context(m)]
        if not convo:
            raise InvalidInputError("ChatAgentMem got no message to answer")
        present = [m.id for m in messages if m.id and not is_context(m)]
        k = max(1, len(ids)) if ids is not None else self.k
        # no ids given: recall with the node's scope, keeping messages already in the conversation out
        filters = {"message_id": {"$nin": present}} if present else None
        max_new = int(kwargs.get("max_new_tokens", self.max_new_tokens))
        tools, forced = choose_tools(kwargs.get("tools"), kwargs.get("tool_choice"))
        extra = dict(on_text=kwargs.get("on_text"), logits_processor=self.logits_processor)
        if self.temperature is not None:  # 0 is greedy, as OpenAI's API reads it
            extra.update(do_sample=self.temperature > 0, temperature=self.temperature or None)
        if forced:  # a call is required: decoding is held to a call of one of these tools
            extra["json_schema"] = tool_call_schema(forced)

        if ids is not None and not ids:
            k = 0  # the node looked and found nothing relevant: mount nothing
        # kv+fix is a generate-only mode; sessions do kv and text
        # tool turns replay the conversation as text: the tool instructions must not become a stored session turn
        session = (self._session(user, thread) if self.use_session and thread and self.mode != "kv+fix" and not tools
                   else None)
        baseline = None
        if session is not None:
            # The session keeps this conversation's KV (only the new message is prefilled), recalls memories
            # outside it, and stores both turns; the answer is marked stored so the memory node skips them.
            question = self._question(convo, with_history=False)
            if k:
                # the session recalls k and leaves out its own turns, as the node did when choosing the ids:
                # recall as many as the node did, not as many as it kept
                k = requested_k(messages) or k
            send = dict(ids=ids, filters=None, k=k, zero_k=True)
            if self.measure_baseline:  # before the real turn, so both see the same session state
                baseline = self._call(session.send, question, max_new_tokens=0, mode="text", commit=False, **send)
            out = self._call(session.send, question, max_new_tokens=max_new, mode=self.mode, **send, **extra)
            records = list(getattr(out, "records", []) or [])
            mark = {"entry_id": records[-1] if records else None, "by": "session"}
        else:
            question = self._question(convo, with_history=True,
                                      tools_prompt=self.memory.tool_prompt(tools) if tools else None)
            common = dict(user_id=user, session_id=thread, k=k, kinds=self.kinds, tags=self.tags, ids=ids,
                          filters=filters)
            if self.measure_baseline:
                baseline = self._call(self.memory.generate, question, mode="text", max_new_tokens=0, **common)
            out = self._call(self.memory.generate, question, mode=self.mode, max_new_tokens=max_new, **common, **extra)
            mark = None
        info, usage, finish = _report(out, ids, baseline, user, thread, self.mode, max_new)
        return _Answer(str(out.text), info, usage, mark, finish, bool(forced))

    def _call(self, fn: Any, question: str, *, ids: list[str] | None, filters: Any, k: int, zero_k: bool = False,
              **kw: Any) -> Any:
        """Call ``generate``/``send`` with what it accepts (the core's signature evolves; extra args are dropped).

        Given ids are passed as such (``entry_ids=``, taken by ``generate`` and ``Session.send``); a callee without
        that parameter recalls ``k`` with the node's filters instead. ``zero_k``: the callee accepts ``k=0``.
        """
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
        accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        id_param = next((p for p in _ID_PARAMS if p in params), None)
        args: dict[str, Any] = {}
        if ids is not None and id_param:
            args[id_param] = list(ids)
        elif k == 0 and zero_k:
            args["k"] = 0
        elif k == 0:
            # The node found nothing worth mounting, but the core has no k=0: scope the recall to a tag no entry
            # has, which costs one SQL lookup and mounts nothing.
            args["k"] = 1
            if "tags" in params or accepts_any:
                kw = {**kw, "tags": [_NO_ENTRY_TAG]}
        else:
            args["k"] = k
            if filters is not None and ("filters" in params or accepts_any):
                args["filters"] = filters
        for name, value in kw.items():
            if value is not None and (name in params or accepts_any):
                args[name] = value
        return fn(question, **args)

    def _scope(self, run_manager: Any, kwargs: Mapping[str, Any]) -> tuple[str, str | None]:
        meta = dict(getattr(run_manager, "metadata", None) or {})
        config = ensure_config()  # inside a graph node: that node's config (configurable user_id/thread_id)
        conf = dict(config.get("configurable") or {})
        for key in ("user_id", "thread_id"):
            if kwargs.get(key):
                conf[key] = kwargs[key]
            elif not conf.get(key) and meta.get(key):
                conf[key] = meta[key]
        return resolve_scope({"configurable": conf}, default_user=self.user_id)

    def _session(self, user: str, thread: str) -> Any:
        # the memory's session manager keeps one Session per id (and restores it from disk after a restart)
        opener = getattr(self.memory, "session", None)
        if opener is None:
            return None
        try:
            return opener(thread, user_id=user)
        except ImportError:  # the core was installed without session support: plain generate then
            log.info("agentmem sessions unavailable; answering without session KV reuse")
            return None

    def _question(self, convo: Sequence[BaseMessage], *, with_history: bool, tools_prompt: str | None = None) -> str:
        """The prompt text: the latest message, plus earlier turns when no session keeps them (and tool
        instructions first when tools are bound)."""
        instructions = [tools_prompt or ""] + [message_text(m).strip() for m in convo if isinstance(m, SystemMessage)]
        turns = [m for m in convo if not isinstance(m, SystemMessage) and _line_text(m).strip()]
        if not turns:
            raise InvalidInputError("ChatAgentMem got no message with text to answer")
        last = turns[-1]
        parts = [p for p in instructions if p]
        if with_history and self.history_messages > 0 and len(turns) > 1:
            earlier = turns[:-1][-self.history_messages:]
            parts.append("Earlier in this conversation:\n" + "\n".join(_line(m) for m in earlier))
        body = message_text(last).strip()
        if isinstance(last, ToolMessage):
            body = f"Tool {last.name or 'result'} returned: {body}"
        if parts:
            return "\n\n".join([*parts, body])
        return body


def _report(out: Any, ids: Any, baseline: Any, user: Any, thread: Any, mode: str,
            max_new: int) -> tuple[dict[str, Any], dict[str, int] | None, str]:
    """What an answer reports: agentmem's info (mounted, dropped, timings, ...), LangChain's usage metadata and
    why it ended ("length" when ``max_new`` tokens cut it, else "stop")."""
    info = {
        "mounted": list(getattr(out, "mounted", []) or []),
        "requested": ids,
        "dropped": list(getattr(out, "dropped", []) or []),
        "mode": getattr(out, "mode", mode),
        "timings": dict(getattr(out, "timings", {}) or {}),
        "reused_tokens": getattr(out, "reused_tokens", None),
        "baseline_ttft": None if baseline is None else _baseline_ttft(baseline.timings),
        "user_id": user,
        "thread_id": thread,
    }
    prompt_tokens = getattr(out, "prompt_tokens", None)
    out_tokens = len(getattr(out, "token_ids", []) or [])
    usage = None
    if prompt_tokens:
        usage = {"input_tokens": int(prompt_tokens), "output_tokens": out_tokens,
                 "total_tokens": int(prompt_tokens) + out_tokens}
    return info, usage, "length" if out_tokens >= max_new else "stop"


def _called_name(text: str) -> str | None:
    """The tool name a call cut short had written, if it got that far.

    >>> _called_name('{"name": "get_weather", "arguments": {"ci'), _called_name('{"na')
    ('get_weather', None)
    """
    found = _NAME.search(text)
    return found.group(1) if found else None


def _baseline_ttft(timings: Mapping[str, float]) -> float:
    # The dry run goes first, so it pays the session's restore from disk, which the real turn then skips and
    # which text mode would not need either: leave it out, or the comparison flatters KV mode.
    return float(timings.get("ttft", 0.0)) - float(timings.get("restore", 0.0))


def _line_text(m: BaseMessage) -> str:
    """A message's text; an assistant's tool calls are written back the way the model was asked to write them."""
    text = message_text(m).strip()
    calls = getattr(m, "tool_calls", None) or []
    return " ".join([text, *(format_tool_call(c["name"], c.get("args") or {}) for c in calls)]).strip()


def _line(m: BaseMessage) -> str:
    who = {"human": "User", "ai": "Assistant", "tool": f"Tool {getattr(m, 'name', '') or ''}".strip()}
    return f"{who.get(m.type, m.type.capitalize())}: {_line_text(m)}"
