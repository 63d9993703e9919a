"""Server settings, the per-app state, and the request dependencies every route uses (state, caller, tenant check).

Example:
    >>> settings = ServerSettings(auth=False, fidelity_share=0.25)
    >>> settings.model_id
    'agentmem-smollm2-135m-instruct'
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from agentmem.admission import open_admission_counters
from agentmem.erasure import Erasure
from agentmem.server.auth import ANY_USER, KeyStore, Principal
from agentmem.server.metrics import ServerMetrics
from agentmem.server.monitor import FidelityMonitor, RequestLog
from agentmem.server.scheduler import Scheduler
from agentmem.server.tracing import server_tracer
from agentmem.validation import check_id

__all__ = ["ServerSettings", "ServerState", "caller", "check_user", "get_state", "pick_user"]

COOKIE = "agentmem_key"
USER_HEADER = "x-agentmem-user"
SESSION_HEADER = "x-agentmem-session"


class ServerSettings(BaseModel):
    """How one server behaves (the CLI's ``serve`` flags)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    auth: bool = Field(default=True, description="Require API keys; False only with --no-auth (loopback).")
    keys_url: str | None = Field(default=None, description="Where the API keys are kept: None = api_keys.db in the "
                                 "store directory; 'postgresql://...' for one set of keys shared by several servers "
                                 "(the catalog's database may be named); 'sqlite:///path/keys.db'.")
    metrics_public: bool = Field(default=False, description="Serve /metrics without a key (loopback only).")
    model_id: str = "agentmem-smollm2-135m-instruct"
    chat_mode: Literal["kv", "text"] = Field(default="kv", description="Default mode of chat completions.")
    chat_k: int = Field(default=4, gt=0, description="Memories recalled per chat request.")
    max_tokens: int = Field(default=64, gt=0, description="Default max new tokens of a chat completion.")
    fidelity_share: float = Field(default=0.1, ge=0.0, le=1.0,
                                  description="Share of chat requests also scored in text mode (fidelity monitor).")
    fidelity_tokens: int = Field(default=8, gt=0, description="Answer tokens scored by the fidelity monitor.")
    max_body_bytes: int = Field(default=1 << 20, gt=0, description="Larger request bodies get 413.")
    request_log: int = Field(default=200, gt=0, description="Recent chat requests kept for the inspector.")
    tracing: bool = Field(default=False, description="OpenTelemetry spans around recall / mount / generate.")
    max_concurrent_per_key: int = Field(default=32, gt=0, description="Chat requests in flight per API key; "
                                        "more get 429 + Retry-After.")
    max_concurrent_per_user: int = Field(default=8, gt=0, description="Chat requests in flight per user; "
                                         "more get 429 + Retry-After.")
    max_tokens_in_flight_per_user: int = Field(default=8192, gt=0, description="Sum of max_tokens of a user's "
                                               "chat requests in flight; more get 429 + Retry-After.")
    max_tokens_limit: int = Field(default=4096, gt=0, description="Largest max_tokens one chat request may ask "
                                  "for (more: 400).")
    retry_after_s: int = Field(default=1, gt=0, description="Retry-After seconds sent with a 429.")
    limits_url: str | None = Field(default=None, description="Where the caps above count requests in flight: None "
                                   "= in this server; 'redis://host:port/db' = shared by every server on that "
                                   "Redis (behind a load balancer, a user's cap holds across servers).")
    limits_lease_s: float = Field(default=30.0, gt=0, description="A request's share of the caps is a lease this "
                                  "server renews while it runs; a server that dies frees its shares after this.")
    upstream_url: str | None = Field(default=None, pattern=r"^https?://", description="Memory proxy mode: the "
                                     "base URL of an OpenAI-compatible API (e.g. http://127.0.0.1:8000/v1) that "
                                     "answers chat, with the caller's memories as a system message "
                                     "(agentmem/server/proxy.py); None = the local model answers.")
    upstream_model: str | None = Field(default=None, description="Model name sent upstream (default: the client's).")
    upstream_timeout_s: float = Field(default=300.0, gt=0, description="Seconds an upstream answer may take.")
    proxy_memory_tokens: int = Field(default=512, gt=0, description="Proxy mode: the memory message's budget in "
                                     "the local model's tokens (memories that do not fit are dropped, reported).")
    chat_threads: int = Field(default=64, gt=0, description="Chat requests worked on at once (each on its own "
                              "thread: recall and mount run side by side, prefills and decode steps batch across "
                              "them); more wait for a free thread.")
    drain_seconds: float = Field(default=10.0, ge=0, description="On SIGTERM, how long requests in flight may "
                                 "finish before their decodes are cancelled.")
    docs: bool = Field(default=False, description="Serve Swagger UI at /docs (behind the API keys). Its assets "
                       "load from a CDN, so it is off by default; /openapi.json is always served, with a key.")
    warmup: bool = Field(default=True, description="The app loads the model and the embedder when it starts (its "
                         "lifespan, which uvicorn runs before it listens; not in proxy mode): the first chat does not "
                         "pay it, and memories written from then "
                         "on are stored with their KV (kv_encoding 'lazy'; 'background' encodes it after the write "
                         "returns), not encoded by the first chat that mounts them.")


@dataclass
class ServerState:
    """Everything routes share: the memory, keys, settings, metrics, the request log and the fidelity monitor."""

    mem: Any
    keys: KeyStore | None
    settings: ServerSettings
    metrics: ServerMetrics
    requests: RequestLog
    fidelity: FidelityMonitor
    tracer: Any = None  # an OpenTelemetry tracer (the no-op one unless settings.tracing)
    scheduler: Scheduler | None = None  # admission caps and cancel events of chat requests
    stop_purging: Callable[[], None] = lambda: None  # unregisters :meth:`purge` from the memory's erasures
    # chat requests run here, not on asyncio's default executor (min(32, CPUs + 4) threads: 6 on 2 cores, which
    # capped the requests that could batch their prefills and decode steps together)
    chat_pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(64))

    @classmethod
    def build(cls, mem: Any, keys: KeyStore | None, settings: ServerSettings,
              tracer_provider: Any = None) -> ServerState:
        metrics = ServerMetrics(mem)
        requests = RequestLog(settings.request_log)
        monitor = FidelityMonitor(mem, metrics, requests, share=settings.fidelity_share,
                                  tokens=settings.fidelity_tokens)
        scheduler = Scheduler(settings, open_admission_counters(settings.limits_url))
        metrics.chat_in_flight.set_function(lambda: scheduler.in_flight)  # read at scrape time: never stale
        state = cls(mem=mem, keys=keys, settings=settings, metrics=metrics, requests=requests, fidelity=monitor,
                    tracer=server_tracer(settings.tracing, tracer_provider), scheduler=scheduler,
                    chat_pool=ThreadPoolExecutor(settings.chat_threads, thread_name_prefix="agentmem-chat"))
        state.stop_purging = mem.on_erase(state.purge)
        return state

    def purge(self, erasure: Erasure) -> None:
        """Erased data leaves this server's in-process copies too: the inspector's request log, the monitor's
        scores (``mem.on_erase`` calls this after every forget and sweep, whichever entry point asked)."""
        self.requests.purge(erasure)
        self.fidelity.purge(erasure)

    def close(self) -> None:
        """Stop listening for erasures, let queued fidelity scorings finish, give back the caps' shares (app
        shutdown)."""
        self.stop_purging()
        self.fidelity.close()
        self.chat_pool.shutdown(wait=False)  # the requests in flight were cancelled; their threads end on their own
        if self.scheduler is not None:
            self.scheduler.close()  # their shares of shared caps go back now, not when their leases end


def get_state(request: Request) -> ServerState:
    return request.app.state.agentmem


def _token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return request.cookies.get(COOKIE)


def caller(request: Request) -> Principal:
    """The authenticated caller (401 without a valid key); every user when auth is off."""
    state = get_state(request)
    if not state.settings.auth:
        return Principal(key_id=None, users=ANY_USER)
    principal = state.keys.authenticate(_token(request)) if state.keys is not None else None
    if principal is None:
        raise HTTPException(401, "missing or invalid API key: send 'Authorization: Bearer <key>' "
                                 "(create one with: agentmem keys add --path STORE --user USER)",
                            headers={"WWW-Authenticate": "Bearer"})
    return principal


def check_user(principal: Principal, user_id: str | None) -> str:
    """``user_id`` if this caller may touch it; 403 otherwise (400 when missing or not a valid id)."""
    check_id(user_id, "user_id", required=True)  # the library's id rule, before the key is even consulted
    if not principal.may(user_id):
        raise HTTPException(403, f"this API key may not access user {user_id!r}")
    return user_id


def pick_user(principal: Principal, *candidates: str | None) -> str:
    """The first given user id (header, body field); else the key's only user; checked against the key."""
    for c in candidates:
        if c:
            return check_user(principal, c)
    users = principal.visible_users()
    if len(users) == 1:
        return users[0]
    raise HTTPException(400, "user_id is required: set the request's 'user' field or the X-AgentMem-User header")


def mount_drops(choice: Any) -> list[dict[str, Any]]:
    """The request log's "dropped" entries for the recalled memories a mount left out (``AgentMemory.mount_choice``):
    for scoring below its threshold, or because a newer recalled memory contradicts them; each with its score and
    the reason in words.

    Example:
        >>> from agentmem import AgentMemory
        >>> mem = AgentMemory("./memdata")
        >>> tea = mem.remember("I like green tea.", user_id="u1")
        >>> [(drop["id"] == tea.id, drop["reason"].split(", ")[1]) for drop in mount_drops(mem.mount_choice(
        ...     "Where do I live?", user_id="u1"))]
        [(True, 'below the mount threshold 0.3')]
    """
    def drop(hit: Any, reason: str) -> dict[str, Any]:
        return {"id": hit.id, "score": round(float(hit.score), 6), "reason": reason}

    return [drop(h, f"scored {h.score:.3g}, below the mount threshold {choice.threshold:.3g}")
            for h in choice.below_threshold] + [
        drop(h, f"an older statement a newer recalled memory contradicts ({h.contradicted_by})")
        for h in choice.contradicted]

