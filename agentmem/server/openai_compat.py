"""OpenAI-compatible chat: ``POST /v1/chat/completions`` (also ``stream=true``, as server-sent events) and
``GET /v1/models``, with the caller's memories recalled and mounted as KV on every request.

* Whose memories: the ``X-AgentMem-User`` header, else the request's ``user`` field, else the API key's only user.
* The whole request is read (agentmem/server/chat_request.py): system messages, earlier turns, tool results,
  ``tools`` / ``tool_choice`` (answers parsed into ``tool_calls``), ``response_format`` (constrained decoding),
  ``stop``, ``seed``, ``logit_bias``; a field agentmem does not support is a 400 naming it. Memories are recalled
  for the last user message under the one mount policy (``AgentMemory.recall_for_mount``); that message and the
  answer are remembered as turns of the user.
* ``X-AgentMem-Session: <id>`` makes the request a turn of that session: its working KV is reused across
  requests (the client may then send only the new message).
* Extension field ``agentmem`` on the response (and on the last stream chunk): ``request_id``, ``user``,
  ``session_id``, ``mode``, ``recalled`` [{id, score}], ``mounted`` [{id, score, tokens, position}], ``dropped``
  [{id, reason}], ``fallbacks`` [{id, reason}], ``reused_tokens`` (session KV reused), ``timings`` (seconds).
* Per-request options go in ``extra_body={"agentmem": {"k": 4, "mode": "text", "remember": false}}``.
* Tokens are streamed as the decoder produces them (the engine's per-token callback), not after the answer.

Example (the app in process on a tiny random model, so the reply is noise; against ``agentmem serve`` pass
``base_url="http://127.0.0.1:8765/v1", api_key=KEY`` and no ``http_client``):
    >>> from fastapi.testclient import TestClient
    >>> from openai import OpenAI
    >>> from agentmem import AgentMemory
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> from agentmem.server import ServerSettings, create_app
    >>> mem = AgentMemory("./memdata", model=tiny_causal_lm("llama"))
    >>> fact = mem.remember("Alice lives in Lisbon.", user_id="u1")
    >>> app = create_app(mem, keys=None, settings=ServerSettings(auth=False))
    >>> client = OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=TestClient(app))
    >>> r = client.chat.completions.create(model="agentmem", messages=[{"role": "user", "content": "Where does Alice "
    ...                                    "live?"}], user="u1", max_tokens=4)
    >>> [m["id"] for m in r.model_extra["agentmem"]["mounted"]] == [fact.id], r.usage.completion_tokens
    (True, 4)
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import StreamingResponse

from agentmem.errors import InvalidInputError, NotFoundError
from agentmem.chat_text import parse_tool_calls
from agentmem.server.auth import Principal
from agentmem.server.chat_request import ChatRequest, Conversation, exchange_turns, read_conversation
from agentmem.server.scheduler import Ticket
from agentmem.server.state import (SESSION_HEADER, USER_HEADER, ServerState, caller, get_state, pick_user,
                                   mount_drops)
from agentmem.server.tracing import mount_span

__all__ = ["ChatRequest", "openai_tool_calls", "router"]

router = APIRouter(prefix="/v1", tags=["openai"])


class _Chat:
    """One chat request: recall, mount, answer (optionally streaming pieces), remember, report."""

    def __init__(self, state: ServerState, body: ChatRequest, user: str, session_id: str | None) -> None:
        self.state, self.body, self.user, self.session_id = state, body, user, session_id
        self.convo = read_conversation(body)
        if session_id is not None:
            _check_session_request(self.convo)
        self.question = self.convo.query
        self.tool_calls: list[dict[str, Any]] = []
        self.mode = body.agentmem.mode or state.settings.chat_mode
        self.k = body.agentmem.k or state.settings.chat_k
        self.max_tokens = body.max_completion_tokens or body.max_tokens or state.settings.max_tokens
        self.token_limit = self.max_tokens
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.cancelled = False
        self.mount_dropped: list[dict[str, Any]] = []  # recalled, left out by the mount policy (threshold, contradicted)
        self.written: list[Any] = []  # records of the turns this exchange wrote (withdrawn if it is not delivered)
        self.record_id: str | None = None  # this request's record in the request log

    def run(self, on_text: Any = None, cancel: threading.Event | None = None) -> dict[str, Any]:
        """Blocking: recall, generate (streaming pieces to ``on_text``), remember; returns the extension field.

        Once ``cancel`` is set (the client hung up) decoding stops before its next step, and nothing is remembered:
        the exchange was never delivered whole. A session turn keeps what was decoded, as a truncated turn. Turns
        written while the client hung up are withdrawn (:meth:`withdraw`)."""
        mem, metrics = self.state.mem, self.state.metrics
        hits, recall_s = self._recall()
        with self.state.tracer.start_as_current_span("agentmem.generate", attributes={
                "agentmem.user": self.user, "agentmem.mode": self.mode,
                "agentmem.session": self.session_id or ""}) as span:
            start_ns = time.time_ns()
            out = self._generate([h.id for h in hits], on_text, cancel)
            mount_span(self.state.tracer, start_ns, out)
            span.set_attribute("agentmem.completion_tokens", len(out.token_ids))
        stopped = cancel is not None and cancel.is_set()  # the decode was cut short (a session turn too)
        metrics.decoded_tokens.labels(outcome="cancelled" if stopped else "completed").inc(len(out.token_ids))
        text = out.text
        if self.convo.tools:
            text, self.tool_calls = parse_tool_calls(text)
        elif self.convo.schema is not None:
            text = _strict_json(text)
        self.cancelled = cancel is not None and cancel.is_set()  # at the last moment before the write
        if self.cancelled:
            metrics.chat_cancelled.inc()
        elif self.session_id is None and self.body.agentmem.remember:
            self.written = self._remember_turns(text)
        timings = {**out.timings, "recall": recall_s, "ttft": recall_s + out.timings.get("ttft", 0.0)}
        mount_s = timings.get("load", 0.0) + timings.get("mount", 0.0)
        metrics.observe_chat(self.mode, timings["ttft"], mount_s, len(out.mounted), list(out.fallbacks))
        self.text, self.completion_tokens, self.prompt_tokens = text, len(out.token_ids), out.prompt_tokens
        self.token_limit = min(self.max_tokens, out.max_new_tokens)  # the model's context may leave less room
        ext = self._report(hits, out, list(out.spans), timings)
        ext["reused_tokens"] = getattr(out, "reused_tokens", 0)  # session KV reused (0 outside a session)
        ext["cancelled"] = self.cancelled
        ext["mount_min_score"] = mem.config.mount_min_score
        # "remembered" is in the request log, so erasing these entries drops the record too
        self.record_id = self.state.requests.add({**ext, "id": ext["request_id"], "query": self.question,
                                                  "answer": out.text, "remembered": [r.id for r in self.written]})
        if cancel is not None and cancel.is_set():
            self.withdraw()  # the client hung up while the turns were written
        elif self.mode == "kv" and self.state.fidelity.due():
            self.state.fidelity.submit(self.record_id, self.question, self.user, out.text, list(out.mounted))
        return ext

    def _recall(self) -> tuple[list[Any], float]:
        """The memories to mount for the question, under the one mount policy, and the seconds it took."""
        t0 = time.perf_counter()
        with self.state.tracer.start_as_current_span("agentmem.recall", attributes={
                "agentmem.user": self.user, "agentmem.k": self.k}) as span:
            choice = self.state.mem.mount_choice(self.question, user_id=self.user, k=self.k,
                                                 asking_session=self.session_id)
            hits, self.mount_dropped = choice.mounted, mount_drops(choice)
            span.set_attribute("agentmem.hits", len(hits))
        recall_s = time.perf_counter() - t0
        self.state.metrics.recall_seconds.observe(recall_s)
        return hits, recall_s

    def withdraw(self) -> None:
        """Undo this exchange's memory write: its client hung up before the answer was delivered (it was gone
        while the turns were written, or before the response went out). New entries are erased and the entries
        they superseded are active again; a restatement (``NOOP``) only counted an entry that existed before, and
        stays counted. Idempotent; counted as a cancelled request."""
        written, self.written = self.written, []
        if not self.cancelled:
            self.cancelled = True
            self.state.metrics.chat_cancelled.inc()
        # the record first: it must not name the entries erased next (an erasure drops the records naming them)
        self.state.requests.update(self.record_id, remembered=[], cancelled=True)
        mem = self.state.mem
        for record in written:
            if record.event == "NOOP":
                continue
            mem.forget(record.id, user_id=self.user)
            for old in record.superseded_ids:
                try:
                    mem.restore(old)
                except (InvalidInputError, NotFoundError):  # active again already, or erased meanwhile
                    continue

    def _generate(self, ids: list[str], on_text: Any, cancel: threading.Event | None = None) -> Any:
        """The answer with memories ``ids`` mounted: a session turn when the request names a session."""
        b, mem = self.body, self.state.mem
        # settings the request leaves out are the model's own (its generation_config); temperature 0 is greedy
        sample = dict(do_sample=None if b.temperature is None else b.temperature > 0,
                      temperature=b.temperature or None, top_p=b.top_p, seed=b.seed)
        if self.session_id is not None:
            s = mem.session(self.session_id, user_id=self.user)
            return s.send(self.convo.last, max_new_tokens=self.max_tokens, mode=self.mode, entry_ids=ids,
                          remember=b.agentmem.remember, on_text=on_text, cancel=cancel, **sample)
        tools = self.convo.tools
        prompt = self.convo.prompt(mem.tool_prompt(tools) if tools else "")
        return mem.generate(prompt, user_id=self.user, entry_ids=ids, mode=self.mode, max_new_tokens=self.max_tokens,
                            on_text=None if tools else on_text, json_schema=self.convo.constraint(),
                            stop=self.convo.stop or None, logit_bias=self.convo.logit_bias or None, cancel=cancel,
                            **sample)

    def _remember_turns(self, answer: str) -> list[Any]:
        """What this exchange adds to the conversation, as memories of the user, in one write: the question and the
        answer; or, for a request that brings tool results back, the results (each with its call's name and
        arguments) and the answer. A turn too long for the model's context to be encoded is stored without KV
        instead (it stays recallable and is mounted as text, or dropped). Returns the records written."""
        turns = exchange_turns(self.body.messages, self.question, answer)
        try:
            return list(self.state.mem.remember_messages(turns, user_id=self.user))
        except InvalidInputError as exc:
            if "longer than the model's context" not in str(exc):
                raise
            return list(self.state.mem.remember_messages(turns, user_id=self.user, encode=False))

    def _report(self, hits: list[Any], out: Any, spans: list[tuple[int, int]], timings: dict) -> dict[str, Any]:
        score = {h.id: round(float(h.score), 6) for h in hits}
        kind = {h.id: h.kind for h in hits}  # "profile": mounted with every answer, whatever its score
        span = dict(zip(out.mounted, spans))
        fell = dict(out.fallbacks)
        mounted = [{"id": i, "score": score.get(i), "kind": kind.get(i),
                    "tokens": (span[i][1] - span[i][0]) if i in span else None,
                    "position": span[i][0] if i in span else None, "fallback": fell.get(i)} for i in out.mounted]
        dropped = [{"id": i, "reason": "over the mount budget or the model's context"} for i in out.dropped]
        seen = set(out.mounted) | set(out.dropped)
        dropped += [{"id": i, "reason": fell.get(i) or "already in the session's working KV"}
                    for i in score if i not in seen]
        dropped += self.mount_dropped
        return {"request_id": self.id, "user": self.user, "session_id": self.session_id, "mode": self.mode,
                "recalled": [{"id": h.id, "score": score[h.id]} for h in hits], "mounted": mounted,
                "dropped": dropped, "fallbacks": [{"id": i, "reason": r} for i, r in out.fallbacks],
                "timings": {k: round(v, 6) for k, v in timings.items()}}

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def finish_reason(self) -> str:
        if self.tool_calls:
            return "tool_calls"
        # cut at max_tokens or at the end of the model's context: "length", as OpenAI says for both
        return "length" if self.completion_tokens >= self.token_limit else "stop"

    def message(self) -> dict[str, Any]:
        """The answer as an OpenAI assistant message (``tool_calls`` when the model called tools)."""
        if not self.tool_calls:
            return {"role": "assistant", "content": self.text}
        return {"role": "assistant", "content": self.text or None, "tool_calls": openai_tool_calls(self.tool_calls)}

    def chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        data = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.state.settings.model_id,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return f"data: {json.dumps(data)}\n\n"


def openai_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parsed calls (``name`` / ``args`` / ``id``) in the OpenAI message shape (arguments as a JSON string)."""
    return [{"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["args"], ensure_ascii=False)}} for c in calls]


def _strict_json(text: str) -> str:
    """A constrained answer as strict JSON: byte-level tokens may write raw control characters inside strings,
    which the grammar allows and ``json.loads`` refuses; an answer cut short by ``max_tokens`` is left as it is."""
    try:
        return json.dumps(json.loads(text, strict=False), ensure_ascii=False)
    except ValueError:
        return text


def _check_session_request(convo: Conversation) -> None:
    """A session keeps its own conversation and prompt: what would have to enter them is refused, not dropped."""
    if convo.instructions:
        raise InvalidInputError("messages with role system are not supported with X-AgentMem-Session (the "
                                "session's prompt is fixed); send them without the session header")
    for name, given in (("tools", convo.tools), ("response_format", convo.schema is not None), ("stop", convo.stop),
                        ("logit_bias", convo.logit_bias)):
        if given:
            raise InvalidInputError(f"{name} is not supported with X-AgentMem-Session; send the request without "
                                    "the session header")
    if not convo.ends_with_user:
        raise InvalidInputError("messages must end with a user message in a session (X-AgentMem-Session)")


@router.get("/models")
def models(request: Request, who: Principal = Depends(caller)) -> dict[str, Any]:
    """The one model this server runs."""
    model_id = get_state(request).settings.model_id
    return {"object": "list", "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "agentmem"}]}


@router.post("/chat/completions", response_model=None)
async def chat_completions(body: ChatRequest, request: Request,
                           who: Principal = Depends(caller)) -> dict[str, Any] | StreamingResponse:
    """An OpenAI chat completion with the user's memories mounted as KV (see the module docs)."""
    state = get_state(request)
    user = pick_user(who, request.headers.get(USER_HEADER), body.user)
    chat = _Chat(state, body, user, request.headers.get(SESSION_HEADER) or None)
    ticket = _admit(state, who, user, chat.max_tokens)
    if not body.stream:
        try:
            ext = await _run_watched(request, chat, ticket)
        finally:
            state.scheduler.release(ticket)
        return {"id": chat.id, "object": "chat.completion", "created": chat.created,
                "model": state.settings.model_id,
                "choices": [{"index": 0, "message": chat.message(), "finish_reason": chat.finish_reason()}],
                "usage": chat.usage(), "agentmem": ext}
    events = _stream(chat, ticket)
    weakref.finalize(events, state.scheduler.release, ticket)  # also when the stream never started
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _admit(state: ServerState, who: Principal, user: str, max_tokens: int) -> Ticket:
    """The request's admission ticket; a 429 (over a cap) is counted before it propagates."""
    try:
        return state.scheduler.admit(key_id=who.key_id, user=user, max_tokens=max_tokens)
    except HTTPException as exc:
        if exc.status_code == 429:
            state.metrics.chat_rejected.inc()
        raise


async def _hangup(request: Request) -> None:
    """Returns when the client hangs up. The body was read whole before the route ran, so the connection's next
    ASGI message is ``http.disconnect``: waited for, not polled (a 50 ms poll per request in flight woke the event
    loop 320 times a second at 16 clients, issue #40)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _run_watched(request: Request, chat: _Chat, ticket: Ticket) -> dict[str, Any]:
    """``chat.run`` on a worker thread while the client is watched: a hang-up (or this task being cancelled, e.g.
    by a shutdown) sets the ticket's cancel event, which stops the decode before its next step, or withdraws the
    turns being written; a hang-up noticed once the answer is ready withdraws them too (it will not be sent)."""
    loop = asyncio.get_running_loop()
    worker = loop.run_in_executor(chat.state.chat_pool, chat.run, None, ticket.cancel)
    watcher = asyncio.ensure_future(_hangup(request))
    try:
        done, _ = await asyncio.wait({worker, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if watcher in done:
            ticket.cancel.set()
            await asyncio.wait({worker})
    except BaseException:
        ticket.cancel.set()
        raise
    finally:
        gone = watcher.done() and not watcher.cancelled() and watcher.exception() is None
        watcher.cancel()
    ext = worker.result()
    if not chat.cancelled and (gone or await request.is_disconnected()):  # gone after the answer: not delivered
        ticket.cancel.set()
        await loop.run_in_executor(chat.state.chat_pool, chat.withdraw)
    return ext


async def _stream(chat: _Chat, ticket: Ticket) -> AsyncIterator[str]:
    """SSE: a role chunk, one chunk per decoded piece as it is produced, a final chunk with the extension.

    When the client hangs up, Starlette cancels this generator; its ``finally`` sets the ticket's cancel event, so
    the decode stops before its next step (pieces decoded after that are counted in ``/metrics``)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    overrun = 0

    def on_text(piece: str) -> None:  # on the generating thread
        nonlocal overrun
        overrun += ticket.cancel.is_set()
        loop.call_soon_threadsafe(queue.put_nowait, ("text", piece))

    def work() -> None:
        try:
            result = ("done", chat.run(on_text, ticket.cancel))
        except Exception as exc:  # reported in-band: the 200 and the headers are already sent
            result = ("error", exc)
        if ticket.cancel.is_set():
            chat.state.metrics.cancel_overrun.observe(overrun)
        loop.call_soon_threadsafe(queue.put_nowait, result)

    worker = loop.run_in_executor(chat.state.chat_pool, work)
    try:
        yield chat.chunk({"role": "assistant", "content": ""})
        while True:
            kind, value = await queue.get()
            if kind == "text":
                yield chat.chunk({"content": value})
                continue
            if kind == "error":
                from agentmem.server.errors import error_body, status_for

                yield f"data: {json.dumps(error_body(status_for(value), str(value)))}\n\n"
            else:
                if chat.convo.tools:  # a call is only parsed once the answer is complete: the answer comes whole
                    yield chat.chunk(_whole_delta(chat))
                extra: dict[str, Any] = {"agentmem": value}
                if (chat.body.stream_options or {}).get("include_usage"):
                    extra["usage"] = chat.usage()
                yield chat.chunk({}, chat.finish_reason(), **extra)
            break
        await worker
        yield "data: [DONE]\n\n"
    finally:
        if not worker.done():
            ticket.cancel.set()  # the client hung up (or the server is stopping) before the answer ended
        chat.state.scheduler.release(ticket)


def _whole_delta(chat: _Chat) -> dict[str, Any]:
    """The whole answer as one stream delta: its text and its tool calls (with their stream ``index``)."""
    delta: dict[str, Any] = {"content": chat.text or None} if chat.text else {}
    if chat.tool_calls:
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(openai_tool_calls(chat.tool_calls))]
    return delta
