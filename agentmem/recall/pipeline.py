"""Recall, one pipeline: candidates → fuse → head → calibrate → demote → questions last → threshold.

The first four stages are the store's search (:meth:`agentmem.entries.store.EntryStore.search`: the dense and
lexical candidates, their fusion (:mod:`.retrieval`), the re-ranked head (:mod:`.head`) and the calibrated score
(:mod:`.calibration`)). :class:`Recaller` runs the search under the store's policy and adds the last three:

* **demote**: of two recalled memories that conflict (the same speaker stating two values of one thing, or an
  assistant's reply that restated the user's fact and the user's newer statement), the older ranks behind the
  newer (:class:`Demotion`; the consolidation's check, ``agentmem.consolidate.store_parts``); a mount leaves the older out, so the model never reads both values, and a newer one under the mount threshold
  takes the older's place (else the mount would hold neither). It runs before the threshold: the conflict
  check weighs a pair against the speaker's other recalled hits (at least 3), which the threshold would remove;
* **questions last**: in plain recall, a memory that only asks (a user's earlier question, stored as their turn)
  goes after the statements found (``MemoryConfig.recall_questions_last``): the same question asked again finds it
  first, and it answers nothing; a mount leaves it out (``MemoryConfig.mount_questions``);
* **threshold**: hits scoring below ``min_score`` are dropped (for a mount, below the mount threshold,
  :meth:`Recaller.mount_threshold`); the caller may ask for the dropped ones (why a memory was not mounted).

A mount also takes the user's **profile** memories (kind ``"profile"``: standing facts, preferences and
constraints), the most relevant ``MemoryConfig.mount_profile_max`` of them, ahead of the ``k`` recalled ones and
whatever their score: a constraint applies to requests that do not restate it ("Never schedule meetings on
Fridays." for "Book a call with Sam on Friday."), which is exactly when its score is low.

The parts it runs on are handed in (the search, the knowledge-version state, the demotion step, the hit builder),
so the pipeline imports neither the entries nor the consolidation package it sits between.

Example:
    >>> from types import SimpleNamespace as Scored
    >>> from agentmem.config import MemoryConfig
    >>> from agentmem.entries.store import Scope
    >>> found = [Scored(id="a", score=0.9), Scored(id="b", score=0.2)]
    >>> recaller = Recaller(config=MemoryConfig(consolidation="off"), search=lambda q, scope, **kw: found,
    ...                     recall_state=lambda session: (None, 0), hit_of=lambda s: s.id, demotion=None)
    >>> below = []
    >>> recaller.recall("where?", Scope("u1"), k=5, min_score=0.5, below=below), below
    (['a'], ['b'])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Generic, Protocol, TypeVar

from agentmem.config import MemoryConfig

Scored = TypeVar("Scored")
HitT = TypeVar("HitT")
UNMOUNTABLE_ROOM = 5  # extra hits a mount looks at when it leaves some out (as the conflict check does)


class Demotion(Protocol):
    """Recall's last step: conflicting hits settled, the older memory behind the newer."""

    def pool(self, k: int) -> int:
        """How many ranked hits the step looks at to return ``k`` (``k`` plus a look-ahead)."""
        ...

    def demote(self, found: list[Any], query: str, *, drop_older: bool = False,
               mounted: Callable[[Any], bool] | None = None, query_vector: Any = None,
               newer_of: dict[str, str] | None = None) -> list[Any]:
        """``found`` (scored rows, best first) reordered: an older hit a newer one contradicts moves down. With
        ``drop_older`` (a mount) it is left out instead; with ``mounted`` too (whether a hit clears the mount
        threshold) the result is what the mount takes: the hits that clear it, an older one left out, and a newer
        one that does not clear it in the place of the older one it contradicts. ``query_vector``: the query's
        unit vector, where the search computed it (which sentence of a longer memory the query is about).
        ``newer_of`` (a dict) receives each contradicted hit's id -> the id of the best-ranked newer hit of
        ``found`` that contradicts it."""
        ...


class Recaller(Generic[Scored, HitT]):
    """The recall pipeline of one store (see the module docstring).

    ``search(query, scope, k=, follow_versions=, chain_stamp=, head_k=)`` is the store's ranked search;
    ``recall_state(asking_session)`` gives the knowledge versions served to that session and the catalog's chain-cut
    stamp; ``hit_of`` turns a scored row into what recall returns; ``demotion`` is the conflict step (None: no
    consolidation to settle conflicts with); ``has_profile(user_id)`` says whether the user has a profile memory, and
    ``embed_query`` is the query vector ``search`` takes as ``query_vector``; ``unmountable(scored)`` is True for a
    hit a mount leaves out whatever its score (the facade's: a user's earlier question), ``asks(scored)`` True for a
    hit that only asks, which plain recall ranks after the statements (``MemoryConfig.recall_questions_last``). The
    scope recall is given
    is a dataclass (:class:`agentmem.entries.store.Scope`); the policy sets its ``kb_versions`` and
    ``exclude_roles``.
    """

    def __init__(self, *, config: MemoryConfig, search: Callable[..., list[Scored]],
                 recall_state: Callable[[str | None], tuple[Any, int]], hit_of: Callable[[Scored], HitT],
                 demotion: Demotion | None, has_profile: Callable[[str], bool] = lambda user_id: False,
                 embed_query: Callable[[str], Any] | None = None,
                 unmountable: Callable[[Scored], bool] | None = None,
                 asks: Callable[[Scored], bool] | None = None) -> None:
        self.config = config
        self._search = search
        self._has_profile = has_profile  # one indexed read: a user without profile memories costs no second search
        self._embed_query = embed_query  # a mount with a profile embeds its query once for both searches
        self._recall_state = recall_state
        self._hit_of = hit_of
        self._unmountable = unmountable
        self._asks = asks if config.recall_questions_last else None
        consolidating = config.consolidation != "off"
        # conflicts are settled only where consolidation keeps versions apart (docs/lifecycle.md)
        self._demotion = demotion if consolidating and config.recall_conflict_demotion else None
        self._follow = consolidating and config.recall_follows_versions

    def mount_threshold(self, min_score: float | None) -> float | None:
        """The score a mounted hit needs: the higher of ``min_score`` and ``MemoryConfig.mount_min_score``.

        Example:
            >>> Recaller(config=MemoryConfig(mount_min_score=0.5), search=list, recall_state=None, hit_of=None,
            ...          demotion=None).mount_threshold(0.2)
            0.5
        """
        if self.config.mount_min_score > 0:
            return max(min_score or 0.0, self.config.mount_min_score)
        return min_score

    def recall(self, query: str, scope: Any, *, k: int, min_score: float | None = None,
               asking_session: str | None = None, for_mount: bool = False,
               below: list[HitT] | None = None, contradicted: list[HitT] | None = None) -> list[HitT]:
        """The ``k`` best hits for ``query`` in ``scope`` (inputs already checked), best first.

        ``asking_session`` picks the knowledge version served; ``for_mount`` applies the mount policy (no roles of
        ``MemoryConfig.unmounted_roles``, none ``unmountable``, no hit below :meth:`mount_threshold`, the profile
        memories first:
        :meth:`profile`); ``below`` (a list) receives the
        ranked hits the threshold left out (at most ``k``); ``contradicted`` (a list), for a mount, the hits left out
        because a newer hit contradicts them.
        """
        served, chain_stamp = self._recall_state(asking_session)  # one read of store_info for both
        search_scope = replace(scope, kb_versions=served,
                               exclude_roles=tuple(self.config.unmounted_roles) if for_mount else ())
        if for_mount:
            min_score = self.mount_threshold(min_score)
        demotion = self._demotion
        want = demotion.pool(k) if demotion is not None else k
        if (for_mount and self._unmountable is not None) or (not for_mount and self._asks is not None):
            want = max(want, k + UNMOUNTABLE_ROOM)  # room for the hits that fill the places of those left out / last
        # the head is ranked for the k asked (the look-ahead hits only feed the conflict check), so recall's order
        # is the one the learned head was fitted and measured on (research/notes/retrieval-lab-notes.md, session 15)
        given: dict[str, Any] = {}  # the query vector, where two searches share it
        profile: list[Scored] = []
        if demotion is not None and self._embed_query is not None:  # the search's, and the conflict check reads it
            given["query_vector"] = self._embed_query(query)
        if for_mount and self.takes_profile(search_scope):
            if self._embed_query is not None and "query_vector" not in given:
                given["query_vector"] = self._embed_query(query)
            profile = self.profile(query, search_scope, chain_stamp, **given)
            want += len(profile)  # the recalled k come besides them: one more look per profile memory mounted
        found = self._search(query, search_scope, k=want, follow_versions=self._follow and not scope.include_superseded,
                             chain_stamp=chain_stamp, head_k=k, **given)
        if profile:
            standing = {s.row.id for s in profile}  # type: ignore[attr-defined]
            found = [s for s in found if s.row.id not in standing]  # type: ignore[attr-defined]
        under: list[Scored] = []  # hits the threshold leaves out, once it has applied
        newer_of: dict[str, str] = {}  # a contradicted hit's id -> the newer hit's that contradicts it
        passes = self._passes(min_score, for_mount)
        thresholded = False
        if demotion is not None and len(found) > 1:  # unresolved conflicts: the older memory behind the newer
            # before the threshold: the conflict check weighs a pair against the speaker's other hits (at least 3),
            # which a threshold would remove, and a mount would then keep both values
            mounted = passes if for_mount and min_score is not None else None
            settled = demotion.demote(found, query, drop_older=for_mount, mounted=mounted,
                                      query_vector=given.get("query_vector"), newer_of=newer_of)
            thresholded = mounted is not None  # then the demotion applied the threshold (and placed the heirs)
            if thresholded:
                kept = {id(s) for s in settled}
                under = [s for s in found if not passes(s) and id(s) not in kept]
            if contradicted is not None:  # those the mount would have held
                contradicted += [self._marked(s, newer_of) for s in self._left_out(found, settled, passes, k)]
            found = settled
        if for_mount and self._unmountable is not None:
            found = [s for s in found if not self._unmountable(s)]
            under = [s for s in under if not self._unmountable(s)]
        if not for_mount and self._asks is not None:  # a user's earlier question answers nothing: after the facts
            asking = [self._asks(s) for s in found]
            found = [s for s, a in zip(found, asking) if not a] + [s for s, a in zip(found, asking) if a]
        if min_score is not None and not thresholded:  # the threshold is the search's last step
            under = [s for s in found if not passes(s)]
            found = [s for s in found if passes(s)]
        if below is not None:  # the hits below the threshold, told apart
            below += [self._marked(s, newer_of) for s in under[:k]]
        return [self._marked(s, newer_of) for s in [*profile, *found[:k]]]

    def _marked(self, scored: Scored, newer_of: dict[str, str]) -> HitT:
        """The hit of ``scored``, with the newer recalled hit that contradicts it (``Hit.contradicted_by``)."""
        newer = newer_of.get(scored.row.id) if newer_of else None  # type: ignore[attr-defined]
        return self._hit_of(scored) if newer is None else self._hit_of(scored, contradicted_by=newer)

    @staticmethod
    def _passes(min_score: float | None, for_mount: bool) -> Callable[[Any], bool]:
        """Whether a scored hit clears ``min_score``; for a mount, a hit that took the place of a superseded memory
        (recall follows versions) also clears it when that memory's score does (``scores["stands_for"]``): an update
        is often worded unlike the question ("I got promoted, I'm a lawyer now." 0.30 for "What is my job?", where
        "I work as a paralegal." scored 0.9), and the mount then held no statement of the thing at all."""
        if min_score is None:
            return lambda s: True
        if not for_mount:
            return lambda s: s.score >= min_score
        return lambda s: s.score >= min_score or s.scores.get("stands_for", 0.0) >= min_score

    @staticmethod
    def _left_out(found: list[Scored], settled: list[Scored], passes: Callable[[Any], bool], k: int) -> list[Scored]:
        """The hits of the first ``k`` that clear the threshold that the demotion left out (a mount's contradicted)."""
        kept = {id(s) for s in settled}
        return [s for s in [s for s in found if passes(s)][:k] if id(s) not in kept]

    def takes_profile(self, scope: Any) -> bool:
        """Whether a mount in ``scope`` takes profile memories: they are on, the scope's kinds admit them, and the
        user has one.

        Example:
            >>> from agentmem.entries.store import Scope
            >>> recaller = Recaller(config=MemoryConfig(), search=None, recall_state=None, hit_of=None,
            ...                     demotion=None, has_profile=lambda user: user == "u1")
            >>> [recaller.takes_profile(s) for s in (Scope("u1"), Scope("u1", kinds=["turn"]), Scope("u2"))]
            [True, False, False]
        """
        return (self.config.mount_profile_max > 0 and (not scope.kinds or "profile" in scope.kinds)
                and self._has_profile(scope.user_id))

    def profile(self, query: str, scope: Any, chain_stamp: int, **given: Any) -> list[Scored]:
        """The user's profile memories a mount takes: the most relevant ``MemoryConfig.mount_profile_max``, best
        first, an older one a newer one contradicts left out. ``given``: the search's ``query_vector``.

        Example:
            >>> from agentmem.entries.store import Scope
            >>> recaller = Recaller(config=MemoryConfig(), search=lambda q, scope, **kw: [scope.kinds],
            ...                     recall_state=None, hit_of=None, demotion=None)
            >>> recaller.profile("Plan my trip.", Scope("u1"), 0)
            [('profile',)]
        """
        most = self.config.mount_profile_max
        want = self._demotion.pool(most) if self._demotion is not None else most
        found = self._search(query, replace(scope, kinds=("profile",)), k=want, follow_versions=False,
                             chain_stamp=chain_stamp, head_k=most, **given)
        if self._demotion is not None and len(found) > 1:  # a changed preference: the older one is left out
            found = self._demotion.demote(found, query, drop_older=True, query_vector=given.get("query_vector"))
        return found[:most]


__all__ = ["Demotion", "Recaller"]
