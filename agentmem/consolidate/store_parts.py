"""The local consolidation's parts for one store: the consolidator built over an :class:`EntryStore`, and recall's
demotion step (:class:`agentmem.recall.pipeline.Demotion`) run on its conflict check.

Example:
    >>> from agentmem.entries.store import Scope
    >>> consolidator = local_consolidator(store, MemoryConfig(), bundled_pairs=True)  # store: an AgentMemory's
    >>> paris = mem.remember_many([{"text": "I moved to Paris in June.", "user_id": "u1"}], consolidate=False)
    >>> found = store.search("Where do I live?", Scope("u1"), k=3)
    >>> demoted = ConflictDemotion(consolidator, store).demote(found, "Where do I live?")
    >>> [h.row.text for h in demoted if "moved" in h.row.text]  # the older city behind the newer, wherever it ranked
    ['I moved to Paris in June.', 'I moved to Lyon last May.']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentmem.config import MemoryConfig
from agentmem.consolidate.local import CHECKED, LocalConsolidator, demote_older, demotion_pool, moved_down
from agentmem.consolidate.pairs import PairModel
from agentmem.consolidate.subjects import differ, subject_of
from agentmem.entries.store import EntryStore


def local_consolidator(store: EntryStore, config: MemoryConfig, *, bundled_pairs: bool) -> LocalConsolidator:
    """The consolidator of ``store``: its vector index for neighbours, its catalog for rows, its sealer for texts,
    its embedder for text vectors; the bundled pairwise model when ``bundled_pairs`` (its weights belong to the
    bundled embedder: with another, the cosine rule).

    Example:
        >>> local_consolidator(store, MemoryConfig(), bundled_pairs=True).pairs is not None
        True
        >>> local_consolidator(store, MemoryConfig(), bundled_pairs=False).pairs is None  # the cosine rule
        True
    """
    vectors, catalog, sealer, embedder = store.vectors, store.catalog, store.sealer, store.embedder
    return LocalConsolidator(
        query=lambda vec, user, n, kind: vectors.query(vec, user_id=user, n=n, where={"kind": kind}),
        rows=catalog.get, text_of=lambda r: sealer.open_text(r.id, "text", r.text),
        embed=lambda texts: embedder.encode(texts, batch_size=config.embedding_batch_size),
        pairs=PairModel.bundled() if bundled_pairs else None)


class ConflictDemotion:
    """Recall's demote step: of the first ``CHECKED`` hits (the same head for every k), the pairs the consolidator
    finds in conflict are settled older-behind-newer (:func:`agentmem.consolidate.local.demote_older`), after a hit
    surely about someone else than the query asks about (:func:`~agentmem.consolidate.subjects.subject_of`) moved
    ``SETTLE`` places down (:func:`agentmem.consolidate.local.moved_down`); recall looks
    :func:`~agentmem.consolidate.local.demotion_pool` hits deep for it.

    Example:
        >>> demotion = ConflictDemotion(consolidator, store)
        >>> [demotion.pool(k) for k in (1, 5, 10)]
        [11, 11, 15]
    """

    def __init__(self, consolidator: LocalConsolidator, store: EntryStore) -> None:
        self._consolidator = consolidator
        self._sealer = store.sealer

    def pool(self, k: int) -> int:
        return demotion_pool(k)

    def demote(self, found: list[Any], query: str, *, drop_older: bool = False,
               mounted: Callable[[Any], bool] | None = None, query_vector: Any = None,
               newer_of: dict[str, str] | None = None) -> list[Any]:
        """See :meth:`agentmem.recall.pipeline.Demotion.demote`."""
        head = found[:CHECKED]
        texts = [self._sealer.open_text(s.row.id, "text", s.row.text) for s in head]
        conflicts = self._consolidator.conflicts([s.row for s in head], texts, query, query_vector=query_vector)
        if newer_of is not None:  # each older hit's best-ranked newer one (pairs in the newer's rank order)
            rank = {s.row.id: n for n, s in enumerate(found)}
            for older, newer in sorted(conflicts, key=lambda pair: rank.get(pair[1], len(rank))):
                newer_of.setdefault(older, newer)
        # a hit surely about someone else than the query asks about first moves down, then the older of a conflict
        # behind the newer: the other way round the first move lifted contradicted hits back into the top 3
        # ("My husband's favorite food is ..." for "What is my favorite food?"). Not a hit limited to an occasion the
        # query does not name: "When do I go to the gym?" is answered by "I go to the gym on Thursdays now." (held-out
        # scenarios: 18 of 200 top-1 answers lost that way)
        asked = subject_of(query)
        off = {s.row.id for s, text in zip(head, texts) if differ(subject_of(text), asked)}
        found = moved_down(found, lambda s: s.row.id in off)
        return demote_older(found, ident=lambda s: s.row.id, conflicts=conflicts, drop=drop_older, mounted=mounted)


__all__ = ["ConflictDemotion", "local_consolidator"]
