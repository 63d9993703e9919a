"""Where superseded entries' ``superseded_by`` chains end, remembered per process and checked on every use.

Recall following versions (``EntryStore.search(follow_versions=True)``) needs, for every superseded candidate, the
active entry at the end of its chain: one recursive query per recall (:meth:`Lifecycle.chain_ends`), ~3.6 ms of a
recall at 10,000 entries of which a third are superseded. A chain only ever grows at its end (a superseded entry's
``superseded_by`` is never rewritten: ``Catalog.apply_event`` supersedes active entries only), and the rows recall
loads anyway (each candidate *and* its chain end) say whether a remembered answer still holds:

* a candidate that is not superseded stands for itself whatever is remembered;
* a superseded candidate whose remembered end loaded as a not-superseded row (active, or retracted: recall drops
  it either way) has that end;
* anything else (superseded with no end remembered, an end that is gone or was superseded since, in this process
  or another) is :meth:`ChainEnds.stale`: looked up again, and its rows loaded.

The first recall of a user (with ``superseded_ids``) remembers every chain of that user in one query, so an id it
does not know is one that was not superseded then (the row check above catches what changed since): no chain
query at all after that, where remembering candidate by candidate still looked chains up for 3 recalls in 4 at
10,000 entries (200 queries, most candidates new to the cache). That first recall pays for it once: 0.15-0.4 s for
the 3,626 chains (33,000 links) of recall_latency.py's 10,000-entry store, so a user with more than :data:`BULK`
superseded entries is remembered candidate by candidate instead.

What the rows cannot show is a chain cut or re-pointed in its middle: a ``forget`` of an entry inside a chain
(the entries before it then stand for nothing), or an ``update`` of one (it is current again, and the chains
through it end there), in this process or ANOTHER. Those writes move the catalog's chain-cut stamp
(``store_info`` ``chain_cuts``, in the write's own transaction: :func:`agentmem.backends.sqlite.history.bump_chain_cuts`);
:meth:`ChainEnds.of_user` reads it (one plain read, ~0.1 ms) and forgets every chain when it moved. New memories
and supersessions do not move it (a chain only grows at its end: the row check sees that), so the chains stay
remembered while a conversation is being written. The answer is therefore always what the query gives today.

Example:
    >>> calls = []
    >>> chains = ChainEnds(lambda ids: (calls.append(list(ids)), {"a": "c"})[1])
    >>> chains(["a", "b"]), chains(["a", "b"]), len(calls)
    ({'a': 'c'}, {'a': 'c'}, 1)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentmem.entries.lifecycle import SUPERSEDED

LIMIT = 100_000  # remembered ids (~15 MB at most); past it everything is forgotten and looked up again
CHUNK = 5_000  # ids per chain query when a user's chains are remembered at once
BULK = 10_000  # at most this many superseded entries are looked up at a user's first recall (~0.5-1 s once)


class ChainEnds:
    """``lookup(ids) -> {superseded id: chain end}`` with a per-process memory of the answers (also of "not
    superseded"), checked against loaded rows by :meth:`stale`."""

    def __init__(self, lookup: Callable[[list[str]], Mapping[str, str]], *,
                 superseded_ids: Callable[[str], list[str]] | None = None, limit: int = LIMIT,
                 stamp: Callable[[], int] | None = None) -> None:
        self._lookup = lookup
        self._superseded_ids = superseded_ids
        self._stamp = stamp  # the catalog's chain-cut stamp: when it moves, every remembered chain may be cut
        self._seen: int | None = None  # the stamp what is remembered was looked up under
        self._known: dict[str, str | None] = {}
        self._complete: set[str] = set()  # users whose every chain (as of then) is in _known
        self._limit = limit
        self.lookups = 0  # queries made (tests and profiles count them)

    def of_user(self, user_id: str, *, stamp: int | None = None) -> Callable[[Sequence[str]], dict[str, str]]:
        """:meth:`__call__` for candidates of ``user_id``, every chain of the user remembered at the first call.
        ``stamp``: the chain-cut stamp as the caller read it already, before any look-up (a recall reads it with
        the knowledge versions: one read of ``store_info``); None reads it here.

        Example:
            >>> chains = ChainEnds(lambda ids: {"a": "c"} if "a" in ids else {}, superseded_ids=lambda u: ["a"])
            >>> chains.of_user("u1")(["a", "b"]), chains.lookups
            ({'a': 'c'}, 1)
        """
        if self._stamp is not None:
            if stamp is None:
                stamp = self._stamp()  # read BEFORE any look-up: a cut after it moves the stamp again
            if stamp != self._seen:
                self.clear()
                self._seen = stamp
        if user_id not in self._complete and self._superseded_ids is not None:
            ids = self._superseded_ids(user_id)
            if len(ids) <= min(BULK, self._limit // 2):
                found: dict[str, str] = {}
                for start in range(0, len(ids), CHUNK):  # bound the statement's parameters (SQLite: 32,766)
                    found.update(self._lookup(ids[start : start + CHUNK]))
                    self.lookups += 1
                self._remember(ids, found)
                self._complete.add(user_id)
        complete = user_id in self._complete
        return lambda ids: self(ids, complete=complete)

    def __call__(self, ids: Sequence[str], *, complete: bool = False) -> dict[str, str]:
        """The remembered chain ends of ``ids``, looking up (in one query) those never seen; ``complete``: every
        superseded id is remembered, so an unknown one is not superseded (nothing to look up).

        Example:
            >>> ChainEnds(lambda ids: {})(["x"])
            {}
        """
        missing = [] if complete else [i for i in dict.fromkeys(ids) if i not in self._known]
        if missing:
            found = self._lookup(missing)
            self.lookups += 1
            self._remember(missing, found)
        return {i: end for i in ids if (end := self._known.get(i)) is not None}

    def _remember(self, ids: Sequence[str], found: Mapping[str, str]) -> None:
        """Remember ``ids``' answers (``None``: not superseded), everything forgotten first past ``limit``."""
        if len(self._known) + len(ids) > self._limit:
            self.clear()
        self._known.update((i, found.get(i)) for i in ids)

    def stale(self, ids: Sequence[str], rows: Mapping[str, Any], ends: Mapping[str, str]) -> list[str]:
        """Those of ``ids`` whose loaded row (``rows``, chain ends included) contradicts ``ends``: superseded without
        an end, or with an end that did not load or is superseded itself.

        Example:
            >>> class R:
            ...     def __init__(self, status): self.status = status
            >>> ChainEnds(dict).stale(["a", "b"], {"a": R("superseded"), "b": R("active")}, {})
            ['a']
        """
        out = []
        for entry_id in ids:
            row = rows.get(entry_id)
            if row is None or row.status != SUPERSEDED:
                continue
            end = rows.get(ends.get(entry_id, ""))
            if end is None or end.status == SUPERSEDED:
                out.append(entry_id)
        return out

    def refresh(self, ids: Sequence[str]) -> dict[str, str]:
        """Look ``ids`` up again (what :meth:`stale` found); their current chain ends.

        Example:
            >>> ChainEnds(lambda ids: {"a": "b"}).refresh(["a"])
            {'a': 'b'}
        """
        for entry_id in ids:
            self._known.pop(entry_id, None)
        return self(ids)

    def clear(self) -> None:
        """Forget every chain (after this process deleted entries: a chain may now be cut)."""
        self._known.clear()
        self._complete.clear()


__all__ = ["ChainEnds"]
