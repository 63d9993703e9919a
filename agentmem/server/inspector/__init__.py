"""The inspector: server-rendered pages (Jinja2) with a little JS, behind the same API keys as the REST API.

Pages: ``/inspector`` (users, their sessions and tier, hit rates, the fidelity monitor over time, recent chat
requests), ``/inspector/users/{id}`` (entries with text, tags, TTL, versions), ``/inspector/requests/{id}``
(what was recalled, mounted with score / tokens / position, and dropped and why). A browser signs in once at
``/inspector/login`` (the key goes into an HttpOnly cookie); API clients may send the Bearer header instead.

Example:
    >>> app.include_router(router)       # done by agentmem.server.create_app
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from agentmem.errors import NotFoundError
from agentmem.server.auth import Principal
from agentmem.server.state import COOKIE, ServerState, caller, check_user, get_state

__all__ = ["router", "static_files"]

_HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(_HERE / "templates"))
router = APIRouter(prefix="/inspector", include_in_schema=False)
_ENTRY_LIMIT = 500


def _when(ts: float | None) -> str:
    return "" if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _page(request: Request, name: str, **context: Any) -> HTMLResponse:
    state = get_state(request)
    return templates.TemplateResponse(request, name, {"model_id": state.settings.model_id, **context})


def _signed_in(request: Request) -> Principal | RedirectResponse:
    try:
        return caller(request)
    except HTTPException as exc:
        if exc.status_code == 401:
            return RedirectResponse("/inspector/login", status_code=303)
        raise


def _sessions(state: ServerState, user_id: str) -> list[dict[str, Any]]:
    mgr = state.mem.sessions
    out = []
    for sid in mgr.list(user_id=user_id):
        try:
            s = mgr.get(sid, user_id=user_id)
        except NotFoundError:  # ended between the two calls
            continue
        out.append({"id": sid, "tier": s.tier, "tokens": s.tokens})
    return out


def _users(state: ServerState, who: Principal, asked: str | None) -> list[str]:
    users = who.visible_users()
    if not users:  # no auth: the users seen in recent requests, plus one asked for
        users = sorted({r["user"] for r in state.requests.recent(limit=1000)} | ({asked} if asked else set()))
    return users


@router.get("/login")
def login_form(request: Request) -> HTMLResponse:
    return _page(request, "login.html", title="sign in", error=None)


@router.post("/login", response_model=None)
def login(request: Request, key: str = Form("")) -> Response:
    state = get_state(request)
    if state.keys is None or state.keys.authenticate(key.strip()) is None:
        return _page(request, "login.html", title="sign in", error="unknown or revoked key")
    response = RedirectResponse("/inspector", status_code=303)
    response.set_cookie(COOKIE, key.strip(), httponly=True, samesite="strict", path="/")
    return response


@router.get("", response_model=None)
def overview(request: Request, user: str | None = None) -> Response:
    who = _signed_in(request)
    if isinstance(who, RedirectResponse):
        return who
    state = get_state(request)
    users = []
    for u in _users(state, who, user):
        if who.may(u):
            users.append({"id": u, "entries": len(state.mem.list(user_id=u, limit=10_000)),
                          "sessions": _sessions(state, u)})
    stats = state.mem.sessions.stats()
    rate = state.metrics.hit_rate()
    requests = [{**r, "when": _when(r.get("at"))} for r in state.requests.recent(users=who.users, limit=50)]
    fidelity = list(state.fidelity.series)[-200:]
    return _page(request, "overview.html", title="overview", users=users, requests=requests,
                 kv_hit_rate="n/a" if rate is None else f"{rate:.0%}", no_auth=not state.settings.auth,
                 tier_hits={t: stats[t]["hits"] for t in ("hot", "warm", "cold")},
                 tier_misses={t: stats[t]["misses"] for t in ("hot", "warm", "cold")},
                 fidelity=fidelity, fidelity_json=json.dumps([{"kl": p["kl"], "at": p["at"]} for p in fidelity]),
                 fidelity_tokens=state.settings.fidelity_tokens, fidelity_share=f"{state.settings.fidelity_share:.0%}")


def _versions(state: ServerState, entry_id: str) -> int:
    history = getattr(state.mem, "history", None)
    if history is None:
        return 1
    try:
        return max(1, len({getattr(v, "version", i) for i, v in enumerate(history(entry_id))}))
    except Exception:  # an entry without history: just itself
        return 1


def _ttl(expires: datetime | None) -> str:
    if expires is None:
        return "none"
    left = expires.timestamp() - time.time()
    return f"{left / 3600:.1f} h left" if left > 3600 else f"{max(0.0, left):.0f} s left"


@router.get("/users/{user_id}", response_model=None)
def user_page(user_id: str, request: Request) -> Response:
    who = _signed_in(request)
    if isinstance(who, RedirectResponse):
        return who
    check_user(who, user_id)
    state = get_state(request)
    rows = state.mem.list(user_id=user_id, limit=_ENTRY_LIMIT + 1)
    entries = [{"text": r.text, "kind": r.kind, "session_id": r.session_id, "tags": list(r.tags),
                "ttl": _ttl(r.expires_at), "versions": _versions(state, r.id),
                "kv_tokens": r.kv.tokens if r.kv else None, "created": r.created_at.strftime("%Y-%m-%d %H:%M:%S")}
               for r in rows[:_ENTRY_LIMIT]]
    return _page(request, "user.html", title=user_id, user_id=user_id, entries=entries,
                 truncated=len(rows) > _ENTRY_LIMIT, sessions=_sessions(state, user_id))


@router.get("/requests/{request_id}", response_model=None)
def request_page(request_id: str, request: Request) -> Response:
    who = _signed_in(request)
    if isinstance(who, RedirectResponse):
        return who
    state = get_state(request)
    r = state.requests.get(request_id)
    if r is None or not who.may(r["user"]):
        raise HTTPException(404, f"no recent request {request_id!r}")
    texts: dict[str, str] = {}
    for h in r["recalled"]:
        try:
            texts[h["id"]] = state.mem.get(h["id"]).text
        except NotFoundError:  # forgotten since
            pass
    return _page(request, "request.html", title=f"request {request_id}", r={**r, "when": _when(r.get("at"))},
                 texts=texts)


def static_files() -> StaticFiles:
    """The inspector's script, mounted by the app at ``/inspector/static``."""
    return StaticFiles(directory=str(_HERE / "static"))
