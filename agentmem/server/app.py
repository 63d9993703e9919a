"""The HTTP server: REST for memories and sessions, the OpenAI-compatible chat API, MCP, the inspector, /metrics.

Every route is a thin layer over :class:`~agentmem.AgentMemory`'s public methods; the library never imports this
package. Routes are plain ``def`` (FastAPI runs them on its thread pool) because the memory API is blocking.

Example:
    >>> from agentmem import AgentMemory
    >>> from agentmem.server import KeyStore, ServerSettings, create_app
    >>> mem = AgentMemory("./memdata")
    >>> app = create_app(mem, keys=KeyStore("./memdata"), settings=ServerSettings())
    >>> # uvicorn.run(app, host="127.0.0.1", port=8765)
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentmem.errors import NotFoundError
from agentmem.server.auth import KeyStore, Principal
from agentmem.server.errors import error_body, install_error_handlers
from agentmem.server.schemas import (
    DocumentBody, ForgetBody, MessagesBody, OffloadBody, RecallBody, RememberBody, SendBody, SessionOpenBody,
    UpdateBody, record_json,
)
from agentmem.server.state import ServerSettings, ServerState, caller, check_user, get_state

__all__ = ["create_app"]

rest = APIRouter(prefix="/v1", tags=["memories"])


# --- memories ----------------------------------------------------------------------------------------------
@rest.post("/memories", status_code=201)
def remember(body: RememberBody, request: Request, who: Principal = Depends(caller)) -> dict[str, Any]:
    """Store one memory (``mem.remember``)."""
    check_user(who, body.user_id)
    fields = body.model_dump(exclude={"text"})
    return record_json(get_state(request).mem.remember(body.text, **fields))


@rest.post("/memories/messages", status_code=201)
def remember_messages(body: MessagesBody, request: Request, who: Principal = Depends(caller)) -> dict[str, Any]:
    """Store chat messages all-or-nothing (``mem.remember_messages``)."""
    check_user(who, body.user_id)
    messages = [m.model_dump() for m in body.messages]
    fields = body.model_dump(exclude={"messages"})
    return {"memories": [record_json(r) for r in get_state(request).mem.remember_messages(messages, **fields)]}


@rest.post("/memories/documents", status_code=201)
def remember_document(body: DocumentBody, request: Request, who: Principal = Depends(caller)) -> dict[str, Any]:
    """Store a long text as consecutive parts, one memory each, all-or-nothing (``mem.remember_document``)."""
    check_user(who, body.user_id)
    fields = body.model_dump(exclude={"text"})
    return {"memories": [record_json(r) for r in get_state(request).mem.remember_document(body.text, **fields)]}


@rest.post("/memories/recall")
def recall(body: RecallBody, request: Request, who: Principal = Depends(caller)) -> dict[str, Any]:
    """The ``k`` most relevant memories of a user, best first (``mem.recall``)."""
    check_user(who, body.user_id)
    state = get_state(request)
    with state.tracer.start_as_current_span("agentmem.recall", attributes={
            "agentmem.user": body.user_id, "agentmem.k": body.k}) as span, state.metrics.recall_seconds.time():
        hits = state.mem.recall(body.query, **body.model_dump(exclude={"query"}))
        span.set_attribute("agentmem.hits", len(hits))
    return {"hits": [record_json(h) for h in hits]}


def _owned(state: ServerState, who: Principal, entry_id: str) -> Any:
    """The entry if the caller's key covers its user; another tenant's entry is reported as not found."""
    record = state.mem.get(entry_id)  # the owner is read first: a key may cover several users
    if not who.may(record.user_id):
        raise NotFoundError(f"no memory entry with id {entry_id!r}")
    return record


@rest.get("/memories/{entry_id}")
def get_memory(entry_id: str, request: Request, who: Principal = Depends(caller)) -> dict[str, Any]:
    """One entry by id (404 if unknown, expired, or another tenant's)."""
    return record_json(_owned(get_state(request), who, entry_id))


@rest.get("/memories")
def list_memories(request: Request, user_id: str = Query(...), session_id: str | None = None,
                  kind: list[str] | None = Query(default=None), tag: list[str] | None = Query(default=None),
                  limit: int | None = Query(default=100, gt=0, le=10_000), offset: int = Query(default=0, ge=0),
                  who: Principal = Depends(caller)) -> dict[str, Any]:
    """A user's entries, oldest first (``mem.list``)."""
    check_user(who, user_id)
    rows = get_state(request).mem.list(user_id=user_id, session_id=session_id, kinds=kind, tags=tag, limit=limit,
                                       offset=offset)
    return {"memories": [record_json(r) for r in rows]}


@rest.patch("/memories/{entry_id}")
def update_memory(entry_id: str, body: UpdateBody, request: Request,
                  who: Principal = Depends(caller)) -> dict[str, Any]:
    """Change an entry, keeping its history (``mem.update``)."""
    state = get_state(request)
    _owned(state, who, entry_id)
    changes = body.model_dump(exclude_unset=True, exclude={"text"})
    return record_json(state.mem.update(entry_id, text=body.text, **changes))


@rest.get("/memories/{entry_id}/history")
def memory_history(entry_id: str, request: Request, who: Principal = Depends(caller)) -> dict[str, Any]:
    """Earlier versions of an entry, oldest first (``mem.history``)."""
    state = get_state(request)
    _owned(state, who, entry_id)
    return {"versions": [record_json(v) if hasattr(v, "__dataclass_fields__") else v
                         for v in state.mem.history(entry_id)]}


@rest.delete("/memories/{entry_id}")
def forget_one(entry_id: str, request: Request, who: Principal = Depends(caller)) -> dict[str, int]:
    """Erase one entry (row, vector, KV blob)."""
    state = get_state(request)
    owner = _owned(state, who, entry_id).user_id
    return {"deleted": state.mem.forget(entry_id, user_id=owner)}


@rest.post("/memories/forget")
def forget_scope(body: ForgetBody, request: Request, who: Principal = Depends(caller)) -> dict[str, int]:
    """Erase all of a user's entries, or those of one of their sessions / tags."""
    check_user(who, body.user_id)
    return {"deleted": get_state(request).mem.forget(**body.model_dump())}


@rest.post("/sweep")
def sweep(request: Request, who: Principal = Depends(caller)) -> dict[str, int]:
    """Erase every expired entry now (only expired data is touched, so any key may ask)."""
    return {"expired": get_state(request).mem.sweep()}


@rest.get("/stats")
def stats(request: Request, who: Principal = Depends(caller)) -> dict[str, Any]:
    """The caller's users' figures (their sessions, the tier and tokens of each); store-wide counters (KV loads,
    merges, every tenant's session tiers, this server's hit rate) only without auth, where the caller is the
    operator on loopback: a key sees nothing of the tenants it is not bound to."""
    state = get_state(request)
    server = {"model": state.settings.model_id}
    users = who.visible_users()
    if not users:  # no auth: one local operator
        return {**state.mem.stats(), "sessions": state.mem.sessions.stats(), "server": {
            **server, "kv_hit_rate": state.metrics.hit_rate(), "fidelity_points": len(state.fidelity.series)}}
    return {"users": {u: _user_stats(state, u) for u in users}, "server": server}


def _user_stats(state: ServerState, user_id: str) -> dict[str, Any]:
    mgr = state.mem.sessions
    found = []
    for sid in mgr.list(user_id=user_id):
        try:
            found.append(mgr.get(sid, user_id=user_id))
        except NotFoundError:  # ended between the two calls
            continue
    tiers = {t: sum(s.tier == t for s in found) for t in ("hot", "warm", "cold")}
    return {"sessions": len(found), "session_tokens": sum(s.tokens for s in found), "tiers": tiers}


# --- sessions ----------------------------------------------------------------------------------------------
@rest.post("/sessions", status_code=201, tags=["sessions"])
def open_session(body: SessionOpenBody, request: Request, who: Principal = Depends(caller)) -> dict[str, Any]:
    """Open (or reopen) a conversation whose working KV is reused across turns."""
    check_user(who, body.user_id)
    s = get_state(request).mem.session(body.session_id or uuid.uuid4().hex, user_id=body.user_id)
    return {"session_id": s.session_id, "user_id": s.user_id, "tier": s.tier, "tokens": s.tokens}


@rest.get("/sessions", tags=["sessions"])
def list_sessions(request: Request, user_id: str = Query(...), who: Principal = Depends(caller)) -> dict[str, Any]:
    """A user's open sessions and the tier their KV is in."""
    check_user(who, user_id)
    mgr = get_state(request).mem.sessions
    found = [mgr.get(sid, user_id=user_id) for sid in mgr.list(user_id=user_id)]
    return {"sessions": [{"session_id": s.session_id, "tier": s.tier, "tokens": s.tokens} for s in found]}


@rest.post("/sessions/{session_id}/messages", tags=["sessions"])
def send(session_id: str, body: SendBody, request: Request, who: Principal = Depends(caller)) -> dict[str, Any]:
    """One turn: recall, mount, answer, remember (``Session.send``)."""
    check_user(who, body.user_id)
    s = get_state(request).mem.session(session_id, user_id=body.user_id)
    r = s.send(body.text, k=body.k, max_new_tokens=body.max_new_tokens, mode=body.mode, remember=body.remember)
    return {"text": r.text, "mounted": r.mounted, "dropped": r.dropped, "reused_tokens": r.reused_tokens,
            "prefilled_tokens": r.prefilled_tokens, "prompt_tokens": r.prompt_tokens, "timings": r.timings,
            "records": r.records, "fallbacks": [list(f) for f in r.fallbacks], "tier": s.tier}


@rest.post("/sessions/{session_id}/offload", tags=["sessions"])
def offload(session_id: str, body: OffloadBody, request: Request, who: Principal = Depends(caller)) -> dict[str, Any]:
    """Move a session's KV down to ``warm`` (CPU) or ``disk`` now."""
    check_user(who, body.user_id)
    mem = get_state(request).mem
    mem.session(session_id, user_id=body.user_id)  # opens it if only its file exists
    return {"session_id": session_id, "tier": mem.sessions.offload(session_id, to=body.to, user_id=body.user_id)}


@rest.delete("/sessions/{session_id}", tags=["sessions"])
def end_session(session_id: str, request: Request, user_id: str = Query(...),
                who: Principal = Depends(caller)) -> dict[str, Any]:
    """Erase a session's working KV from every tier (its long-term memories stay)."""
    check_user(who, user_id)
    mem = get_state(request).mem
    # session ids are per user: only this user's session of that id is erased
    return {"session_id": session_id, "ended": mem.sessions.end(session_id, user_id=user_id)}


# --- the app -----------------------------------------------------------------------------------------------
class _BodyLimit:
    """413 before a too-large body reaches a route: by Content-Length, or counted as a chunked body arrives.

    Plain ASGI rather than ``BaseHTTPMiddleware``, which runs every request (not only large ones) through an extra
    task and a pair of memory streams. A chunked body is read only up to the limit, then replayed to the route.
    """

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.state.settings.max_body_bytes
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None or scope["method"] not in ("POST", "PUT", "PATCH"):
            if length is not None and length.isdigit() and int(length) > limit:
                return await self._reject(scope, receive, send, limit)
            return await self.app(scope, receive, send)
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > limit:
                return await self._reject(scope, receive, send, limit)
            if not message.get("more_body"):
                break
        pending = iter(messages)

        async def replay() -> Message:
            return next(pending, None) or await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        self.state.metrics.errors.labels(status="413", type="too_large").inc()
        await JSONResponse(error_body(413, f"request body larger than {limit} bytes"), status_code=413)(
            scope, receive, send)


def create_app(mem: Any, *, keys: KeyStore | None, settings: ServerSettings | None = None,
               mcp: bool = True, tracer_provider: Any = None) -> FastAPI:
    """The FastAPI app serving ``mem`` (one model per process). ``keys`` may be None only with ``auth=False``.

    ``tracer_provider``: where spans go when ``settings.tracing`` (default: OpenTelemetry's global provider).

    Example (in process with Starlette's test client; ``agentmem serve`` runs the same app under uvicorn):
        >>> from fastapi.testclient import TestClient
        >>> from agentmem import AgentMemory
        >>> app = create_app(AgentMemory("./served"), keys=None, settings=ServerSettings(auth=False))  # local use
        >>> with TestClient(app) as client:
        ...     created = client.post("/v1/memories", json={"text": "Alice lives in Lisbon.", "user_id": "u1"})
        ...     query = {"query": "Where does Alice live?", "user_id": "u1"}
        ...     hits = client.post("/v1/memories/recall", json=query).json()["hits"]
        >>> created.status_code, [hit["text"] for hit in hits]
        (201, ['Alice lives in Lisbon.'])
    """
    from agentmem.server import inspector, openai_compat, proxy
    from agentmem.server.mcp import build_mcp

    settings = settings or ServerSettings()
    if settings.auth and keys is None:
        raise ValueError("auth is on: pass keys=KeyStore(path)")
    state = ServerState.build(mem, keys, settings, tracer_provider)
    mcp_server = build_mcp(mem, keys=keys if settings.auth else None) if mcp else None
    mcp_app = mcp_server.streamable_http_app(streamable_http_path="/", stateless_http=True,
                                             json_response=True) if mcp_server else None

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if settings.warmup and settings.upstream_url is None:  # proxy mode answers upstream: no local model
            # before the server listens (uvicorn binds after the lifespan starts): the first chat pays nothing
            await anyio.to_thread.run_sync(mem.warmup)
        async with contextlib.AsyncExitStack() as stack:
            if mcp_server is not None:
                await stack.enter_async_context(mcp_server.session_manager.run())
            try:
                yield
            finally:
                state.scheduler.cancel_all()  # decodes still running at shutdown stop before their next step
        state.close()

    # the schema and the docs page are served below, behind the same keys as the API (FastAPI's own are public)
    app = FastAPI(title="agentmem", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None,
                  description="Long-term memory for LLM agents, mounted as KV. REST, OpenAI-compatible chat, MCP.")
    app.state.agentmem = state
    install_error_handlers(app, lambda status, kind: state.metrics.errors.labels(status=str(status),
                                                                                  type=kind).inc())
    app.add_middleware(_BodyLimit, state=state)
    app.include_router(rest)
    app.include_router(proxy.router if settings.upstream_url else openai_compat.router)  # one answers chat
    app.include_router(inspector.router)
    app.mount("/inspector/static", inspector.static_files(), name="inspector-static")

    _schema_routes(app, settings)
    _probe_routes(app, state, settings)

    if mcp_app is not None:
        from agentmem.server.mcp import McpAuth

        app.mount("/mcp", McpAuth(mcp_app, state))
    return app


def _probe_routes(app: FastAPI, state: ServerState, settings: ServerSettings) -> None:
    """``/healthz`` (a liveness probe, public) and ``/metrics`` (Prometheus text, behind the keys)."""

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        # The session tier gauges are store-wide (every tenant's sessions): like /v1/stats' store-wide figures they
        # go to the operator only (a --metrics-public scrape from loopback, or any scrape without auth); a key
        # bound to users gets this server's own metrics without them.
        operator = settings.metrics_public and _loopback(request)
        if not operator:
            operator = not caller(request).visible_users()
        return Response(state.metrics.render(store_wide=operator), media_type="text/plain; version=0.0.4")


def _schema_routes(app: FastAPI, settings: ServerSettings) -> None:
    """``/openapi.json`` for callers with a key; ``/docs`` (Swagger UI) only when ``settings.docs`` is on, since
    Swagger UI's script and styles come from a CDN: off by default, no third-party script runs beside the API."""

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(_: Principal = Depends(caller)) -> JSONResponse:
        return JSONResponse(app.openapi())

    if settings.docs:
        @app.get("/docs", include_in_schema=False)
        def docs(_: Principal = Depends(caller)) -> Response:
            return get_swagger_ui_html(openapi_url="/openapi.json", title="agentmem API")


def _loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    return host in ("127.0.0.1", "::1", "localhost")
