"""MCP server (the official ``mcp`` SDK): tools ``remember``, ``recall``, ``list``, ``get``, ``update``, ``history``
and ``forget`` over stdio or streamable HTTP.

Over HTTP it is mounted at ``/mcp`` of the agentmem server and every call is checked against the caller's API key
(the same keys as the REST API). Over stdio (``agentmem mcp --path P --user u1``) the process belongs to whoever
started it; ``--user`` limits which users its tools may touch and gives the default one.

Example (an MCP client in process; ``server.run("stdio")`` serves the same tools over stdin/stdout):
    >>> from mcp import Client
    >>> from agentmem import AgentMemory
    >>> server = build_mcp(AgentMemory("./memdata"), users=["u1"])     # its tools touch u1's memories only
    >>> async def remember_then_recall() -> str:
    ...     async with Client(server) as client:
    ...         await client.call_tool("remember", {"text": "Alice lives in Lisbon."})    # user_id: u1, the default
    ...         result = await client.call_tool("recall", {"query": "Where does Alice live?"})
    ...         return result.structured_content["hits"][0]["text"]
    >>> anyio.run(remember_then_recall)
    'Alice lives in Lisbon.'
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.responses import JSONResponse

from agentmem.errors import AgentMemError, InvalidInputError, NotFoundError
from agentmem.server.auth import ANY_USER, Principal
from agentmem.server.errors import error_body
from agentmem.server.schemas import record_json

__all__ = ["McpAuth", "build_mcp"]

_INSTRUCTIONS = ("Long-term memory. Call recall before answering questions about the user or earlier work, "
                 "remember to store facts worth keeping, list / get to read entries, update to correct one "
                 "(history shows its earlier versions), forget to erase an entry by id.")


class _Access:
    """Who may call the tools: a fixed principal (stdio) or the API key of each HTTP request."""

    def __init__(self, fixed: Principal | None, keys: Any = None) -> None:
        self.fixed, self.keys = fixed, keys

    def principal(self, ctx: Context | None) -> Principal:
        if self.fixed is not None:
            return self.fixed
        headers = (ctx.headers if ctx is not None else None) or {}
        auth = headers.get("authorization", "")
        found = self.keys.authenticate(auth[7:].strip()) if self.keys and auth.lower().startswith("bearer ") else None
        if found is None:
            raise InvalidInputError("missing or invalid API key")
        return found

    def user(self, ctx: Context | None, user_id: str | None) -> str:
        who = self.principal(ctx)
        if user_id is None:
            users = who.visible_users()
            if len(users) != 1:
                raise InvalidInputError("user_id is required")
            return users[0]
        if not who.may(user_id):
            raise InvalidInputError(f"this key may not access user {user_id!r}")
        return user_id


def _hit(h: Any) -> dict[str, Any]:
    return {"id": h.id, "text": h.text, "score": round(float(h.score), 6), "session_id": h.session_id,
            "kind": h.kind, "tags": list(h.tags), "occurred_at": h.occurred_at, "contradicted_by": h.contradicted_by}


def _tool(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A tool body whose typed agentmem errors reach the client as tool errors carrying their message
    (``ToolError``: the SDK passes its text on; any other exception it hides as "Error executing tool")."""

    @functools.wraps(fn)
    async def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except AgentMemError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc

    return guarded


def build_mcp(mem: Any, *, users: Sequence[str] | None = None, keys: Any = None) -> MCPServer:
    """An MCP server whose tools (remember, remember_document, recall, list, get, update, history, forget) call
    ``mem``. With ``keys`` (a :class:`KeyStore`) each HTTP call is authorised by its request's API key; otherwise by
    ``users`` (None = any user: a local stdio process, or ``--no-auth``). A refused call is a tool error naming the
    typed error and why.

    Example:
        >>> from agentmem import AgentMemory
        >>> server = build_mcp(AgentMemory("./tools"), users=["u1"])
        >>> sorted(tool.name for tool in anyio.run(server.list_tools))
        ['forget', 'get', 'history', 'list', 'recall', 'remember', 'remember_document', 'update']
    """
    # one function over 60 lines by design: each tool is a short closure over ``mem`` and ``access``, registered
    # where it is defined (the SDK reads each function's signature for the tool's schema)
    server = MCPServer("agentmem", instructions=_INSTRUCTIONS, version="0.1.0", log_level="WARNING")
    access = _Access(None if keys is not None else Principal(None, frozenset(users) if users else ANY_USER), keys)

    async def run(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    async def owned(ctx: Context | None, entry_id: str) -> Any:
        """The entry if the caller may touch its user; another tenant's entry reads as a missing one."""
        who = access.principal(ctx)
        rec = await run(mem.get, entry_id)
        if not who.may(rec.user_id):
            raise NotFoundError(f"no memory entry with id {entry_id!r}")
        return rec

    @server.tool(description="Store a memory for a user. Returns the entry's id and what the write did: event ADD (a "
                             "new entry), UPDATE (it superseded superseded_ids) or NOOP (the same statement again, "
                             "counted on the existing entry matched_id). kind 'profile' stores a standing fact or "
                             "instruction about the user (a preference, a constraint) that every answer takes.")
    @_tool
    async def remember(text: str, user_id: str | None = None, session_id: str | None = None,
                       tags: list[str] | None = None, kind: str = "turn",
                       ctx: Context | None = None) -> dict[str, Any]:
        uid = access.user(ctx, user_id)
        rec = await run(mem.remember, text, user_id=uid, session_id=session_id, tags=tags, kind=kind)
        return {"id": rec.id, "user_id": rec.user_id, "memory_text": rec.memory_text, "event": rec.event,
                "superseded_ids": list(rec.superseded_ids), "matched_id": rec.matched_id}

    @server.tool(description="Store a long text (a document, a web page, a long tool result) as consecutive parts "
                             "of at most max_words words, one memory each, so each part is recalled on its own; "
                             "every part's text opens with the title. Returns the parts' ids in order.")
    @_tool
    async def remember_document(text: str, user_id: str | None = None, title: str | None = None,
                                max_words: int = 150, tags: list[str] | None = None,
                                ctx: Context | None = None) -> dict[str, Any]:
        uid = access.user(ctx, user_id)
        recs = await run(mem.remember_document, text, user_id=uid, title=title, max_words=max_words, tags=tags)
        return {"ids": [r.id for r in recs], "user_id": uid, "document_id": recs[0].metadata["document"]["id"]}

    @server.tool(description="The k memories of a user most relevant to a query, best first.")
    @_tool
    async def recall(query: str, user_id: str | None = None, k: int = 5,
                     ctx: Context | None = None) -> dict[str, Any]:
        uid = access.user(ctx, user_id)
        hits = await run(mem.recall, query, user_id=uid, k=k)
        return {"hits": [_hit(h) for h in hits]}

    @server.tool(name="list", description="A user's memory entries, oldest first (optionally one session's).")
    @_tool
    async def list_(user_id: str | None = None, session_id: str | None = None, limit: int = 50, offset: int = 0,
                    ctx: Context | None = None) -> dict[str, Any]:
        uid = access.user(ctx, user_id)
        rows = await run(mem.list, user_id=uid, session_id=session_id, limit=limit, offset=offset)
        return {"memories": [record_json(r) for r in rows]}

    @server.tool(description="One memory entry by id (all its fields).")
    @_tool
    async def get(entry_id: str, ctx: Context | None = None) -> dict[str, Any]:
        return record_json(await owned(ctx, entry_id))

    @server.tool(description="Replace a memory entry's text (a new version; the old text stays in its history).")
    @_tool
    async def update(entry_id: str, text: str, tags: list[str] | None = None, reason: str | None = None,
                     ctx: Context | None = None) -> dict[str, Any]:
        await owned(ctx, entry_id)
        return record_json(await run(mem.update, entry_id, text=text, tags=tags, reason=reason))

    @server.tool(description="A memory entry's versions and events (add, update, supersede, merge), oldest first.")
    @_tool
    async def history(entry_id: str, ctx: Context | None = None) -> dict[str, Any]:
        await owned(ctx, entry_id)
        return {"versions": [record_json(v) for v in await run(mem.history, entry_id)]}

    @server.tool(description="Erase one memory entry by id (row, vector and KV blob). Returns how many were erased.")
    @_tool
    async def forget(entry_id: str, ctx: Context | None = None) -> dict[str, Any]:
        try:
            rec = await owned(ctx, entry_id)
        except NotFoundError:  # forgetting what is not there (or not yours) erases nothing
            return {"deleted": 0}
        return {"deleted": await run(mem.forget, entry_id, user_id=rec.user_id)}

    return server


class McpAuth:
    """ASGI wrapper: the MCP endpoint answers 401 to requests without a valid API key, like the REST API, and 405 to
    ``GET``: the server is stateless, so it never has a message of its own to push, and a GET stream would only sit
    open and idle for as long as the client keeps it (the MCP streamable-HTTP transport lets a server without such
    a stream answer 405)."""

    def __init__(self, app: Any, state: Any) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.state.settings.auth:
            headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
            auth = headers.get("authorization", "")
            token = auth[7:].strip() if auth.lower().startswith("bearer ") else None
            if self.state.keys is None or self.state.keys.authenticate(token) is None:
                response = JSONResponse(error_body(401, "missing or invalid API key"), status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        if scope["type"] == "http" and scope["method"] == "GET":
            response = JSONResponse(error_body(405, "this MCP endpoint has no event stream: POST requests to it"),
                                    status_code=405, headers={"Allow": "POST"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
