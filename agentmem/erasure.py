"""Erasure notices: what an erase removed, told to whoever keeps an in-process copy (the server's request log, its
fidelity monitor), so erased text leaves every copy at once, not when a buffer happens to turn over.

A notice names ids only (users, sessions, entries), never text: listeners drop whatever they hold for those ids.

Example:
    >>> seen = []
    >>> listeners = ErasureListeners()
    >>> stop = listeners.add(seen.append)
    >>> listeners.notify(Erasure(action="forget_user", user_ids=frozenset({"u1"})))
    >>> seen[0].user_ids
    frozenset({'u1'})
    >>> stop(); listeners.notify(Erasure(action="expire")); len(seen)
    1
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Erasure", "ErasureListeners"]

log = logging.getLogger("agentmem")


@dataclass(frozen=True)
class Erasure:
    """One finished erase: the audit action and every id it touched.

    ``user_ids``: users all of whose data was erased (``forget(user_id=)`` with no narrower scope);
    ``session_ids``: sessions erased as a scope or whose turns were among the erased entries; ``entry_ids``: the
    erased entries. A listener should drop anything it holds for any of them (dropping more is harmless; keeping
    erased text is not).
    """

    action: str
    user_ids: frozenset[str] = field(default_factory=frozenset)
    session_ids: frozenset[str] = field(default_factory=frozenset)
    entry_ids: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of_rows(cls, action: str, rows: Iterable[Any], *, whole_user: str | None = None,
                session_id: str | None = None) -> Erasure:
        """The notice for erased catalog rows (anything with ``id`` and ``session_id``) plus the scope.

        Example:
            >>> Erasure.of_rows("forget_user", [], whole_user="u1").user_ids
            frozenset({'u1'})
        """
        rows = list(rows)
        sessions = {r.session_id for r in rows if r.session_id} | ({session_id} if session_id is not None else set())
        return cls(action=action, user_ids=frozenset({whole_user} if whole_user is not None else ()),
                   session_ids=frozenset(sessions), entry_ids=frozenset(r.id for r in rows))


class ErasureListeners:
    """Callbacks told of every erase, after it has happened; thread-safe.

    A failing listener is logged and the others still run: the erase is done and durable by then, so turning it
    into an error would tell the caller it failed when it did not.
    """

    def __init__(self) -> None:
        self._listeners: list[Callable[[Erasure], None]] = []
        self._lock = threading.Lock()

    def add(self, listener: Callable[[Erasure], None]) -> Callable[[], None]:
        """Register ``listener``; returns a function that unregisters it."""
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    def notify(self, erasure: Erasure) -> None:
        """Tell every listener (in registration order) about ``erasure``."""
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(erasure)
            except Exception:  # see the class docstring: the erase already happened
                log.exception("an erasure listener failed (%s)", erasure.action)
