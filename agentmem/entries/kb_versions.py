"""Knowledge-base versions with a staged rollout.

``set_kb_version("v2", rollout=0.1)`` makes ``v2`` the *candidate*: knowledge entries written from then on carry
``kb_version="v2"``, and about 10 % of sessions (chosen by a hash of the session id, so a session keeps its
side) are served v2's knowledge while the others keep the *stable* version's. ``promote()`` makes the candidate
stable for everyone; ``rollback()`` withdraws it (its entries stay stored, served to nobody).

Which knowledge a reader sees: entries of its version, plus unversioned ones (written before any version was
declared: they belong to every version). A mount therefore never mixes two versions. Other kinds (turns, tool
results) are not versioned. The state lives in the catalog's ``store_info`` (``kb_version`` is the stable
version, as before; ``kb_candidate`` / ``kb_rollout`` the staged one), so every process sharing the store agrees.

Example:
    >>> from agentmem.backends.sqlite.catalog import SqliteCatalog
    >>> kb = KbVersions(SqliteCatalog(":memory:"))
    >>> kb.set("v1"); kb.set("v2", rollout=0.25)
    >>> kb.stable, kb.candidate, kb.write_version()
    ('v1', 'v2', 'v2')
    >>> share = sum(kb.version_for(f"s{i}") == "v2" for i in range(4000)) / 4000
    >>> 0.2 < share < 0.3
    True
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from agentmem.errors import InvalidInputError
from agentmem.ports.catalog import CHAIN_CUTS_KEY, Catalog, chain_cuts_value

_STABLE, _CANDIDATE, _ROLLOUT = "kb_version", "kb_candidate", "kb_rollout"
# the three keys in one read: every recall asks which version it is served (Catalog.infos: one plain read)
_STATE_KEYS = (_STABLE, _CANDIDATE, _ROLLOUT)
# what a recall reads from store_info: the three keys and the chain-cut stamp (agentmem.entries.chain_ends), one read
_RECALL_STATE_KEYS = (*_STATE_KEYS, CHAIN_CUTS_KEY)


class _State(NamedTuple):
    stable: str | None
    candidate: str | None
    rollout: float


class KbVersions:
    """Stable / candidate knowledge versions of one store, and which one a session is served."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def _state(self, info: dict[str, str] | None = None) -> _State:
        """Stable version, candidate and rollout share, read together (one query; from ``info`` when given)."""
        if info is None:
            info = self.catalog.infos(_STATE_KEYS)
        candidate, rollout = info.get(_CANDIDATE) or None, info.get(_ROLLOUT)
        return _State(info.get(_STABLE), candidate, float(rollout) if rollout and candidate else 0.0)

    @property
    def stable(self) -> str | None:
        return self._state().stable

    @property
    def candidate(self) -> str | None:
        return self._state().candidate

    @property
    def rollout(self) -> float:
        return self._state().rollout

    def set(self, version: str, *, rollout: float = 1.0) -> None:
        """Declare ``version``: at ``rollout`` 1 it is stable at once; below 1 it is staged for that share."""
        if not isinstance(version, str) or not version.strip():
            raise InvalidInputError(f"kb version must be a non-empty string, got {version!r}")
        if isinstance(rollout, bool) or not isinstance(rollout, (int, float)) or not 0 < rollout <= 1:
            raise InvalidInputError(f"rollout must be a share in (0, 1], got {rollout!r}")
        if rollout >= 1:
            self.catalog.set_info(_STABLE, version)
            self._clear_candidate()
            return
        if version == self.stable:
            raise InvalidInputError(f"kb version {version!r} is already the stable version")
        self.catalog.set_info(_CANDIDATE, version)
        self.catalog.set_info(_ROLLOUT, repr(float(rollout)))

    def promote(self) -> str:
        """Make the candidate the stable version for every session; returns it."""
        candidate = self.candidate
        if candidate is None:
            raise InvalidInputError("no staged kb version to promote: call set_kb_version(v, rollout=...) first")
        self.catalog.set_info(_STABLE, candidate)
        self._clear_candidate()
        return candidate

    def rollback(self) -> str:
        """Withdraw the candidate (its entries are kept but served to nobody); returns it."""
        candidate = self.candidate
        if candidate is None:
            raise InvalidInputError("no staged kb version to roll back")
        self._clear_candidate()
        return candidate

    def _clear_candidate(self) -> None:
        self.catalog.set_info(_CANDIDATE, "")
        self.catalog.set_info(_ROLLOUT, "")

    def write_version(self) -> str | None:
        """The version new knowledge entries are recorded under (the staged one while a rollout runs)."""
        return self.candidate or self.stable

    def version_for(self, session_id: str | None, state: _State | None = None) -> str | None:
        """The version ``session_id`` is served: the candidate for a stable ~``rollout`` share of sessions.

        Requests without a session are served the stable version.
        """
        state = self._state() if state is None else state
        if state.candidate is None or session_id is None:
            return state.stable
        digest = hashlib.sha256(f"{state.candidate}\0{session_id}".encode()).digest()
        return state.candidate if int.from_bytes(digest[:8], "big") / 2**64 < state.rollout else state.stable

    def state_key(self) -> str:
        """Changes whenever any session's served version may change (what session caches are validated against)."""
        stable, candidate, rollout = self._state()
        return stable or "" if candidate is None else f"{stable or ''}|{candidate}@{rollout!r}"

    def served(self, session_id: str | None, state: _State | None = None) -> tuple[str | None, ...]:
        """The ``kb_version`` values of knowledge entries that ``session_id`` may be served."""
        version = self.version_for(session_id, state)
        return (None,) if version is None else (version, None)

    def recall_state(self, session_id: str | None) -> tuple[tuple[str | None, ...], int]:
        """What one recall reads from ``store_info``, in one query: :meth:`served` for ``session_id`` and the
        catalog's chain-cut stamp (``store_info`` :data:`~agentmem.ports.catalog.CHAIN_CUTS_KEY`; 0 until a first cut).

        Example:
            >>> from agentmem.backends.sqlite.catalog import SqliteCatalog
            >>> kb = KbVersions(SqliteCatalog(":memory:")); kb.set("v1")
            >>> kb.recall_state("s1")
            (('v1', None), 0)
        """
        info = self.catalog.infos(_RECALL_STATE_KEYS)
        return self.served(session_id, self._state(info)), chain_cuts_value(info.get(CHAIN_CUTS_KEY))


__all__ = ["KbVersions"]
