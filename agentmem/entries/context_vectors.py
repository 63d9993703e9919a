"""Turn context vectors: a conversation turn's own vector plus its predecessor's, normalised, in a second space.

A reply ("Yeah, the one by the lake!") says little on its own; the turn before it carries the topic. Searching a
second vector per turn — ``normalise(v(turn) + v(previous turn in its session))`` — and fusing it with the ranking
lifted held-out LoCoMo recall (research/notes/retrieval-lab-notes.md: CV 0.708 / 0.792 → 0.719 / 0.801, the same weight chosen by all
5 folds). It needs **no second embedding**: both vectors are already stored.

"Previous turn" is what the catalog's turn context means by it: the latest committed turn (``kind="turn"``) of the
same user and session created before it. The vectors live in :data:`~agentmem.ports.vectors.CONTEXT_SPACE` of the
same index, keyed by the turn's id, so ``VectorIndex.delete`` erases them with the entry. What has to be kept
current, and where :class:`~agentmem.entries.store.EntryStore` calls this module:

- a new turn (``add``): its context vector is computed from the batch's vectors and its stored predecessor's, and
  written with its own vector (same transaction on pgvector); a committed turn that now follows it is refreshed;
- a forgotten / expired / erased turn (``_erase``): the turn that followed it is refreshed, so its context vector
  no longer carries the erased words (it is rebuilt from its new predecessor, before the index compacts its files);
- an updated turn (``replace``): it and its successor are refreshed.

Stores written before context vectors existed are back-filled per user on the first write after the upgrade
(:meth:`ContextVectors.backfill`), so a user's turns never mix with and without one; until then the context search
of that user finds nothing and recall ranks exactly as before.

Example:
    >>> import numpy as np
    >>> v = context_vector(np.array([1.0, 0.0], np.float32), np.array([0.0, 1.0], np.float32))
    >>> v.astype(float).round(3).tolist()  # float32 -> float first, or 0.707 prints as 0.7070000171661377
    [0.707, 0.707]
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from agentmem.ports.catalog import Catalog, CatalogScope, EntryRecord
from agentmem.ports.vectors import CONTEXT_SPACE, VectorIndex


log = logging.getLogger(__name__)


def context_vector(own: np.ndarray, previous: np.ndarray | None) -> np.ndarray:
    """``normalise(own + previous)`` (``own`` alone, normalised, for a turn without a stored predecessor).

    Example:
        >>> context_vector(np.array([3.0, 4.0], np.float32), None).tolist()
        [0.6000000238418579, 0.800000011920929]
    """
    v = np.asarray(own, dtype=np.float32) + (0 if previous is None else np.asarray(previous, dtype=np.float32))
    return (v / max(float(np.linalg.norm(v)), 1e-12)).astype(np.float32)


def is_turn(row: EntryRecord) -> bool:
    """Whether a row has a place in a conversation's turn order (a turn in a session; an unindexed one has no
    vector, so it adds no words to the turn after it, but it is still that turn's predecessor)."""
    return row.kind == "turn" and row.session_id is not None


def _metadata(session_id: str) -> dict[str, Any]:
    return {"kind": "turn", "session_id": session_id}


class ContextVectors:
    """Writes and refreshes the context vectors of one store (its catalog's turn order and its vector index).

    Example:
        >>> ctx = ContextVectors(store.catalog, store.vectors)  # store: rec, then dog, turns of session s1
        >>> ctx.refresh([("u1", dog.id), ("u1", "no-such-turn")])  # dog's: its vector plus rec's, normalised
        1
    """

    def __init__(self, catalog: Catalog, vectors: VectorIndex) -> None:
        self.catalog, self.vectors = catalog, vectors
        # every catalog orders turns and every index keeps spaces (the ports declare both); False writes and
        # searches none, as a store written before context vectors (tests set it to make one)
        self.enabled = True
        self._backfilled: set[str] = set()
        self._lock = threading.Lock()

    # --- the catalog's turn order ----------------------------------------------------------------
    def neighbour(self, ids: Sequence[str], *, after: bool, committed: bool = True) -> dict[str, tuple[str, str | None]]:
        """For the turns among ``ids`` (committed ones only unless ``committed=False``: rows marked for deletion
        still know their place): ``(session_id, the previous (or, ``after``, next) committed turn of the same user
        and session, or None)`` (:meth:`Catalog.turn_context <agentmem.ports.catalog.Catalog.turn_context>` with a
        window of one)."""
        out: dict[str, tuple[str, str | None]] = {}
        for entry_id, place in self.catalog.turn_context(ids, window=1, committed=committed).items():
            if place.turn:
                side = place.after if after else place.before
                out[entry_id] = (place.session_id, side[0] if side else None)
        return out

    def _edge(self, user_id: str, session_id: str, created_at: float, *, after: bool) -> str | None:
        """The latest committed turn of a session created before ``created_at`` (a new turn's predecessor), or,
        ``after``, the first one created after it. A scope read, not ``turn_context``: the new rows are not in the
        catalog yet (pgvector writes their context vectors inside the rows' own insert)."""
        when = {"created_after": created_at} if after else {"created_before": created_at}
        edge = self.catalog.list_entries(CatalogScope(user_id=user_id, session_id=session_id, kinds=("turn",), **when),
                                         limit=1, newest_first=not after)
        return edge[0].id if edge else None

    # --- writes ------------------------------------------------------------------------------------
    def for_new(self, rows: Sequence[EntryRecord], vectors: Mapping[str, np.ndarray]) -> tuple[tuple, list[tuple[str, str]]]:
        """The context vectors of new rows as ``VectorIndex.add`` arguments (``()`` when there are none), and the
        committed turns that will follow them (``(user, id)``: to :meth:`refresh` once the rows are committed).

        ``vectors``: the new rows' own vectors by id. A new turn's predecessor is the previous turn of the batch in
        its session, or the session's latest committed turn.
        """
        if not self.enabled:
            return (), []
        groups: dict[tuple[str, str], list[EntryRecord]] = defaultdict(list)
        for row in rows:
            if is_turn(row):
                groups[(row.user_id, row.session_id)].append(row)
        users, ids, vecs, metas, follow = [], [], [], [], []
        for (user, session), turns in groups.items():
            turns.sort(key=lambda r: r.created_at)
            before = self._edge(user, session, turns[0].created_at, after=False)
            prev = self.vectors.get(user, [before]).get(before) if before is not None else None
            for row in turns:
                own = vectors.get(row.id)
                if own is not None:
                    users.append(user), ids.append(row.id), metas.append(_metadata(session))
                    vecs.append(context_vector(own, prev))
                prev = own
            after = self._edge(user, session, turns[-1].created_at, after=True)
            if after is not None:
                follow.append((user, after))
        return ((users, ids, np.stack(vecs), metas) if ids else ()), follow

    def refresh(self, targets: Iterable[tuple[str, str]]) -> int:
        """Recompute the context vectors of ``(user, id)`` turns from what the catalog and index hold now; returns
        how many were written. Ids that are not committed, indexed turns with a vector are skipped (their context
        vector, if any, went with ``VectorIndex.delete``)."""
        if not self.enabled:
            return 0
        by_user: dict[str, list[str]] = defaultdict(list)
        for user, entry_id in targets:
            by_user[user].append(entry_id)
        written = 0
        for user, ids in by_user.items():
            near = self.neighbour(list(dict.fromkeys(ids)), after=False)
            if not near:
                continue
            own = self.vectors.get(user, list(dict.fromkeys([*near, *(p for _, p in near.values() if p)])))
            keep = [i for i in near if i in own]
            if keep:
                self.vectors.add([user] * len(keep), keep,
                                 np.stack([context_vector(own[i], own.get(near[i][1] or "")) for i in keep]),
                                 [_metadata(near[i][0]) for i in keep], space=CONTEXT_SPACE)
                written += len(keep)
        return written

    def successors(self, rows: Sequence[EntryRecord]) -> list[tuple[str, str]]:
        """``(user, id)`` of the committed turns that follow ``rows`` (rows about to be erased): their context
        vectors carry the erased turns' words and must be refreshed once the rows are gone."""
        if not self.enabled:
            return []
        turns = [r for r in rows if is_turn(r)]
        if not turns:
            return []
        user_of = {r.id: r.user_id for r in turns}
        # the rows are marked in flight: a successor that is itself being erased is never returned
        return [(user_of[i], nxt) for i, (_, nxt) in self.neighbour(list(user_of), after=True, committed=False).items() if nxt]

    def backfill(self, user_id: str) -> int:
        """Give every turn of ``user_id`` its context vector if the user has turn vectors but no context vector
        yet (a store written before this change); once per user and process. Returns how many were written."""
        if not self.enabled or user_id in self._backfilled:
            return 0
        with self._lock:
            if user_id in self._backfilled:
                return 0
            self._backfilled.add(user_id)
        if self.vectors.has_any(user_id, space=CONTEXT_SPACE):  # one id read, not the user's whole list
            return 0
        own = self.vectors.user_ids(user_id)
        n = self.refresh((user_id, i) for i in own)
        if n:
            log.info("context vectors back-filled for a user: %d turns", n)
        return n


__all__ = ["ContextVectors", "context_vector", "is_turn"]
