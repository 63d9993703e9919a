"""CSRF protection for the inspector's forms: a token bound to the browser's session cookie.

The first page a browser loads sets ``agentmem_csrf`` (a random session id; HttpOnly, SameSite=Strict); every form
carries ``HMAC(server secret, that id)``. A POST is accepted only when its form token matches the HMAC of the
cookie it came with, so a page on another site, which can neither read the cookie nor the token, cannot submit
the inspector's forms with the signed-in user's key. The secret lives in the process: tokens end with it.

Example:
    >>> guard = CsrfGuard()
    >>> guard.valid("abc", guard.token("abc")), guard.valid("abc", guard.token("xyz"))
    (True, False)
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["CSRF_COOKIE", "CsrfGuard"]

CSRF_COOKIE = "agentmem_csrf"


class CsrfGuard:
    """Makes and checks the form tokens of one server process."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)

    @staticmethod
    def new_session() -> str:
        """A fresh session id for the cookie."""
        return secrets.token_urlsafe(24)

    def token(self, session: str) -> str:
        """The form token bound to ``session``."""
        return hmac.new(self._secret, session.encode(), hashlib.sha256).hexdigest()

    def valid(self, session: str | None, token: str | None) -> bool:
        """Whether ``token`` was made for ``session`` (both must be present)."""
        return bool(session) and bool(token) and hmac.compare_digest(self.token(session or ""), token or "")
