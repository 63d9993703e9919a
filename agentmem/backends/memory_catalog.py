"""In-process catalog: entries, tags, history and a BM25 lexical index in dicts, written only against the port.

``catalog_url="memory"`` (:mod:`agentmem.factory`). Nothing is persisted and nothing leaves the process: for
tests, notebooks and short-lived agents, and the proof that :class:`~agentmem.ports.catalog.Catalog` says
everything the store needs (it passes the same conformance suites as the SQL catalogs, tests/conformance/, and
the facade suite as ``memory``). It imports nothing of the other backends.

Lexical search is Okapi BM25 with FTS5's constants and idf (:mod:`agentmem.backends.lexical_bounds`), over each
user's own documents (their own document frequencies and lengths, as the per-user FTS5 tables). Tokens are FTS5
unicode61's (letters and digits, case and diacritics folded); both documents and query words go through a
light suffix stemmer (:func:`stem`, not Porter: "painting", "painted" and "paints" meet; some inflections Porter
joins do not), so scores are close to, not identical with, SQLite's. Every read is a scan of the user's entries:
fine for the stores it is meant for, not for 100,000 entries.

Example:
    >>> from agentmem.ports.catalog import CatalogScope, EntryRecord
    >>> cat = MemoryCatalog()
    >>> cat.insert([EntryRecord(id="e1", user_id="u", kind="fact", text="She paints fences", memory_text="",
    ...                         created_at=0.0, tags=("home",))], index_texts=["She paints fences"])
    >>> [i for i, _ in cat.lexical_search("painted fence", user_id="u", limit=5)]
    ['e1']
    >>> [r.id for r in cat.list_entries(CatalogScope(tags=["home"]))], [r.id for r in cat.get(["e1", "gone"])]
    (['e1'], ['e1'])
"""

from __future__ import annotations

import copy
import re
import threading
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentmem.backends.lexical_bounds import B, K1, idf
from agentmem.ports.catalog import (ACTIVE, CHAIN_CUTS_KEY, KV_FIELDS, STATUS_OF, SUPERSEDED, CatalogScope, EntryRecord, HistoryEvent,
                                    TurnContext, chain_cuts_value)
from agentmem.text import STOPWORDS

_QUERY_WORD = re.compile(r"[A-Za-z0-9]+(?:'[A-Za-z]+)?")  # the query words the SQL catalogs search for
_TOKEN = re.compile(r"[^\W_]+")  # FTS5 unicode61's tokens: letters and digits


def stem(token: str) -> str:
    """A light suffix stemmer (``-ing``, ``-ed``, ``-es`` after s/x/z/ch/sh, a plural ``-s``), applied alike to
    documents and queries.

    Example:
        >>> [stem(w) for w in ("painting", "painted", "paints", "fences", "boxes", "glass", "red")]
        ['paint', 'paint', 'paint', 'fence', 'box', 'glass', 'red']
    """
    if token.endswith("ing") and len(token) > 5:
        return token[:-3]
    if token.endswith("ed") and len(token) > 4:
        return token[:-2]
    if token.endswith("es") and len(token) > 4 and token[:-2].endswith(("s", "x", "z", "ch", "sh")):
        return token[:-2]
    if token.endswith("s") and not token.endswith(("ss", "us", "is")) and len(token) > 3:
        return token[:-1]
    return token


def _fold(text: str) -> str:
    """Lowercase without diacritics, as unicode61 folds tokens ("Café" is "cafe")."""
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c)).casefold()


def _terms(text: str) -> list[str]:
    """A document's terms: its tokens, folded and stemmed (stop words kept, as FTS5 keeps them)."""
    return [stem(t) for t in _TOKEN.findall(_fold(text))]


def query_terms(query: str, *, blind: Callable[[str], str] | None = None) -> list[str]:
    """The distinct stemmed content words of a query (stop words and possessive endings dropped; ``blind`` maps
    each word to its keyed hash when the index is blinded), the terms BM25 sums over.

    Example:
        >>> query_terms("Where is Ann's red kayak?")
        ['ann', 'red', 'kayak']
    """
    words = []
    for word in _QUERY_WORD.findall(query.lower()):
        word = word.split("'")[0]
        if word and word not in STOPWORDS:
            words.append(stem(_fold(blind(word) if blind is not None else word)))
    return list(dict.fromkeys(words))


@dataclass
class _Document:
    terms: Counter[str]
    length: int


class MemoryCatalog:
    """A :class:`~agentmem.ports.catalog.Catalog` in dicts: records by id, history by entry, documents by user."""

    def __init__(self) -> None:  # noqa: D107 - see the class docstring
        self._rows: dict[str, EntryRecord] = {}
        self._history: dict[str, list[HistoryEvent]] = {}
        self._documents: dict[str, dict[str, _Document]] = {}  # user -> entry id -> its lexical document
        self._info: dict[str, str] = {}
        self._lock = threading.RLock()

    # --- writes --------------------------------------------------------------------------------
    def insert(self, records: Sequence[EntryRecord], *, index_texts: Sequence[str | None], pending: bool = False,
               history: Sequence[HistoryEvent] = ()) -> None:
        """Insert entries (copies: the caller's records stay its own), their lexical documents and history events,
        all or nothing: a duplicate id raises :class:`ValueError` before anything is written."""
        now = time.time()
        with self._lock:
            ids = [r.id for r in records]
            if len(set(ids)) != len(ids) or self._rows.keys() & set(ids):
                raise ValueError(f"entries already exist: {sorted(self._rows.keys() & set(ids)) or ids}")
            for record, index_text in zip(records, index_texts):
                row = replace(copy.deepcopy(record), tags=tuple(sorted(set(record.tags))), write_state=None,
                              write_since=None)
                if pending:
                    row.write_state, row.write_since = "adding", now
                self._rows[row.id] = row
                self._set_document(row, index_text)
            self._log(history)

    def commit(self, ids: Sequence[str]) -> None:
        """Make pending entries visible."""
        with self._lock:
            for entry_id in ids:
                row = self._rows.get(entry_id)
                if row is not None and row.write_state == "adding":
                    row.write_state = row.write_since = None

    def mark_deleting(self, ids: Sequence[str]) -> list[EntryRecord]:
        """Hide committed entries and mark their deletion in flight; returns copies of the entries marked."""
        now = time.time()
        with self._lock:
            marked = [self._rows[i] for i in dict.fromkeys(ids) if self._committed(i)]
            for row in marked:
                row.write_state, row.write_since = "deleting", now
            return [copy.deepcopy(r) for r in marked]

    def delete(self, ids: Sequence[str]) -> list[EntryRecord]:
        """Delete entries (any write state), their documents, history and every reference to them."""
        with self._lock:
            gone = [self._rows.pop(i) for i in dict.fromkeys(ids) if i in self._rows]
            erased = {r.id for r in gone}
            for row in gone:
                self._history.pop(row.id, None)
                self._set_document(row, None)
            cut = [r for r in self._rows.values() if r.superseded_by in erased]
            for row in cut:
                row.superseded_by = None
            if cut:
                self._bump_chain_cuts()
            for events in self._history.values():
                events[:] = [replace(e, related_id=None) if e.related_id in erased else e for e in events]
            return gone

    def set_kv(self, entry_id: str, kv: Mapping[str, Any] | None, *, version: int | None = None) -> bool:
        """Mark a blob write in flight on a committed entry (``kv=None``; at ``version`` when given), or end it:
        set the KV fields ``kv`` and clear the mark (any entry). False if there is no such entry."""
        if kv is not None and not set(kv) <= KV_FIELDS:
            raise ValueError(f"not KV fields: {set(kv) - KV_FIELDS}")
        with self._lock:
            row = self._rows.get(entry_id)
            if row is None or version not in (None, row.version) or (kv is None and row.write_state is not None):
                return False
            for key, value in (kv or {}).items():
                setattr(row, key, value)
            row.kv_staged_at = time.time() if kv is None else None
            return True

    def pending(self, older_than: float) -> list[EntryRecord]:
        """Entries whose add, deletion or blob write was recorded before ``older_than`` and not finished."""
        with self._lock:
            return [copy.deepcopy(r) for r in self._rows.values()
                    if (r.write_state is not None and r.write_since is not None and r.write_since <= older_than)
                    or (r.write_state is None and r.kv_staged_at is not None and r.kv_staged_at <= older_than)]

    def set_info(self, key: str, value: str) -> None:
        with self._lock:
            self._info[key] = value

    def infos(self, keys: Sequence[str]) -> dict[str, str]:
        with self._lock:
            return {k: self._info[k] for k in keys if k in self._info}

    def info_items(self, prefix: str, *, after: str = "") -> list[tuple[str, str]]:
        with self._lock:
            return sorted((k, v) for k, v in self._info.items() if k.startswith(prefix) and k > after)

    def delete_infos(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self._info.pop(key, None)

    # --- reads (committed entries only) ---------------------------------------------------------
    def _committed(self, entry_id: str) -> bool:
        row = self._rows.get(entry_id)
        return row is not None and row.write_state is None

    def get(self, ids: Sequence[str]) -> list[EntryRecord]:
        """Copies of the committed entries among ``ids``, in the order given."""
        with self._lock:
            return [copy.deepcopy(self._rows[i]) for i in ids if self._committed(i)]

    def _in_scope(self, scope: CatalogScope) -> list[EntryRecord]:
        with self._lock:
            return [r for r in self._rows.values() if r.write_state is None and scope.admits(r)]

    def iter_ids(self, scope: CatalogScope, *, page_size: int = 1000) -> Iterator[list[str]]:
        """Every id in ``scope``, ascending, in pages."""
        ids = sorted(r.id for r in self._in_scope(scope))
        for start in range(0, len(ids), page_size):
            yield ids[start:start + page_size]

    def list_entries(self, scope: CatalogScope, *, limit: int | None = None, offset: int = 0,
                     newest_first: bool = False) -> list[EntryRecord]:
        """Copies of the entries in ``scope`` by (created_at, id) (``newest_first``: the reverse), ``offset``
        skipped, at most ``limit``."""
        rows = sorted(self._in_scope(scope), key=lambda r: (r.created_at, r.id), reverse=newest_first)[offset:]
        return [copy.deepcopy(r) for r in (rows if limit is None else rows[:limit])]

    def _session_turns(self, user_id: str, session_id: str) -> list[EntryRecord]:
        """The committed turns of a user's session, oldest first."""
        return sorted((r for r in self._rows.values() if r.session_id == session_id and r.kind == "turn"
                       and r.write_state is None and r.user_id == user_id), key=lambda r: r.created_at)

    def turn_context(self, ids: Sequence[str], *, window: int = 2, committed: bool = True) -> dict[str, TurnContext]:
        """Session and the ``window`` nearest committed turns each side (same user and session) of each entry
        among ``ids``; ``committed=False``: of rows in flight too."""
        out: dict[str, TurnContext] = {}
        with self._lock:
            for entry_id in dict.fromkeys(ids):
                row = self._rows.get(entry_id)
                if row is None or (committed and row.write_state is not None):
                    continue
                if row.kind != "turn" or row.session_id is None:
                    out[entry_id] = TurnContext(row.session_id, (), ())
                    continue
                turns = self._session_turns(row.user_id, row.session_id)
                before = [r.id for r in turns if r.created_at < row.created_at][::-1][:window]
                after = [r.id for r in turns if r.created_at > row.created_at][:window]
                out[entry_id] = TurnContext(row.session_id, tuple(before), tuple(after), turn=True)
        return out

    # --- lexical index -----------------------------------------------------------------------------
    def _set_document(self, row: EntryRecord, content: str | None) -> None:
        """Replace an entry's lexical document (``None``: drop it); a user's last document takes the index along."""
        docs = self._documents.setdefault(row.user_id, {})
        docs.pop(row.id, None)
        if content is not None:
            terms = _terms(content)
            docs[row.id] = _Document(Counter(terms), len(terms))
        if not docs:
            del self._documents[row.user_id]

    def lexical_search(self, query: str, *, user_id: str, limit: int,
                       blind: Callable[[str], str] | None = None) -> list[tuple[str, float]]:
        """BM25 over the user's committed documents: ``[(id, score)]``, best first (ties by id), score > 0."""
        terms = query_terms(query, blind=blind)
        with self._lock:
            docs = {i: d for i, d in self._documents.get(user_id, {}).items() if self._committed(i)}
        if not terms or not docs:
            return []
        avg = max(sum(d.length for d in docs.values()) / len(docs), 1e-9)
        weights = {t: idf(len(docs), sum(1 for d in docs.values() if t in d.terms)) for t in terms}
        scores = []
        for entry_id, doc in docs.items():
            norm = K1 * (1 - B + B * doc.length / avg)
            score = sum(weights[t] * doc.terms[t] * (K1 + 1) / (doc.terms[t] + norm) for t in terms if t in doc.terms)
            if score > 0:
                scores.append((entry_id, score))
        return sorted(scores, key=lambda s: (-s[1], s[0]))[:limit]

    def scrub(self, user_ids: Iterable[str] | None = None, *, vacuum: bool = False) -> None:
        """Nothing to scrub: erased values are dropped from the dicts (no pages, logs or free space keep them)."""

    # --- lifecycle ---------------------------------------------------------------------------------
    def _log(self, events: Iterable[HistoryEvent]) -> None:
        for event in events:
            self._history.setdefault(event.entry_id, []).append(event)

    def _bump_chain_cuts(self) -> None:
        self._info[CHAIN_CUTS_KEY] = str(chain_cuts_value(self._info.get(CHAIN_CUTS_KEY)) + 1)

    def history(self, entry_id: str) -> list[HistoryEvent]:
        """The entry's events, oldest first (ties in the order logged)."""
        with self._lock:
            return sorted(self._history.get(entry_id, []), key=lambda e: e.at)

    def chain_ends(self, ids: Sequence[str], *, longest: int = 8) -> dict[str, str]:
        """Each superseded entry's chain end, following superseded links, at most ``longest`` of them."""
        ends: dict[str, str] = {}
        with self._lock:
            for origin in dict.fromkeys(ids):
                row = self._rows.get(origin)
                if row is None or row.superseded_by is None:
                    continue
                end, hops = row.superseded_by, 1
                while hops < longest:
                    nxt = self._rows.get(end)
                    if nxt is None or nxt.status != SUPERSEDED or nxt.superseded_by is None:
                        break
                    end, hops = nxt.superseded_by, hops + 1
                ends[origin] = end
        return ends

    def replace_entry(self, entry_id: str, fields: dict[str, Any], *, index_text: str | None,
                      tags: Sequence[str] | None, events: Sequence[HistoryEvent]) -> None:
        """Overwrite an entry's fields, lexical document, tags (when given) and log ``events``, all at once."""
        with self._lock:
            live = self._rows.get(entry_id)
            if live is None:
                raise LookupError(entry_id)
            was = (live.status, live.superseded_by)
            for key, value in fields.items():
                setattr(live, key, copy.deepcopy(value))
            if was[1] is not None and (live.status, live.superseded_by) != was:
                self._bump_chain_cuts()
            if tags is not None:
                live.tags = tuple(sorted(set(tags)))
            self._set_document(live, index_text)
            self._log(events)

    def apply_event(self, event: HistoryEvent) -> bool:
        """Make the change ``event`` records (a status change or a sighting) and log it; False if the entry is
        gone or not in the state the change starts from."""
        if event.op != "merge" and event.op not in STATUS_OF:
            raise ValueError(f"a {event.op!r} event is not a status change (insert / replace_entry write it)")
        with self._lock:
            row = self._rows.get(event.entry_id)
            if row is None:
                return False
            if event.op == "merge":
                row.seen_count, row.last_seen_at = row.seen_count + 1, event.at
            elif (row.status == ACTIVE) == (STATUS_OF[event.op] == ACTIVE):
                return False
            elif STATUS_OF[event.op] == ACTIVE:
                row.status, row.superseded_by = ACTIVE, None
                self._bump_chain_cuts()  # the chains through it end here now
            else:
                row.status, row.superseded_by = STATUS_OF[event.op], event.related_id
            self._log([event])
            return True

    def close(self) -> None:
        """Nothing to release (the entries live as long as the object)."""


def build_catalog(url: str | None, ctx: Any) -> MemoryCatalog:
    """Factory builder for ``catalog_url="memory"``."""
    return MemoryCatalog()


__all__ = ["MemoryCatalog", "build_catalog", "query_terms", "stem"]
