"""Recall-time consolidation: a superseded hit stands for the entry that replaced it; the public switches of both
recall steps (agentmem/entries/versions.py)."""

from __future__ import annotations

import pytest

import time
from pathlib import Path

from agentmem import AgentMemory
from agentmem.entries.store import Scope
from agentmem.entries.lifecycle import DELETED, SUPERSEDED, HistoryEvent

# the facade on the SQLite file and on the in-process catalog written against the port alone (tests/conftest.py)
pytestmark = pytest.mark.catalogs(None, "memory")

QUERY = "What is my favorite food?"


def _supersede(mem: AgentMemory, old_id: str, new_id: str | None, status: str = SUPERSEDED) -> None:
    """Mark ``old_id`` replaced (or retracted) the way consolidation does, whatever the pairwise model says."""
    event = HistoryEvent(old_id, 1, "supersede" if status == SUPERSEDED else "delete", "", time.time(), "test",
                         related_id=new_id)
    assert mem._store.lifecycle.apply_event(event)


def _food(mem: AgentMemory) -> tuple[str, str, str]:
    """An old statement in the question's wording, a look-alike that matches it too, an update worded otherwise."""
    old = mem.remember("My favorite food is sushi.", user_id="u1", role="user").id
    for text in ("The weather was lovely this weekend.", "I need to buy more coffee filters.",
                 "My husband's favorite food is falafel.", "The train was delayed this morning."):
        mem.remember(text, user_id="u1", role="user")
    new = mem.remember("risotto is my favourite food now.", user_id="u1", role="user").id
    alike = next(r.id for r in mem.list(user_id="u1") if "husband" in r.text)
    return old, alike, new


def test_a_superseded_hit_hands_its_place_to_its_successor(tmp_path: Path) -> None:
    for follow in (True, False):
        with AgentMemory(tmp_path / f"s{follow}", recall_follows_versions=follow,
                         recall_conflict_demotion=False) as mem:
            old, alike, new = _food(mem)
            if mem.get(old).status != SUPERSEDED:
                _supersede(mem, old, new)
            raw = [s.row.id for s in mem._store.search(QUERY, Scope("u1", include_superseded=True), k=6)]
            assert raw.index(old) < raw.index(alike) < raw.index(new)  # the wording ranks the stale one first
            hits = [h.id for h in mem.recall(QUERY, user_id="u1", k=3)]
            assert old not in hits
            if follow:  # the update takes the old statement's place, once
                assert hits[0] == new and hits.count(new) == 1 and hits[1] == alike
            else:
                assert hits.index(alike) < hits.index(new)
            # asked for the superseded ones, recall shows them as they are
            shown = [h.id for h in mem.recall(QUERY, user_id="u1", k=6, include_superseded=True)]
            assert old in shown and shown.index(old) < shown.index(new)


def test_a_chain_of_updates_leads_to_the_current_version_and_retracted_ones_are_dropped(mem: AgentMemory) -> None:
    a = mem.remember("My favorite food is sushi.", user_id="u1").id
    mem.remember("The weather was lovely this weekend.", user_id="u1")
    b = mem.remember("Pizza margherita, honestly.", user_id="u1").id
    c = mem.remember("Lately I mostly crave ramen.", user_id="u1").id
    for old, new in ((a, b), (b, c)):
        if mem.get(old).status != SUPERSEDED:
            _supersede(mem, old, new)
    hits = [h.id for h in mem.recall(QUERY, user_id="u1", k=2)]
    assert hits[0] == c and a not in hits and b not in hits
    _supersede(mem, c, None, DELETED)  # the current version retracted: nothing stands for the chain
    assert {a, b, c}.isdisjoint(h.id for h in mem.recall(QUERY, user_id="u1", k=3))


def test_a_successor_outside_the_recall_scope_is_not_returned(mem: AgentMemory) -> None:
    old = mem.remember("My favorite food is sushi.", user_id="u1", tags=["food"]).id
    new = mem.remember("risotto is my favourite food now.", user_id="u1").id  # not tagged "food"
    if mem.get(old).status != SUPERSEDED:
        _supersede(mem, old, new)
    assert [h.id for h in mem.recall(QUERY, user_id="u1", k=2, tags=["food"])] == []
    assert new in [h.id for h in mem.recall(QUERY, user_id="u1", k=2)]


def test_recall_conflict_demotion_is_a_public_switch(tmp_path: Path) -> None:
    texts = ("I live in Lyon.", "The weather was lovely this weekend.", "Actually I moved to Paris last month.")
    for demote in (True, False):
        with AgentMemory(tmp_path / f"s{demote}", recall_conflict_demotion=demote) as mem:
            # without consolidation on write, so the conflict is left to recall
            lyon, _, paris = (r.id for r in mem.remember_many([{"text": t, "user_id": "u1"} for t in texts],
                                                              consolidate=False))
            raw = [s.row.id for s in mem._store.search("where do I live?", Scope("u1"), k=3)]
            hits = [h.id for h in mem.recall("where do I live?", user_id="u1", k=3)]
            assert raw.index(lyon) < raw.index(paris)  # the store ranks the old wording first
            if demote:  # on (the default): the newer statement first
                assert hits[0] == paris and hits.index(paris) < hits.index(lyon)
            else:  # off: the store's ranking, untouched
                assert hits == raw


def test_turns_of_one_session_are_not_settled_as_conflicts_at_recall(tmp_path: Path) -> None:
    texts = ("I live in Lyon.", "The weather was lovely this weekend.", "Actually I moved to Paris last month.")
    for sessions in (("s1", "s1", "s1"), ("s1", "s1", "s2")):
        with AgentMemory(tmp_path / "-".join(sessions)) as mem:
            lyon, _, paris = (r.id for r in mem.remember_many(
                [{"text": t, "user_id": "u1", "session_id": s} for t, s in zip(texts, sessions)], consolidate=False))
            assert mem.get(lyon).status == "active"
            raw = [s.row.id for s in mem._store.search("where do I live?", Scope("u1"), k=3)]
            hits = [h.id for h in mem.recall("where do I live?", user_id="u1", k=3)]
            assert raw.index(lyon) < raw.index(paris)
            if sessions[0] == sessions[2]:  # one session: an elaboration, not a change; the store's ranking stands
                assert hits == raw
            else:  # a later session restates the fact: the newer first
                assert hits[0] == paris


def test_chain_ends_resolves_whole_chains_in_one_query(mem: AgentMemory) -> None:
    ids = [mem.remember(t, user_id="u1").id for t in ("alpha one", "bravo two", "charlie three", "delta four",
                                                      "echo five")]
    for old, new in zip(ids, ids[1:]):  # a -> b -> c -> d -> e
        if mem.get(old).status != SUPERSEDED:
            _supersede(mem, old, new)
    life = mem._store.lifecycle
    assert life.chain_ends(ids) == {i: ids[-1] for i in ids[:-1]}  # the active end is left out as an origin
    assert life.chain_ends(ids[:1], longest=2) == {ids[0]: ids[2]}  # cut after 2 links: ends on a superseded one
    assert life.chain_ends([]) == {} and life.chain_ends(["no-such-id"]) == {}


def test_recall_through_a_long_chain_searches_once_and_reads_the_catalog_twice(mem: AgentMemory) -> None:
    # one candidate search per recall, and the rows of a page come with their successors in one read, however long
    # the chains (session 3 read the catalog once per link and searched a second time when versions took places)
    texts = ["My favorite food is sushi.", "My favorite food is pizza.", "My favorite food is ramen.",
             "My favorite food is tacos.", "My favorite food is paella.", "My favorite food is curry."]
    ids = [mem.remember(t, user_id="u1", session_id=f"s{n}").id for n, t in enumerate(texts)]
    for text in ("The weather was lovely this weekend.", "I need to buy more coffee filters."):
        mem.remember(text, user_id="u1")
    for old, new in zip(ids, ids[1:]):
        if mem.get(old).status != SUPERSEDED:
            _supersede(mem, old, new)
    store, calls = mem._store, {"get": 0, "candidates": 0}

    def counted(name: str, fn):  # noqa: ANN001, ANN202 - a thin call counter around the real method
        def wrapper(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            calls[name] += 1
            return fn(*a, **kw)
        return wrapper

    store.catalog.get = counted("get", store.catalog.get)  # type: ignore[method-assign]
    store.candidates = counted("candidates", store.candidates)  # type: ignore[method-assign]
    hits = [h.id for h in mem.recall(QUERY, user_id="u1", k=3)]
    assert hits[0] == ids[-1] and not set(ids[:-1]) & set(hits)
    assert calls == {"get": 1, "candidates": 1}  # a page's rows and their successors in one catalog read



def test_an_older_memory_of_several_sentences_needs_a_strong_conflict_to_be_demoted(tmp_path: Path) -> None:
    """A memory of several sentences states other facts, which demoting it pushes down the list: recall's conflict
    check demotes it only at the pairwise model's ``supersede`` threshold, not its lower ``conflict`` one (LoCoMo
    dev: both questions the demotion cost were such turns; this is one of them, its evidence the Paris trip). A
    strong conflict still puts the newer first (test_consolidation_events:
    test_only_a_one_sentence_memory_is_superseded)."""
    from agentmem.consolidate.local import CHECKED
    from agentmem.text import content_words
    older = ("Hey Gina! Thanks for asking. I'm on the hunt for the ideal spot for my dance studio and it's been quite "
             "a journey! I've been looking at different places and picturing how the space would look. I even found a "
             "place with great natural light! Oh, I've been to Paris yesterday! It was sooo cool.")
    others = ["I flew to Berlin for a dance festival.", "Rome was packed with tourists when I went.",
              "I spent a weekend in Madrid with my cousins.", "We drove to Lisbon last summer.",
              "Dancing has always been my passion.", "I practiced a new routine this morning.",
              "My dance crew is performing next week.", "I love teaching dance classes to kids."]  # the background
    newer = ("Searching for a dance studio location has been tricky, but I'm determined to find the right spot - when "
             "I do, I'm sure the rest will follow!")
    query = "Which cities has Jon visited?"
    with AgentMemory(tmp_path / "s") as mem:
        ids = [mem.remember(t, user_id="u1", session_id=f"s{n}", speaker="Jon", kind="turn").id
               for n, t in enumerate([older, *others, newer])]
        found = mem._store.search(query, Scope("u1"), k=CHECKED, follow_versions=True)
        raw = [s.row.id for s in found]
        hits = [h.id for h in mem.recall(query, user_id="u1", k=5)]
        # the case: the older ranks first, and the model scores the pair between its two thresholds
        texts = [s.row.text for s in found]
        vecs = mem._consolidator._vectors_of([s.row for s in found], texts)
        new_at, same = raw.index(ids[-1]), [n for n in range(len(raw)) if raw[n] != ids[-1]]
        pairs = mem._consolidator.pairs
        score = pairs.scores(vecs[new_at], content_words(texts[new_at]), [vecs[n] for n in same],
                             [content_words(texts[n]) for n in same])[same.index(raw.index(ids[0]))]
        assert raw.index(ids[0]) < raw.index(ids[-1]) and pairs.conflict <= score < pairs.supersede
        assert hits == raw[:5]  # the store's ranking stands: the Paris turn is not pushed down


def test_the_conflict_check_settles_the_same_head_whatever_k(tmp_path: Path) -> None:
    """recall(k=10) looks 15 deep to fill its list, but only the first CHECKED hits are checked for conflicts, as
    for recall(k=5): a restatement from the bottom of the pool no longer pulls itself over the evidence above it
    (LoCoMo's "Which cities has Jon visited?" lost its evidence that way)."""
    from agentmem.consolidate.local import CHECKED

    old = "I'm on the hunt for the ideal spot for my dance studio, so I visited Paris and Rome to look around."
    trips = ["I flew to Berlin for a dance festival.", "Rome was packed with tourists when I went.",
             "I spent a weekend in Madrid with my cousins.", "Vienna has the most beautiful concert halls I have seen.",
             "We drove to Lisbon last summer.", "I took the night train to Prague.", "Amsterdam is full of bikes.",
             "I went to Tokyo for work once.", "My trip to New York was exhausting.",
             "Barcelona's beaches were crowded.", "I stopped in Munich on the way home.", "I visited my aunt in Dublin.",
             "Athens was very hot in August.", "I saw the fjords near Bergen.", "Florence had the best gelato.",
             "I spent a rainy week in Edinburgh.", "Zurich was spotless when I visited.",
             "I walked all over Budapest in spring.", "Copenhagen was colder than I expected.",
             "I went to Oslo for a wedding.", "I visited Seville for the flamenco.",
             "Krakow's old town was lovely when I visited.", "I toured Milan's design week.",
             "I saw the canals of Venice last year.", "I visited friends in Brussels.",
             "Porto was my favourite city on that trip.", "I visited the museums of Stockholm.",
             "Naples had the best pizza I have eaten.", "I hiked above Salzburg for a day.",
             "The cathedral in Cologne took my breath away.", "I took a boat tour in Hamburg.",
             "Valencia was sunny all week."]  # enough trips that the later turn ranks below the checked head
    new = "I found a spot for the dance studio downtown."  # ("might" would make it a possibility: no conflict)
    query = "Which cities have I visited?"
    with AgentMemory(tmp_path / "s") as mem:
        ids = [mem.remember(t, user_id="u1", session_id=f"s{n}", speaker="Jon", kind="turn").id
               for n, t in enumerate([old, *trips, new])]
        found = mem._store.search(query, Scope("u1"), k=15, follow_versions=True)
        order = [s.row.id for s in found]
        # the case: the pairwise model takes the later turn for a newer statement of the first one, and it ranks
        # below the checked head while the first ranks in it
        assert (ids[0], ids[-1]) in mem._consolidator.conflicts([s.row for s in found], [s.row.text for s in found])
        assert order.index(ids[0]) < 5 and order.index(ids[-1]) >= CHECKED
        deep = [h.id for h in mem.recall(query, user_id="u1", k=10)]
        assert deep[:5] == order[:5]  # nothing pulled up from below the head
        for k in (1, 3, 5):
            assert [h.id for h in mem.recall(query, user_id="u1", k=k)] == deep[:k]
