"""Memory proxy mode (``agentmem serve --upstream URL``): chat answered by any OpenAI-compatible server, with the
caller's memories in the prompt as text.

For each ``POST /v1/chat/completions`` the proxy, under the same auth and tenancy as the local endpoint:

1. recalls the caller's memories for the last user message under the one mount policy
   (``AgentMemory.recall_for_mount``: no assistant replies, nothing below ``mount_min_score``);
2. writes them as one system message, best first, cut to ``ServerSettings.proxy_memory_tokens`` tokens (counted
   with the local model's tokenizer), placed after the caller's own leading system messages;
3. forwards the request as the client sent it (``model`` replaced by ``--upstream-model`` when given; agentmem's
   ``agentmem`` and ``user`` fields are not sent upstream) to ``{upstream}/chat/completions``, with
   ``Authorization: Bearer $AGENTMEM_UPSTREAM_API_KEY`` when that variable is set;
4. passes the answer back (``stream=true``: each upstream event as it arrives), remembers the last user message
   and the answer as turns of the user, and adds the ``agentmem`` extension (recalled, mounted as text with their
   token counts, dropped and why), also recorded for the inspector and counted in ``/metrics`` (mode ``proxy``).

An upstream error is passed back with its own status and body. Fields the upstream supports are its business:
the proxy refuses nothing the local endpoint would not also need to read (the messages).

Example:
    $ agentmem serve --path ./memdata --upstream http://127.0.0.1:8000/v1 --upstream-model Qwen2.5-7B-Instruct
    >>> client = OpenAI(base_url="http://127.0.0.1:8765/v1", api_key=KEY)              # doctest: +SKIP
    >>> client.chat.completions.create(model="any", messages=[...], user="u1")        # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentmem.server.auth import Principal
from agentmem.server.chat_request import ChatRequest, exchange_turns, last_user_text
from agentmem.server.state import USER_HEADER, ServerState, caller, get_state, pick_user, mount_drops

__all__ = ["MEMORY_HEADER", "UPSTREAM_KEY_ENV", "router"]

router = APIRouter(prefix="/v1", tags=["openai-proxy"])

UPSTREAM_KEY_ENV = "AGENTMEM_UPSTREAM_API_KEY"
MEMORY_HEADER = "Relevant memories from earlier conversations (use them if they help):"
_NOT_FORWARDED = {"agentmem", "user"}  # agentmem's own options; the tenant's id stays here


class _Exchange:
    """One proxied request: the memory message, the upstream payload, and what is remembered and reported."""

    def __init__(self, state: ServerState, body: ChatRequest, user: str) -> None:
        self.state, self.body, self.user = state, body, user
        self.query = last_user_text(body.messages)
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.k = body.agentmem.k or state.settings.chat_k
        self.t0 = time.perf_counter()
        self.report: dict[str, Any] = {}

    def prepare(self) -> dict[str, Any]:
        """Blocking: recall, budget, build the upstream payload (also fills the report's memory part)."""
        mem, settings = self.state.mem, self.state.settings
        t = time.perf_counter()
        choice = mem.mount_choice(self.query, user_id=self.user, k=self.k)
        hits = choice.mounted
        recall_s = time.perf_counter() - t
        self.state.metrics.recall_seconds.observe(recall_s)
        lines, mounted, dropped, used = [MEMORY_HEADER], [], mount_drops(choice), mem.count_tokens(MEMORY_HEADER)
        for h in hits:
            line = f"- {h.memory_text}"
            tokens = mem.count_tokens(line)
            if used + tokens > settings.proxy_memory_tokens:
                dropped.append({"id": h.id, "reason": f"over the proxy's memory budget "
                                                      f"({settings.proxy_memory_tokens} tokens)"})
                continue
            used += tokens
            lines.append(line)
            mounted.append({"id": h.id, "score": round(float(h.score), 6), "kind": h.kind, "tokens": tokens,
                            "position": None, "fallback": None})
        self.report = {"request_id": self.id, "user": self.user, "session_id": None, "mode": "proxy",
                       "upstream": settings.upstream_url, "recalled": [{"id": h.id, "score": round(float(h.score), 6)}
                                                                       for h in hits],
                       "mounted": mounted, "dropped": dropped, "fallbacks": [], "memory_tokens": used,
                       "mount_min_score": mem.config.mount_min_score, "timings": {"recall": round(recall_s, 6)}}
        payload = self.body.model_dump(exclude_unset=True, exclude=_NOT_FORWARDED)
        payload["messages"] = _with_memories(self.body.messages, "\n".join(lines) if mounted else None)
        if settings.upstream_model:
            payload["model"] = settings.upstream_model
        return payload

    def finish(self, answer: str, ttft_s: float) -> dict[str, Any]:
        """Blocking: remember the exchange, record it for the inspector and metrics; returns the extension."""
        if self.body.agentmem.remember and self.body.messages[-1].get("role") in ("user", "tool"):
            self.state.mem.remember_messages(exchange_turns(self.body.messages, self.query, answer),
                                             user_id=self.user)
        timings = {**self.report["timings"], "ttft": round(ttft_s, 6),
                   "total": round(time.perf_counter() - self.t0, 6)}
        self.report["timings"] = timings
        self.state.metrics.observe_chat("proxy", ttft_s, 0.0, len(self.report["mounted"]), [])
        self.state.requests.add({**self.report, "id": self.id, "query": self.query, "answer": answer})
        return self.report


def _with_memories(messages: list[dict[str, Any]], memory: str | None) -> list[dict[str, Any]]:
    """``messages`` with the memory message after the leading system / developer messages (the caller's own
    instructions stay first)."""
    if memory is None:
        return list(messages)
    lead = 0
    while lead < len(messages) and messages[lead].get("role") in ("system", "developer"):
        lead += 1
    return [*messages[:lead], {"role": "system", "content": memory}, *messages[lead:]]


def _upstream_headers() -> dict[str, str]:
    key = os.environ.get(UPSTREAM_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def _client(state: ServerState) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=str(state.settings.upstream_url).rstrip("/"), headers=_upstream_headers(),
                             timeout=httpx.Timeout(state.settings.upstream_timeout_s, connect=10.0))


@router.get("/models")
async def models(request: Request, who: Principal = Depends(caller)) -> Any:
    """The upstream's models (the proxy serves whatever the upstream serves)."""
    async with _client(get_state(request)) as client:
        r = await client.get("/models")
    return JSONResponse(r.json(), status_code=r.status_code)


@router.post("/chat/completions", response_model=None)
async def chat_completions(body: ChatRequest, request: Request,
                           who: Principal = Depends(caller)) -> JSONResponse | StreamingResponse:
    """An OpenAI chat completion answered upstream, with the user's memories as a system message."""
    state = get_state(request)
    exchange = _Exchange(state, body, pick_user(who, request.headers.get(USER_HEADER), body.user))
    payload = await anyio.to_thread.run_sync(exchange.prepare)
    if body.stream:
        return StreamingResponse(_stream(exchange, payload), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    async with _client(state) as client:
        r = await client.post("/chat/completions", json=payload)
    data = r.json()
    if r.status_code != 200:
        return JSONResponse(data, status_code=r.status_code)
    answer = ((data.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
    data["agentmem"] = await anyio.to_thread.run_sync(exchange.finish, answer, time.perf_counter() - exchange.t0)
    return JSONResponse(data)


async def _stream(exchange: _Exchange, payload: dict[str, Any]) -> AsyncIterator[str]:
    """The upstream's events as they arrive; an extra chunk with the ``agentmem`` extension before ``[DONE]``."""
    pieces: list[str] = []
    ttft: float | None = None
    async with _client(exchange.state) as client, client.stream("POST", "/chat/completions", json=payload) as r:
        if r.status_code != 200:
            body = (await r.aread()).decode("utf-8", "replace")
            yield f"data: {body}\n\n"
            return
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                break
            ttft = ttft if ttft is not None else time.perf_counter() - exchange.t0
            pieces.append(_delta_text(data))
            yield f"data: {data}\n\n"
    ext = await anyio.to_thread.run_sync(exchange.finish, "".join(pieces), ttft or 0.0)
    chunk = {"id": exchange.id, "object": "chat.completion.chunk", "created": int(time.time()),
             "model": payload.get("model", ""), "choices": [], "agentmem": ext}
    yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


def _delta_text(data: str) -> str:
    try:
        chunk = json.loads(data)
    except ValueError:
        return ""
    choices = chunk.get("choices") or [{}]
    return (choices[0].get("delta") or {}).get("content") or ""
