"""Consolidation on write (``MemoryConfig(consolidation="local")``): merge near-duplicates, supersede what a newer
statement replaces. No LLM; only general signals: embedding similarity, lexical overlap, time order and speaker.

For a new memory N of a user, the candidates are that user's *active* memories of the same kind said by the same
speaker (or role), older than N: its nearest neighbours in the vector index plus earlier entries of the same batch.

* **the same statement** — N's text equals an older memory's after normalising case, spacing and punctuation
  (:func:`agentmem.consolidate.statements.statement_key`; nothing else: "My PIN is 4821" and "My PIN is 4822" are
  two statements): N is not stored; the existing entry counts it (``seen_count``, ``last_seen_at``) and logs a
  ``merge`` event (``NOOP``). Repetition then stops outranking new information. Any other write is stored.
* **supersede** — N replaces an older memory O: the pairwise model of :mod:`agentmem.consolidate.pairs`
  (a logistic regression over cosine, cosine above the speaker's background, word overlap, "nearest", and the two
  embeddings' agreement) scores the pair at or above its threshold. O is marked ``superseded_by`` N (kept in its
  history, hidden from recall, never mounted). The threshold is the highest score of any same-speaker LoCoMo pair
  the model was fitted on: a conversation's turns on one topic are alike, and hiding one hides evidence
  (docs/lifecycle.md: the cross-validated figures). Never an older turn of N's own conversation session (issue #37:
  on REALTALK, a dataset the model was not fitted on, half the turns it superseded were a speaker elaborating within
  one session); memories without a session are compared with every older one. Never an older memory of more than
  one sentence (:func:`agentmem.consolidate.statements.sentence_count`): a newer statement replaces one fact, and
  superseding a memory hides every fact it states (REALTALK: 3 of the 4 evidence turns still superseded across
  sessions were such turns, "My cat, Fluffy, keeps me company. Haha!" by "By the way, I got a new dog!"); recall
  still puts the newer first when both are found. With an embedder other than the
  bundled MiniLM (the weights belong to it) the older cosine rule applies: cosine ≥ ``SUPERSEDE`` and ``MARGIN``
  above the background.
* **newer ranks first** — conflicts left unresolved are settled at recall (:func:`demote_older`): of two recalled
  memories of the same speaker (or an assistant's older reply restating the user's fact and the user's newer
  statement, :func:`echoes`) that the pairwise model scores at or above its lower ``conflict`` threshold (with
  the other candidates of the speaker as background, at least 3; never two turns of one conversation session; an
  older memory of several sentences only at the higher ``supersede`` threshold, as demoting it pushes the other
  facts it states down the list, and weighed by the one sentence of it the newer replaces, when the query is about
  that sentence: a fact told inside a longer message is diluted in the message's vector; a newer message of
  several sentences by its sentence the query is about, at ``supersede`` too), or
  that restate one sentence with a value swapped (:func:`swapped_values`, in any session, unless the query names
  the older value and not the newer), or two results of one tool call (:mod:`agentmem.consolidate.tool_calls`:
  tool results are judged by that alone),
  the newer moves before the older and the older ``SETTLE`` places further down; only the first ``CHECKED`` hits
  are checked, whatever ``k`` (a pair from deeper down pulled a restatement over the evidence). Before that, a
  superseded entry the query finds hands its place to the entry that replaced it
  (:func:`agentmem.entries.versions.follow_versions`).

Before issue #37 a cosine of at least 0.92 with a content-word overlap of at least 0.6 merged N into the older
entry, which kept the older text of "My PIN is 4821" / "My PIN is 4822" and dropped the newer one.

Example:
    >>> sorted(content_words("I live in Lyon, and I love it!"))
    ['live', 'love', 'lyon']
    >>> round(jaccard({"a", "b"}, {"a", "b", "c"}), 2)
    0.67
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from agentmem.ports.catalog import EntryRecord
from agentmem.consolidate.pairs import PairModel
from agentmem.consolidate.statements import (Occasion, changed_span, exception_and_rule, occasion_of, only_asks,
                                              replaces_no_fact, sentence_count, stated_sentences, statement_tokens)
from agentmem.consolidate.subjects import differ, subject_of
from agentmem.consolidate.tool_calls import REPLACED, call_of, one_document, replaced_results, repeated_calls
from agentmem.erasure import Erasure
from agentmem.entries.text_vectors import pack_vector, pack_vectors, unpack_vector, unpack_vectors
from agentmem.entries.lifecycle import ACTIVE, HistoryEvent, Lifecycle
from agentmem.text import content_words

SUPERSEDE = 0.7  # without the pairwise model: floor on the texts' cosine (a restatement with a changed value)
MARGIN = 0.3  # without the pairwise model: how far above the speaker's background an older memory must stand
CONFLICT = 0.75  # without the pairwise model: text cosine above which two recalled memories conflict
NEIGHBOURS = 10  # background = median cosine to this many nearest memories of the speaker
MIN_BACKGROUND = 3  # no supersession with fewer older memories of the speaker than this
DEMOTE = 5  # recall's extra candidates: an older hit in conflict with a newer one can leave the k returned
SETTLE = 2  # places an older hit in conflict with a newer one moves down, after the newer moved before it
# recall's conflict check looks at this many first hits whatever k (the background's neighbours and the hit):
# a larger k looks further down only to fill the list, so recall(k=10)'s head settles like recall(k=3)'s
CHECKED = NEIGHBOURS + 1
CONSOLIDATED_KINDS = ("turn", "knowledge", "profile")  # tool results and trained entries are data: never merged
log = logging.getLogger(__name__)
T = TypeVar("T")


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def speaker_key(row: EntryRecord) -> tuple[str, str | None, str | None, str | None]:
    """Who said it: memories are only consolidated with the same speaker's (the user's vs the assistant's), and
    knowledge only within its knowledge version (a staged version never retires the stable one's entries)."""
    return (row.kind, row.speaker, row.role, row.kb_version if row.kind == "knowledge" else None)


@dataclass
class Neighbour:
    """An existing (or earlier in-batch) memory compared with a new one."""

    id: str
    cosine: float
    words: set[str]
    key: tuple[str, str | None, str | None, str | None]
    created_at: float
    vector: np.ndarray | None = None  # unit text vector (the pairwise model needs it)
    tokens: tuple[str, ...] = ()  # its normalised statement (statements.statement_tokens): equal ones merge
    session_id: str | None = None  # its conversation session: a newer turn of the same session never supersedes it
    sentences: int = 1  # how many sentences it has: only a one-sentence memory can be superseded
    asks: bool = False  # it only asks (statements.only_asks): it states no value, so no newer statement replaces it
    subject: str | None = None  # whom it is about (subjects.subject_of): another person's statement replaces none
    occasion: Occasion = Occasion()  # when it holds (statements.occasion_of): an exception replaces no rule


@dataclass
class Decision:
    """What to do with one new memory: merge into ``merge_into``, else store it and supersede ``supersedes``."""

    merge_into: str | None = None
    merge_reason: str | None = None
    supersedes: list[tuple[str, str]] = field(default_factory=list)  # (older id, reason)

    @property
    def event(self) -> str:
        """What the write does, in mem0's words: ``NOOP`` (merged), ``UPDATE`` (supersedes) or ``ADD``."""
        return "NOOP" if self.merge_into else "UPDATE" if self.supersedes else "ADD"


def decide(new_words: set[str], key: tuple[str, str | None, str | None, str | None], created_at: float,
           neighbours: Sequence[Neighbour], *, vector: np.ndarray | None = None,
           pairs: PairModel | None = None, tokens: tuple[str, ...] | None = None,
           session_id: str | None = None, asks: bool = False, replaces_nothing: bool = False,
           subject: str | None = None, occasion: Occasion = Occasion()) -> Decision:
    """The local rule for one new memory against its neighbours (any order; foreign speakers are ignored).

    Only the same statement merges: a neighbour whose ``tokens`` equal the new text's ``tokens`` (None: nothing
    merges). With ``pairs`` (and the new memory's unit text ``vector``) the pairwise model decides supersession; else
    the cosine rule does. Never a neighbour of the new memory's own conversation session (``session_id``; None: no
    session, every neighbour may be superseded): within a session a speaker elaborates on a topic, as recall's
    conflict check assumes too (REALTALK dev: 26 of the 54 turns the pairwise model superseded, 7 of the 11 that
    questions ask about, were followed up in their own session; docs/lifecycle.md). Never a neighbour of more than
    one ``sentences``: a newer statement replaces one fact, not every fact of a longer memory. Never by a memory
    that only ``asks`` (:func:`~agentmem.consolidate.statements.only_asks`): "Do I still live in Lyon?" states no
    value, so it replaces none (it may still merge with the same question asked before); nor is such a memory
    replaced: a statement answers a question, it does not make the user's having asked it stale. Nor by a memory
    that ``replaces_nothing`` (:func:`~agentmem.consolidate.statements.replaces_no_fact`): "I also speak German." is
    a second language, not a changed one, and "I'm thinking about moving to Berlin." changes nothing yet. Nor a
    neighbour about someone else (its ``subject`` and the new memory's differ,
    :func:`~agentmem.consolidate.subjects.subject_of`): "My mother was a data analyst." is not the user's job. Nor
    when one ``occasion`` is limited and the other names no days or seasons
    (:func:`~agentmem.consolidate.statements.narrows_to_an_occasion`: "On weekends I get around by ferry." and "I
    commute by bus."): an exception and the rule, neither changes the other."""
    mine = sorted((n for n in neighbours if n.key == key and n.created_at < created_at), key=lambda n: -n.cosine)
    if not mine:
        return Decision()
    same = next((n for n in mine if tokens is not None and n.tokens == tokens), None)
    if same is not None:
        return Decision(merge_into=same.id, merge_reason="the same statement again (equal after normalising case, "
                                                         "spacing and punctuation)")
    if asks or replaces_nothing:
        return Decision()

    def replaceable(n: Neighbour) -> bool:
        return ((session_id is None or n.session_id != session_id) and n.sentences <= 1 and not n.asks
                and not differ(n.subject, subject) and not exception_and_rule(n.occasion, occasion))

    if pairs is not None and vector is not None and all(n.vector is not None for n in mine):
        # every neighbour is the pair's background (the model's margin feature), only another session's is replaced
        scores = pairs.scores(vector, new_words, [n.vector for n in mine], [n.words for n in mine])
        return Decision(supersedes=[(n.id, f"replaced by a newer statement (pair score {s:.2f}, cosine "
                                           f"{n.cosine:.2f})") for n, s in zip(mine, scores)
                                    if s >= pairs.supersede and replaceable(n)])
    top = [n.cosine for n in mine[:NEIGHBOURS]]
    if len(top) < MIN_BACKGROUND:  # too few memories of this speaker to tell "unusually close" from "all alike"
        return Decision()
    background = float(np.median(top))
    out = Decision()
    for n in mine:
        if n.cosine >= SUPERSEDE and n.cosine - background >= MARGIN and replaceable(n):
            out.supersedes.append((n.id, f"replaced by a newer statement (cosine {n.cosine:.2f}, "
                                         f"speaker background {background:.2f})"))
    return out


class LocalConsolidator:
    """Plans merges and supersessions for a batch of new memories from the store's vector index and catalog.

    Candidates are found with the memory-line vectors of the index; they are compared by the embeddings of their
    bare texts (a line's "[when] Who:" head makes every pair of lines look alike). Text vectors are kept in a
    bounded cache keyed by entry id and version, and re-embedded on a miss.

    Args:
        query: ``(line vector, user_id, n, kind) -> [(id, cosine)]`` nearest stored memories of that user and kind.
        rows: ``ids -> [EntryRecord]`` catalog rows.
        text_of: the opened (decrypted) text of a row.
        embed: texts -> unit-normalisable vectors (the store's embedder).
        pairs: the pairwise supersession model (None: the cosine rule; for embedders it was not fitted for).
    """

    def __init__(self, query: Callable[[np.ndarray, str, int, str], list[tuple[str, float]]],
                 rows: Callable[[Sequence[str]], list[EntryRecord]], text_of: Callable[[EntryRecord], str],
                 embed: Callable[[list[str]], np.ndarray], cache_size: int = 50_000,
                 pairs: PairModel | None = None) -> None:
        self._query, self._rows, self._text_of, self._embed = query, rows, text_of, embed
        self.pairs = pairs
        self._cache: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._sentence_cache: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()  # rows stored without them
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def remember_vectors(self, rows: Sequence[EntryRecord], unit: np.ndarray) -> None:
        """Cache the text vectors of stored rows that carry none (written before schema 6 or without consolidation)."""
        with self._lock:
            for row, vec in zip(rows, unit):
                self._cache[(row.id, row.version or 1)] = vec
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def forget_erased(self, erasure: Erasure) -> None:
        """Drop the cached text vectors of erased entries (every version): an :meth:`AgentMemory.on_erase` listener,
        so an erased memory's vector leaves this process's memory with the entry, not when the cache turns over.

        Example:
            >>> c = LocalConsolidator(lambda *a: [], lambda ids: [], str, lambda t: np.ones((len(t), 2)))
            >>> row = EntryRecord(id="e1", user_id="u", kind="turn", text="", memory_text="", created_at=0.0, version=2)
            >>> c.remember_vectors([row], np.ones((1, 2)))
            >>> c.forget_erased(Erasure(action="forget", entry_ids=frozenset({"e1"}))); c.cached()
            0
        """
        if not erasure.entry_ids:
            return
        with self._lock:
            for cache in (self._cache, self._sentence_cache):
                for key in [k for k in cache if k[0] in erasure.entry_ids]:
                    del cache[key]

    def cached(self) -> int:
        """How many rows' vectors the caches hold (text vectors, and sentence vectors of rows stored without them)."""
        with self._lock:
            return len(self._cache) + len(self._sentence_cache)

    def attach_vectors(self, rows: Sequence[EntryRecord], unit: np.ndarray, texts: Sequence[str]) -> None:
        """Store each row's unit text vector on the row itself (float16, written with it), and for a text of
        several sentences its stated sentences' vectors (one embedding call for the batch), so a recall's conflict
        check in any process reads them instead of re-embedding the text (``update`` replaces both with the
        text's). ``texts`` are the rows' plain texts. Tool results and trained entries get no sentence vectors: the
        check of statements never reads them (:data:`CONSOLIDATED_KINDS`)."""
        judged = [t if r.kind in CONSOLIDATED_KINDS else None for r, t in zip(rows, texts)]
        for row, vec, sentence_vecs in zip(rows, unit, self.sentence_vectors(judged)):
            row.text_vector = pack_vector(vec)
            row.sentence_vectors = None if sentence_vecs is None else pack_vectors(sentence_vecs)

    def vector_fields(self, text: str, kind: str = "turn") -> dict[str, bytes | None]:
        """The row fields holding ``text``'s vectors (:meth:`attach_vectors`), for a new version of an entry of
        ``kind``.

        Example:
            >>> c = LocalConsolidator(lambda *a: [], lambda ids: [], str, lambda t: np.ones((len(t), 2)))
            >>> fields = c.vector_fields("Hi! I moved to Lyon. I love it here.")
            >>> len(fields["text_vector"]), len(fields["sentence_vectors"])   # two stated sentences, 2 x float16
            (4, 8)
            >>> c.vector_fields("Hi! I moved to Lyon. I love it here.", kind="tool")["sentence_vectors"] is None
            True
        """
        unit = self.text_vectors([text])[0]
        sentence_vecs = self.sentence_vectors([text if kind in CONSOLIDATED_KINDS else None])[0]
        return {"text_vector": pack_vector(unit),
                "sentence_vectors": None if sentence_vecs is None else pack_vectors(sentence_vecs)}

    def sentence_vectors(self, texts: Sequence[str | None]) -> list[np.ndarray | None]:
        """Per text of several sentences, the unit vectors of those that state something
        (:func:`~agentmem.consolidate.statements.stated_sentences`; no rows where none does), in one embedding call;
        None for a one-sentence text (its text vector stands for its one statement) and for a None text."""
        said = [stated_sentences(t) if t is not None and sentence_count(t) > 1 else None for t in texts]
        flat = [x for ss in said if ss for x in ss]
        unit = self.text_vectors(flat) if flat else np.zeros((0, 0), dtype=np.float32)
        out: list[np.ndarray | None] = []
        at = 0
        for ss in said:
            out.append(None if ss is None else unit[at : at + len(ss)])
            at += len(ss or ())
        return out

    def text_vectors(self, texts: Sequence[str]) -> np.ndarray:
        vecs = np.asarray(self._embed(list(texts)), dtype=np.float32)
        return vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)

    def plan(self, rows: Sequence[EntryRecord], texts: Sequence[str], vectors: np.ndarray,
             now: float) -> tuple[list[Decision], np.ndarray]:
        """One decision per new row (aligned with ``rows``) and the rows' text vectors (give the kept ones to
        :meth:`attach_vectors`, so they are written with the rows); ``texts`` are their plain texts, ``vectors``
        their memory-line vectors."""
        lines = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        unit = self.text_vectors(texts)
        words = [content_words(t) for t in texts]
        tokens = [statement_tokens(t) for t in texts]
        sentences = [sentence_count(t) for t in texts]  # once per text, not once per later text of the batch
        asks = [only_asks(t) for t in texts]
        quiet = [replaces_no_fact(t) for t in texts]  # says it adds, or speaks of a possibility
        subjects = [subject_of(t) for t in texts]
        occasions = [occasion_of(t) for t in texts]
        decisions: list[Decision] = []
        for i, row in enumerate(rows):
            if row.kind == "tool" and row.indexed is not False:  # data: replaced only by the same call's result
                decisions.append(self._repeated_call(row, lines[i], rows[:i], now))
                continue
            if row.kind not in CONSOLIDATED_KINDS or row.indexed is False:  # unindexed: stored exactly as given
                decisions.append(Decision())
                continue
            neighbours = self._stored_neighbours(row, lines[i], unit[i], now)
            for j in range(i):  # earlier entries of the batch that were kept
                if decisions[j].merge_into is None and rows[j].user_id == row.user_id:
                    neighbours.append(Neighbour(rows[j].id, float(unit[i] @ unit[j]), words[j],
                                                speaker_key(rows[j]), rows[j].created_at, unit[j], tokens[j],
                                                rows[j].session_id, sentences[j], asks[j], subjects[j],
                                                occasions[j]))
            decision = decide(words[i], speaker_key(row), row.created_at, neighbours, vector=unit[i],
                              pairs=self.pairs, tokens=tokens[i], session_id=row.session_id, asks=asks[i],
                              replaces_nothing=quiet[i], subject=subjects[i], occasion=occasions[i])
            if decision.merge_into is not None:
                # an in-batch duplicate of a duplicate merges into the stored original
                earlier = next((d for j, d in enumerate(decisions) if rows[j].id == decision.merge_into), None)
                if earlier is not None and earlier.merge_into is not None:
                    decision.merge_into = earlier.merge_into
            decisions.append(decision)
        return decisions, unit

    def _repeated_call(self, row: EntryRecord, line: np.ndarray, batch: Sequence[EntryRecord],
                       now: float) -> Decision:
        """A tool result supersedes the earlier results of the same call (:mod:`agentmem.consolidate.tool_calls`):
        those among its nearest stored tool results and the earlier rows of its batch."""
        text = self._text_of(row)
        if call_of(row, text) is None:
            return Decision()
        try:
            found = list(dict(self._query(line, row.user_id, 2 * NEIGHBOURS, row.kind)))
        except Exception:  # an index another process is rewriting: store this result as is (never fail the write)
            log.warning("consolidation skipped for entry %s: the vector index could not be queried", row.id)
            found = []
        stored = [r for r in self._rows(found) if r.status == ACTIVE and (r.expires_at is None or r.expires_at > now)]
        # only the same tool's results can be the same call: no other row's text is opened
        earlier = [(r, self._text_of(r)) for r in [*stored, *batch] if r.kind == "tool" and r.speaker == row.speaker]
        return Decision(supersedes=[(i, REPLACED) for i in replaced_results(row, text, earlier)])

    def _stored_neighbours(self, row: EntryRecord, line: np.ndarray, unit: np.ndarray, now: float) -> list[Neighbour]:
        try:
            found = dict(self._query(line, row.user_id, 2 * NEIGHBOURS, row.kind))
        except Exception:  # an index another process is rewriting: store this memory as is (never fail the write)
            log.warning("consolidation skipped for entry %s: the vector index could not be queried", row.id)
            return []
        key = speaker_key(row)
        rows = [r for r in self._rows(list(found)) if r.status == ACTIVE and speaker_key(r) == key
                and (r.expires_at is None or r.expires_at > now)]
        texts = [self._text_of(r) for r in rows]
        cached = self._vectors_of(rows, texts)
        return [Neighbour(r.id, float(unit @ v), content_words(t), key, r.created_at, v, statement_tokens(t),
                          r.session_id, sentence_count(t), only_asks(t), subject_of(t), occasion_of(t))
                for r, t, v in zip(rows, texts, cached)]

    def _vectors_of(self, rows: Sequence[EntryRecord], texts: Sequence[str]) -> list[np.ndarray]:
        """Unit text vectors of stored rows: from the cache, embedding (and caching) the misses."""
        with self._lock:
            cached = [unpack_vector(r.text_vector) if r.text_vector else self._cache.get((r.id, r.version or 1))
                      for r in rows]
        missing = [i for i, v in enumerate(cached) if v is None]
        if missing:
            fresh = self.text_vectors([texts[i] for i in missing])
            for i, vec in zip(missing, fresh):
                cached[i] = vec
            self.remember_vectors([rows[i] for i in missing], fresh)
        return cached  # type: ignore[return-value]

    def conflicts(self, rows: Sequence[EntryRecord], texts: Sequence[str], query: str = "",
                  query_vector: np.ndarray | None = None) -> set[tuple[str, str]]:
        """(older id, newer id) of recalled rows of one speaker that conflict: the pairwise model's score of the
        newer against the older (the other recalled rows of that speaker as background: at least 3 of them, as
        on write, else the model's prior) reaches its ``conflict`` threshold, or for an older row of several
        sentences its higher ``supersede`` one, the row taken whole or by the one sentence of it that the query is
        about, and the same for a newer row of several sentences against any older one (:meth:`_sentence_conflicts`;
        ``query_vector``: the query's unit vector, embedded here when None);
        without the model, a text cosine of at least ``CONFLICT``; never an older row of the newer's own session,
        nor one that only asks, nor by a newer one that asks, says it adds ("I also speak German.") or speaks of a
        possibility ("I'm thinking about moving to Berlin."), nor one about someone else
        (:func:`~agentmem.consolidate.subjects.subject_of`: "My mother was a data analyst." against "I work as a
        teacher."), nor when one is limited to an occasion and the other names no days or seasons ("On weekends I
        get around by ferry." and "I commute by bus."). Also, in any session, the newer restating the older with a
        value swapped (:func:`swapped_values`; the rest of the older is restated too, so its length does not
        matter), and a tool's newer result of the same call (:func:`~agentmem.consolidate.tool_calls.repeated_calls`).
        """
        if len(rows) < 2:
            return set()
        vecs = self._vectors_of(rows, texts)
        words = [content_words(t) for t in texts]
        keys = [speaker_key(r) for r in rows]  # once per row, not once per pair
        sentences = [sentence_count(t) for t in texts]
        asks = [only_asks(t) for t in texts]
        # a newer memory that asks, says it adds ("I also speak German.") or speaks of a possibility ("I might move
        # to Berlin.") replaces no older one
        quiet = [a or replaces_no_fact(t) for a, t in zip(asks, texts)]
        subjects = [subject_of(t) for t in texts]  # another person's statement changes none of the speaker's
        occasions = [occasion_of(t) for t in texts]  # an exception ("on weekends") and a rule change neither
        # statements only: tool results and trained entries are data, replaced only by a newer result of the
        # same call (a model of statements hid one account's balance behind another's)
        stated = {r.id for r in rows if r.kind in CONSOLIDATED_KINDS}
        out = {(a, b) for a, b in swapped_values(rows, texts, keys, query, asks=quiet) if a in stated and b in stated}
        out |= repeated_calls(rows, texts)
        @functools.cache
        def by_sentence() -> tuple[dict[int, list[set[str]]], dict[int, np.ndarray], dict[int, int | None]]:
            """Of the rows of several sentences: each stated sentence's words and vector, and which of them is
            nearest the query (None: no query); read (or embedded) once, and only when a pair needs them."""
            at = [a for a in range(len(rows))  # newer and older ones (statements: no tool result's sentences)
                  if sentences[a] > 1 and not asks[a] and rows[a].id in stated]
            asked = query_vector if query_vector is not None else self.text_vectors([query])[0] if query else None
            sentence_vecs = self._stated_vectors(rows, texts, at)
            nearest = {a: None if asked is None or not len(sentence_vecs[a]) else
                       int(np.argmax(sentence_vecs[a] @ asked)) for a in at}
            return {a: [content_words(x) for x in stated_sentences(texts[a])] for a in at}, sentence_vecs, nearest

        for b, row in enumerate(rows):
            if quiet[b] or row.id not in stated:
                continue  # a question states no value, an addition changes none: it demotes nothing (as on write)
            same = [a for a in range(len(rows)) if a != b and keys[a] == keys[b]]
            older = [a for a in same if _before(rows[a], row) and not differ(subjects[a], subjects[b])
                     and not exception_and_rule(occasions[a], occasions[b])]
            # the assistant's replies that restated the user's fact: weighed as the user's own older statements are
            said = [a for a in range(len(rows)) if echoes(rows[a], row) and _before(rows[a], row) and not asks[a]]
            out.update((rows[a].id, row.id) for a in self._echo_conflicts(b, said, same, vecs, words, sentences))
            if not older:
                continue
            if self.pairs is None:
                out.update((rows[a].id, row.id) for a in older
                           if float(vecs[a] @ vecs[b]) >= CONFLICT and not asks[a])
                continue
            scores = self.pairs.scores(vecs[b], words[b], [vecs[a] for a in same], [words[a] for a in same])
            # an older memory of several sentences states other facts, which demoting it pushes down the list: as a
            # whole, only a pair the model would supersede, were it one sentence (LoCoMo dev: both questions the
            # lower threshold cost were such turns it flagged; research/notes/consolidation-crossdataset.md); taken
            # whole or by the one sentence the newer replaces, when the query is about that sentence
            hit = [a for a, s in zip(same, scores) if a in older and sentences[a] <= 1 and s >= self.pairs.conflict
                   and not asks[a]]
            multi = {a: float(s) for a, s in zip(same, scores) if a in older and sentences[a] > 1 and not asks[a]}
            # a newer message of several sentences is weighed by each of its sentences too (at ``supersede``)
            single = ([a for a in older if sentences[a] <= 1 and not asks[a] and a not in hit]
                      if sentences[b] > 1 else [])
            if multi or single:
                hit += self._sentence_conflicts(b, multi, single, same, vecs, words, *by_sentence())
            out.update((rows[a].id, row.id) for a in hit)
        by_id = {r.id: r for r in rows}
        return {(a, b) for a, b in out if not one_document(by_id[a], by_id[b])}  # one text's parts stand together

    def _echo_conflicts(self, b: int, said: list[int], same: list[int], vecs: list[np.ndarray],
                        words: list[set[str]], sentences: list[int]) -> list[int]:
        """Of ``said``, the assistant's older replies (:func:`echoes`), those the user's newer statement ``b``
        replaces: each scored as if it were one of the user's own older statements, the user's other hits
        (``same``) as its background and the pairs among those scored as without it, at the pairwise model's
        ``conflict`` threshold (``supersede`` for a reply of several sentences, as for the user's own); without the
        model, a text cosine of at least ``CONFLICT``."""
        if self.pairs is None:
            return [a for a in said if float(vecs[a] @ vecs[b]) >= CONFLICT]
        olds, old_words = [vecs[x] for x in same], [words[x] for x in same]
        out = []
        for a in said:
            score = self.pairs.scores(vecs[b], words[b], [*olds, vecs[a]], [*old_words, words[a]])[-1]
            if score >= (self.pairs.conflict if sentences[a] <= 1 else self.pairs.supersede):
                out.append(a)
        return out

    def _stated_vectors(self, rows: Sequence[EntryRecord], texts: Sequence[str],
                        at: Sequence[int]) -> dict[int, np.ndarray]:
        """For the rows at positions ``at`` (texts of several sentences), their stated sentences' unit vectors: from
        the row (written with it), else the cache, else embedded (and cached: a row written before schema 10)."""
        out: dict[int, np.ndarray] = {}
        with self._lock:
            for i in at:
                blob = rows[i].sentence_vectors
                if blob is not None and rows[i].text_vector:
                    out[i] = unpack_vectors(blob, len(rows[i].text_vector) // 2)
                elif (cached := self._sentence_cache.get((rows[i].id, rows[i].version or 1))) is not None:
                    out[i] = cached
        missing = [i for i in at if i not in out]
        if missing:
            for i, vecs in zip(missing, self.sentence_vectors([texts[i] for i in missing])):
                out[i] = np.zeros((0, 0), dtype=np.float32) if vecs is None else vecs
            with self._lock:
                for i in missing:
                    self._sentence_cache[(rows[i].id, rows[i].version or 1)] = out[i]
                while len(self._sentence_cache) > self._cache_size:
                    self._sentence_cache.popitem(last=False)
        return out

    def _sentence_conflicts(self, b: int, multi: dict[int, float], single: list[int], same: list[int],
                            vecs: list[np.ndarray], words: list[set[str]], said: dict[int, list[set[str]]],
                            stated: dict[int, np.ndarray], nearest: dict[int, int | None]) -> list[int]:
        """The older rows the newer row ``b`` replaces when either side is a message of several sentences, at the
        pairwise model's ``supersede`` threshold (the score at which a one-sentence memory is superseded on write).

        ``multi``: older rows of several sentences, each mapped to ``b``'s score against it taken whole; ``single``:
        one-sentence older rows ``b`` taken whole did not reach ``conflict`` against (given when ``b`` has several
        sentences). Each pair is also scored sentence by sentence: ``b`` whole and its stated sentence nearest the
        query (none other: a message's other sentences are not what is asked, and on LoCoMo dev every sentence of
        it took more look-alikes) against every stated sentence of the older row (or the row whole when it has one
        sentence), that
        sentence's vector and words in the row's place, the speaker's other hits as background (``said``: each
        stated sentence's words, ``stated`` their vectors). An older row of several sentences counts only when its
        sentence in the best-scoring combination is also the one of the row nearest the query (``nearest``; None:
        any), so a message recalled for another of its facts is not demoted for this one ("What is my name?" and
        "Hi! My name is Dana. I take 20 mg of lisinopril." against "My doctor raised my lisinopril to 40 mg.").
        A message's vector dilutes each of its sentences: taken whole, such pairs rarely reach ``supersede``
        (``benchmarks/knowledge_update.py --natural --wrapped both``). The lower ``conflict`` threshold that two
        one-sentence memories get would take look-alike sentences too ("We drove to Lisbon last summer." against
        "Oh, I've been to Paris yesterday!" in a LoCoMo turn the question about cities visited needs)."""
        assert self.pairs is not None
        news = [(vecs[b], words[b])] + [(v, w) for n, (v, w) in enumerate(zip(stated.get(b, ()), said.get(b, ())))
                                        if nearest.get(b) in (None, n)]  # the newer's sentence the query is about
        split = [a for a in multi if len(stated[a])]  # the others state nothing but greetings and questions: whole
        old_matrix = np.asarray([vecs[x] for x in same], dtype=np.float32)
        # (older row, its sentence or None for the row whole) per candidate, in the order scored
        pieces = [(a, n) for a in split for n in range(len(stated[a]))]
        best: dict[int, tuple[float, int | None]] = {}  # per older row: its best combination's score and sentence
        for n_new, (new_vec, new_words) in enumerate(news):
            mine = pieces + ([(a, None) for a in single] if n_new else [])  # b whole against them: done already
            if not mine:
                continue
            candidates = np.stack([vecs[a] if n is None else stated[a][n] for a, n in mine])
            scores = self.pairs.scores_in_place(new_vec, new_words, old_matrix @ new_vec,
                                                [same.index(a) for a, _ in mine], candidates,
                                                [words[a] if n is None else said[a][n] for a, n in mine])
            for (a, n), score in zip(mine, scores):
                if score > best.get(a, (-np.inf, None))[0]:
                    best[a] = (float(score), n)
        cut = self.pairs.supersede
        out = [a for a, whole in multi.items() if a not in split and whole >= cut]  # nothing stated: the row whole
        out += [a for a in single if best.get(a, (-np.inf, None))[0] >= cut]
        out += [a for a in split if max(multi[a], best[a][0]) >= cut and nearest[a] in (None, best[a][1])]
        return out


def _before(older: EntryRecord, newer: EntryRecord) -> bool:
    """Whether recall's conflict check may put ``newer`` before ``older``: said earlier, and not within one
    conversation session (a speaker's turns of one session elaborate on a topic, LoCoMo: 3 of the 5 evidence turns the
    check demoted; a fact that changes does so between sessions, and write-time supersession still acts within one).
    """
    return older.created_at < newer.created_at and (newer.session_id is None or older.session_id != newer.session_id)


def echoes(older: EntryRecord, newer: EntryRecord) -> bool:
    """Whether recall's conflict check weighs ``older``, a turn of the assistant, against ``newer``, a statement of
    the user: an assistant's reply that restated what the user told it ("Got it, you take 20 mg of lisinopril.")
    stands for the user's fact, so the user's newer statement of another value ranks before it, as before the
    user's own older statement. Only that way round: the assistant's later word does not replace the user's (it
    may restate a value that is no longer true, or relay a tool's result, which is the tool's to state).

    Example:
        >>> said = EntryRecord(id="a", user_id="u1", kind="turn", role="assistant", text="", memory_text="",
        ...                    created_at=1)
        >>> update = EntryRecord(id="b", user_id="u1", kind="turn", role="user", text="", memory_text="", created_at=2)
        >>> echoes(said, update), echoes(update, said)
        (True, False)
    """
    return older.role == "assistant" and newer.role == "user" and older.kind == newer.kind


def swapped_values(rows: Sequence[EntryRecord], texts: Sequence[str], keys: Sequence[tuple],
                   query: str = "", asks: Sequence[bool] | None = None) -> set[tuple[str, str]]:
    """(older id, newer id) of rows of one speaker where the newer restates the older with a value swapped ("I
    take 5 mg ..." / "I take 10 mg ..."): the newer is the current value, whatever the session. Not when ``query``
    names the older value and not the newer ("is my PIN still 4821?" asks about that one), nor when the newer only
    asks, says it adds or speaks of a possibility (``asks[b]``: :func:`~agentmem.consolidate.statements.only_asks`,
    :func:`~agentmem.consolidate.statements.replaces_no_fact`; None: none does).

    >>> rows = [EntryRecord(id=i, user_id="u", kind="turn", text="", memory_text="", created_at=t)
    ...         for i, t in (("a", 1.0), ("b", 2.0))]
    >>> swapped_values(rows, ["My PIN is 4821.", "My PIN is 4822."], [("k",), ("k",)])
    {('a', 'b')}
    >>> swapped_values(rows, ["My PIN is 4821.", "My PIN is 4822."], [("k",), ("k",)], "is it still 4821?")
    set()
    """
    tokens = [statement_tokens(t) for t in texts]
    asked = set(statement_tokens(query))
    out: set[tuple[str, str]] = set()
    for b, newer in enumerate(rows):
        if asks is not None and asks[b]:
            continue
        for a, older in enumerate(rows):
            if a == b or keys[a] != keys[b] or older.created_at >= newer.created_at:
                continue
            span = changed_span(tokens[a], tokens[b])
            if span is not None and not (asked & set(span[0]) and not asked & set(span[1])):
                out.add((older.id, newer.id))
    return out


def demotion_pool(k: int) -> int:
    """How many hits recall's conflict check looks at to return ``k``: ``DEMOTE`` more than ``k``, and at least
    ``NEIGHBOURS + 1``, so that a hit's background (the median cosine to the other recalled memories of the
    speaker) is taken over as many neighbours as the pairwise model's background on write. With fewer (k = 3: 8
    hits), the background was a median over 7 and the same pair scored differently with one more hit recalled.

    >>> demotion_pool(3), demotion_pool(10)
    (11, 15)
    """
    return max(k + DEMOTE, NEIGHBOURS + 1)


def demote_older(items: Sequence[T], *, ident: Callable[[T], str], conflicts: set[tuple[str, str]],
                 drop: bool = False, mounted: Callable[[T], bool] | None = None) -> list[T]:
    """Newer first: for every conflicting pair (``(older id, newer id)`` in ``conflicts``) where the older ranks
    above the newer, the newer moves to just before it; then each older item moves ``SETTLE`` places further down
    (far enough to leave a top 3 from the first place). Other items keep their order.

    With ``drop`` (a mount: the model would read both values) an older item whose newer one is among ``items`` is
    left out instead. ``mounted`` (a mount with a threshold: whether an item's score reaches it) also applies the
    threshold, and a newer item under it takes the place of the older one it contradicts, whatever its own score,
    as a superseded memory hands its place to the one that replaced it (:mod:`agentmem.entries.versions`): an
    update is often worded unlike the question ("I quit Google last week." scores 0.10 for "Where do I work?",
    "I got promoted, I'm a teacher now." 0.35), and before the mount then held no statement of the thing at all,
    neither the older (contradicted) nor the newer (under the threshold) (``benchmarks/knowledge_update.py
    --natural``).

    Moving the older only a few places (instead of behind every candidate, as before) is what keeps LoCoMo
    recall@10 at the level without consolidation: a topic-sharing turn the pairwise model takes for a conflict
    stays within the ten returned (docs/lifecycle.md).

    >>> demote_older(["old", "x", "new", "y", "z"], ident=lambda r: r, conflicts={("old", "new")})
    ['new', 'x', 'y', 'old', 'z']
    >>> demote_older(["old", "x", "new"], ident=lambda r: r, conflicts={("old", "new")}, drop=True)
    ['x', 'new']
    >>> demote_older(["old", "x", "new", "low"], ident=lambda r: r, conflicts={("old", "new")}, drop=True,
    ...              mounted=lambda r: r not in ("new", "low"))   # the newer is under the threshold
    ['new', 'x']
    """
    if drop:
        return _mount_settled(items, ident, conflicts, mounted or (lambda item: True))
    order = list(items)
    pos = {ident(i): n for n, i in enumerate(order)}
    # pairs in rank order (older, then newer): of several newer items in conflict with one older, the best ranked
    # moves first and stays ahead of the others
    for older, newer in sorted(conflicts, key=lambda p: (pos.get(p[0], len(pos)), pos.get(p[1], len(pos)))):
        at = [ident(i) for i in order]
        if older in at and newer in at and at.index(older) < at.index(newer):
            order.insert(at.index(older), order.pop(at.index(newer)))
    demoted = {a for a, _ in conflicts}
    return moved_down(order, lambda item: ident(item) in demoted)


def moved_down(items: Sequence[T], off: Callable[[T], bool], places: int = SETTLE) -> list[T]:
    """``items`` with each one ``off`` moved ``places`` down, the others keeping their order: how
    :func:`demote_older` settles a contradicted hit, and recall's step for a hit surely about someone else than the
    query asks about (:class:`~agentmem.consolidate.store_parts.ConflictDemotion`). Only a few places: "Do I have
    family in Berlin?" is about the speaker and "My sister lives in Berlin." answers it.

    >>> moved_down(["sister's", "mine", "tea", "x"], off=lambda t: t == "sister's")
    ['mine', 'tea', "sister's", 'x']
    """
    order = list(items)
    for item in [i for i in order if off(i)][::-1]:  # the lowest first, so each moves past the items it would alone
        n = order.index(item)
        order.insert(min(len(order) - 1, n + places), order.pop(n))
    return order


def _mount_settled(items: Sequence[T], ident: Callable[[T], str], conflicts: set[tuple[str, str]],
                   mounted: Callable[[T], bool]) -> list[T]:
    """:func:`demote_older`'s ``drop``: what a mount takes, in order."""
    taken = {ident(i) for i in items if mounted(i)}
    replaced = {older for older, newer in conflicts if newer in taken}  # by a newer memory the mount holds
    # older id -> its newer ids under the threshold: they take its place (only where no mounted one replaces it)
    heirs: dict[str, list[str]] = {}
    for older, newer in sorted(conflicts):
        if older in taken and older not in replaced and newer not in taken:
            heirs.setdefault(older, []).append(newer)
    contradicted = replaced | set(heirs)
    by_id = {ident(i): i for i in items}
    out: list[T] = []
    emitted: set[str] = set()
    for item in items:
        key = ident(item)
        for newer in heirs.get(key, []):
            if newer not in emitted and newer not in contradicted:
                out.append(by_id[newer])
                emitted.add(newer)
        if key in taken and key not in contradicted and key not in emitted:
            out.append(item)
            emitted.add(key)
    return out


@dataclass
class Applied:
    """What :func:`apply_decisions` did: counts by outcome (``merged``, ``superseded``), per new row the older ids it
    superseded, and the positions of merges whose target was gone by then (those rows must be stored after all)."""

    counts: Counter
    superseded: list[tuple[str, ...]]
    unmerged: list[int]


def apply_decisions(lifecycle: Lifecycle, rows_of: Callable[[Sequence[str]], list[EntryRecord]],
                    new_rows: Sequence[EntryRecord], texts: Sequence[str], decisions: Sequence[Decision], *,
                    seal: Callable[[str, str], str], open_text: Callable[[EntryRecord], str], now: float) -> Applied:
    """Record merges (on the existing entry) and supersessions (on the older entry) once the new rows are stored.

    ``seal(entry_id, text)`` seals a history text. A merge whose target was erased (or a supersession of an entry
    no longer active) meanwhile is not recorded: the caller stores a row whose merge did not land.
    """
    targets = {d.merge_into for d in decisions if d.merge_into} | {i for d in decisions for i, _ in d.supersedes}
    current = {r.id: r for r in rows_of(sorted(targets))}
    out = Applied(Counter(), [], [])
    for n, (row, text, d) in enumerate(zip(new_rows, texts, decisions)):
        if d.merge_into:
            target = current.get(d.merge_into)
            event = None if target is None else HistoryEvent(target.id, target.version or 1, "merge",
                                                             seal(target.id, text), now, d.merge_reason)
            if event is not None and lifecycle.apply_event(event):
                out.counts["merged"] += 1
            else:
                out.unmerged.append(n)
        done = []
        for old_id, reason in d.supersedes:
            old = current.get(old_id)
            if old is None:
                continue
            event = HistoryEvent(old_id, old.version or 1, "supersede", seal(old_id, open_text(old)), now, reason,
                                 related_id=row.id)
            if lifecycle.apply_event(event):
                done.append(old_id)
        out.counts["superseded"] += len(done)
        out.superseded.append(tuple(done))
    return out


__all__ = ["CHECKED", "CONSOLIDATED_KINDS", "DEMOTE", "SETTLE", "Applied", "Decision", "LocalConsolidator",
           "Neighbour", "apply_decisions", "decide", "demote_older", "demotion_pool", "jaccard", "moved_down",
           "swapped_values"]
