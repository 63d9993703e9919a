"""The inspector: server-rendered pages (Jinja2) with a little JS, behind the same API keys as the REST API.

Pages: ``/inspector`` (users, their sessions and tier, hit rates, the fidelity monitor over time, recent chat
requests), ``/inspector/users/{id}`` (entries with full ids, text, tags, TTL, versions; ``?q=`` searches them by
recall; each entry can be edited, which keeps its history, or forgotten), ``/inspector/requests/{id}`` (what was
recalled, mounted with score beside the mount threshold in force, tokens and position, and dropped and why). A
browser signs in once at ``/inspector/login`` (the key goes into an HttpOnly cookie); API clients may send the
Bearer header instead. The edit and forget forms are POSTs checked against a CSRF token bound to the browser's
session cookie (:mod:`.csrf`).

Example (``create_app`` includes this router; in process with Starlette's test client):
    >>> from fastapi.testclient import TestClient
    >>> from agentmem import AgentMemory
    >>> from agentmem.server import ServerSettings, create_app
    >>> mem = AgentMemory("./memdata")
    >>> _ = mem.remember("Alice lives in Lisbon.", user_id="u1")
    >>> page = TestClient(create_app(mem, keys=None, settings=ServerSettings(auth=False))).get("/inspector/users/u1")
    >>> page.status_code, "Alice lives in Lisbon." in page.text      # with API keys, sign in at /inspector/login
    (200, True)
"""

from __future__ import annotations

import json
import time
from urllib.parse import quote
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from agentmem.errors import AgentMemError, NotFoundError
from agentmem.server.auth import Principal
from agentmem.server.inspector.csrf import CSRF_COOKIE, CsrfGuard
from agentmem.server.state import COOKIE, ServerState, caller, check_user, get_state

__all__ = ["router", "static_files"]

_HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(_HERE / "templates"))
router = APIRouter(prefix="/inspector", include_in_schema=False)
_ENTRY_LIMIT = 500
_SEARCH_K = 20
_csrf = CsrfGuard()


def _when(ts: float | None) -> str:
    return "" if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _page(request: Request, name: str, **context: Any) -> HTMLResponse:
    """A rendered page; a browser without a CSRF session gets one (its forms carry the matching token)."""
    state = get_state(request)
    session = request.cookies.get(CSRF_COOKIE)
    fresh = session is None
    session = session or _csrf.new_session()
    response = templates.TemplateResponse(request, name, {"model_id": state.settings.model_id,
                                                          "csrf": _csrf.token(session), **context})
    if fresh:
        response.set_cookie(CSRF_COOKIE, session, httponly=True, samesite="strict", path="/inspector")
    return response


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


def _entry(state: ServerState, r: Any) -> dict[str, Any]:
    return {"id": r.id, "text": r.text, "kind": r.kind, "session_id": r.session_id, "tags": list(r.tags),
            "ttl": _ttl(r.expires_at), "versions": _versions(state, r.id), "score": getattr(r, "score", None),
            "kv_tokens": r.kv.tokens if r.kv else None, "created": r.created_at.strftime("%Y-%m-%d %H:%M:%S")}


@router.get("/users/{user_id}", response_model=None)
def user_page(user_id: str, request: Request, q: str | None = None, done: str | None = None) -> Response:
    who = _signed_in(request)
    if isinstance(who, RedirectResponse):
        return who
    check_user(who, user_id)
    state = get_state(request)
    q = (q or "").strip() or None
    # a search is the user's own recall (best first, with scores); otherwise every entry, oldest first
    rows = (state.mem.recall(q, user_id=user_id, k=_SEARCH_K) if q
            else state.mem.list(user_id=user_id, limit=_ENTRY_LIMIT + 1))
    entries = [_entry(state, r) for r in rows[:_ENTRY_LIMIT]]
    return _page(request, "user.html", title=user_id, user_id=user_id, entries=entries, query=q, done=done,
                 truncated=not q and len(rows) > _ENTRY_LIMIT, sessions=_sessions(state, user_id))


def _acting(request: Request, user_id: str, entry_id: str, token: str) -> tuple[ServerState, Any]:
    """The state and the entry for a form POST: signed in, the user's own entry, and a valid CSRF token."""
    who = caller(request)
    if not _csrf.valid(request.cookies.get(CSRF_COOKIE), token):
        raise HTTPException(403, "invalid or missing CSRF token: reload the page and try again")
    check_user(who, user_id)
    state = get_state(request)
    record = state.mem.get(entry_id, user_id=user_id)  # another user's entry is not found
    return state, record


def _back(user_id: str, done: str) -> RedirectResponse:
    return RedirectResponse(f"/inspector/users/{quote(user_id, safe='')}?done={quote(done)}", status_code=303)


@router.post("/users/{user_id}/entries/{entry_id}/update", response_model=None)
def update_entry(user_id: str, entry_id: str, request: Request, text: str = Form(""),
                 csrf: str = Form("")) -> Response:
    """Replace an entry's text (a new version; the old one stays in its history)."""
    state, _ = _acting(request, user_id, entry_id, csrf)
    try:
        state.mem.update(entry_id, text=text, reason="edited in the inspector")
    except AgentMemError as exc:
        return _back(user_id, f"not saved: {exc}")
    return _back(user_id, f"saved a new version of {entry_id}")


@router.post("/users/{user_id}/entries/{entry_id}/forget", response_model=None)
def forget_entry(user_id: str, entry_id: str, request: Request, csrf: str = Form("")) -> Response:
    """Erase an entry (row, vector, KV blob, history)."""
    state, _ = _acting(request, user_id, entry_id, csrf)
    state.mem.forget(entry_id, user_id=user_id)
    return _back(user_id, f"forgot {entry_id}")


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
    scores = {h["id"]: h["score"] for h in r["recalled"]}
    scores.update({d["id"]: d["score"] for d in r.get("dropped", ()) if d.get("score") is not None})  # below threshold
    # the mount threshold the request ran under (recorded with it), else the store's current setting
    threshold = r.get("mount_min_score", state.mem.config.mount_min_score)
    return _page(request, "request.html", title=f"request {request_id}", r={**r, "when": _when(r.get("at"))},
                 texts=texts, scores=scores, threshold=threshold)


def static_files() -> StaticFiles:
    """The inspector's script, mounted by the app at ``/inspector/static``."""
    return StaticFiles(directory=str(_HERE / "static"))
