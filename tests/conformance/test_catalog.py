"""One conformance suite for every Catalog: SQLite (a file under tmp) and PostgreSQL (a real server, fresh database).

Server-backed params get their server from the session-scoped fixtures of tests/servers.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentmem.ports import Catalog
from agentmem.ports.catalog import CatalogScope, EntryRecord
from agentmem.backends.sqlite.catalog import SqliteCatalog
from agentmem.backends.sqlite.schema import SCHEMA_VERSION

BACKENDS = ["sqlite", "postgres", "memory"]


def make_catalog(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Catalog:
    if kind == "sqlite":
        return SqliteCatalog(str(tmp_path / "catalog.db"))
    if kind == "memory":  # the in-process catalog, written against the port alone (agentmem/backends/memory_catalog.py)
        from agentmem.backends.memory_catalog import MemoryCatalog

        return MemoryCatalog()
    from agentmem.backends.postgres import PostgresCatalog

    return PostgresCatalog(request.getfixturevalue("fresh_postgres_url"))


@pytest.fixture(params=BACKENDS)
def cat(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Catalog]:
    c = make_catalog(request.param, request, tmp_path)
    yield c
    c.close()


def _is_memory(cat: Catalog) -> bool:
    from agentmem.backends.memory_catalog import MemoryCatalog

    return isinstance(cat, MemoryCatalog)


def _row(entry_id: str, user: str = "u", text: str = "t", *, session: str | None = None, at: float = 0.0,
         kind: str = "turn", expires: float | None = None) -> EntryRecord:
    return EntryRecord(id=entry_id, user_id=user, session_id=session, kind=kind, text=text, memory_text=text,
                    created_at=at, expires_at=expires, metadata_json={})


def _add(cat: Catalog, rows: list[EntryRecord], tags=(), pending: bool = False) -> None:
    for row, tag_list in zip(rows, tags):
        row.tags = tuple(tag_list)
    cat.insert(rows, index_texts=[r.text for r in rows], pending=pending)


def _ids(cat: Catalog, scope: CatalogScope) -> list[str]:
    return [i for page in cat.iter_ids(scope, page_size=1) for i in page]


def test_is_a_catalog_and_keeps_store_facts(cat: Catalog) -> None:
    assert isinstance(cat, Catalog)
    if not _is_memory(cat):  # the SQL catalogs migrate their schema on open
        assert cat.infos(["schema_version"]) == {"schema_version": str(SCHEMA_VERSION)}
    cat.set_info("kb_version", "v1")
    cat.set_info("kb_version", "v2")
    assert cat.infos(["kb_version", "nothing"]) == {"kb_version": "v2"}


def test_rows_round_trip_in_the_order_asked(cat: Catalog) -> None:
    _add(cat, [_row("a", text="alpha", at=1.0), _row("b", text="beta", at=2.0)], tags=[["x", "y"], []])
    got = cat.get(["b", "missing", "a"])
    assert [r.id for r in got] == ["b", "a"]
    assert got[1].tags == ("x", "y") and got[1].text == "alpha" and got[1].metadata_json == {}
    assert [r.id for r in cat.get(["a", "zz"])] == ["a"]


def test_get_returns_every_field_as_written(cat: Catalog) -> None:
    """get() gives back plain records with every field the insert carried (tags sorted, each once), in the order
    asked, over more ids than one SQL chunk; in-flight and missing ids are skipped."""
    from dataclasses import fields

    rows = [_row(f"r{i}", text=f"text {i}", session=f"s{i % 2}", at=float(i)) for i in range(6)]
    rows[1].metadata_json, rows[2].speaker, rows[3].text_vector = {"n": [1, {"x": "y"}]}, "Ann", b"\x00\x01"
    rows[5].kv_path, rows[5].kv_tokens, rows[5].version, rows[5].seen_count = "kv/r5", 12, 3, 2
    _add(cat, rows, tags=[["b", "a"], [], ["c", "c"], [], ["z", "y", "x"], []])
    _add(cat, [_row("hidden", text="in flight")], pending=True)
    wanted = ["r4", "hidden", "missing", "r1", "r0", "r2", "r3", "r5"] + [f"pad{i}" for i in range(600)]  # 2 chunks
    got = cat.get(wanted)
    assert [r.id for r in got] == ["r4", "r1", "r0", "r2", "r3", "r5"]
    written = {r.id: r for r in rows}
    names = [f.name for f in fields(EntryRecord) if f.name != "tags"]
    for record in got:
        assert isinstance(record, EntryRecord)
        assert {k: getattr(record, k) for k in names} == {k: getattr(written[record.id], k) for k in names}
        assert record.tags == tuple(sorted(set(written[record.id].tags)))
    assert got[0].tags == ("x", "y", "z") and got[3].tags == ("c",) and got[1].metadata_json == {"n": [1, {"x": "y"}]}
    assert got[4].text_vector == b"\x00\x01" and got[3].speaker == "Ann" and cat.get([]) == []


def test_a_record_read_back_is_a_copy(cat: Catalog) -> None:
    """Changing a record the catalog returned (or one it was given) writes nothing: writes go through its methods."""
    row = _row("a", text="kept")
    _add(cat, [row], tags=[["t"]])
    row.text = "changed after insert"
    got = cat.get(["a"])[0]
    got.text, got.tags, got.metadata_json["x"] = "changed after get", ("u",), 1
    again = cat.get(["a"])[0]
    assert (again.text, again.tags, again.metadata_json) == ("kept", ("t",), {})


def test_pending_rows_are_invisible_until_committed(cat: Catalog) -> None:
    _add(cat, [_row("p", text="pending kayak", expires=time.time() + 3600)], pending=True)
    assert cat.get(["p"]) == [] and _ids(cat, CatalogScope(expired_by=float("inf"))) == []
    assert cat.list_entries(CatalogScope(user_id="u")) == []
    assert [r.id for r in cat.pending(time.time() + 1)] == ["p"]
    assert cat.pending(time.time() - 3600) == []  # recorded just now: not older than an hour
    cat.commit(["p"])
    assert [r.id for r in cat.get(["p"])] == ["p"] and cat.pending(time.time() + 1) == []
    assert _ids(cat, CatalogScope(expired_by=float("inf"))) == ["p"]


def test_deletion_is_marked_then_finished(cat: Catalog) -> None:
    _add(cat, [_row("a", text="red kayak"), _row("b", text="blue kayak")])
    marked = cat.mark_deleting(["a", "missing"])
    assert [r.id for r in marked] == ["a"]
    assert [r.id for r in cat.get(["a", "b"])] == ["b"]  # hidden at once
    assert [r.write_state for r in cat.pending(time.time() + 1)] == ["deleting"]
    assert [r.id for r in cat.delete(["a"])] == ["a"]
    assert cat.pending(time.time() + 1) == [] and cat.delete(["a"]) == []
    assert [i for i, _ in cat.lexical_search("kayak", user_id="u", limit=5)] == ["b"]


def test_a_blob_write_is_marked_then_ended_by_set_kv(cat: Catalog) -> None:
    _add(cat, [_row("a")])
    _add(cat, [_row("p")], pending=True)
    assert cat.set_kv("a", None) and not cat.set_kv("missing", None) and not cat.set_kv("p", None)
    assert not cat.set_kv("a", None, version=2)  # the blob was made from another version's text
    assert sorted(r.id for r in cat.pending(time.time() + 1)) == ["a", "p"]
    assert [r.id for r in cat.get(["a"])] == ["a"]  # a blob write does not hide the row
    assert cat.set_kv("a", {"kv_path": "kv/a.kv", "kv_tokens": 3}) and not cat.set_kv("missing", {})
    assert [r.id for r in cat.pending(time.time() + 1)] == ["p"]
    assert (cat.get(["a"])[0].kv_path, cat.get(["a"])[0].kv_tokens) == ("kv/a.kv", 3)
    with pytest.raises(ValueError, match="text"):
        cat.set_kv("a", {"text": "not a KV field"})
    assert cat.get(["a"])[0].text == "t"


def test_change_token_moves_on_every_write(cat: Catalog) -> None:
    if _is_memory(cat):
        pytest.skip("the SQL catalogs' own change counter (not a port method: nothing in the store reads it)")
    t0 = cat.change_token()
    _add(cat, [_row("a")], pending=True)
    t1 = cat.change_token()
    cat.commit(["a"])
    t2 = cat.change_token()
    cat.delete(["a"])
    assert t0 != t1 != t2 != cat.change_token()


def test_scopes_tags_kinds_sessions_and_expiry(cat: Catalog) -> None:
    now = time.time()
    _add(cat, [_row("a", session="s1", at=1.0), _row("b", session="s2", at=2.0, kind="fact"),
               _row("c", session="s1", at=3.0, expires=now - 1), _row("d", user="v", at=4.0)],
         tags=[["t1", "t2"], ["t1"], [], []])
    ids = lambda q: _ids(cat, q)  # noqa: E731
    assert ids(CatalogScope(user_id="u")) == ["a", "b", "c"]
    assert ids(CatalogScope(user_id="u", tags=["t1", "t2"])) == ["a"]
    assert ids(CatalogScope(user_id="u", kinds=["fact"])) == ["b"]
    assert ids(CatalogScope(session_id="s1", alive_at=now)) == ["a"]
    assert [r.id for r in cat.list_entries(CatalogScope(user_id="u"), limit=2, offset=1)] == ["b", "c"]
    assert [r.id for r in cat.list_entries(CatalogScope(user_id="u", tags=["t1"]))] == ["a", "b"]
    assert [r.id for r in cat.list_entries(CatalogScope(user_id="u"), limit=2, newest_first=True)] == ["c", "b"]
    assert ids(CatalogScope(created_after=1.0, created_before=4.0)) == ["b", "c"]
    assert len(ids(CatalogScope())) == 4 and ids(CatalogScope(user_id="u", kinds=["turn", "fact"])) == ["a", "b", "c"]
    assert ids(CatalogScope(expired_by=now)) == ["c"] and ids(CatalogScope(user_id="v", expired_by=now)) == []
    assert ids(CatalogScope(expired_by=now - 2)) == []  # c expired at now - 1: not yet by now - 2


def test_lexical_search_ranks_rare_terms_first_with_per_user_statistics(cat: Catalog) -> None:
    _add(cat, [_row("a1", "alice", "the kayak is red"), _row("a2", "alice", "we painted the fence"),
               _row("a3", "alice", "a kayak trip to the lake")])
    before = cat.lexical_search("red kayak", user_id="alice", limit=10)
    assert [i for i, _ in before][0] == "a1" and {i for i, _ in before} == {"a1", "a3"}
    assert all(s > 0 for _, s in before)
    # Another user's documents must not change what is rare for alice.
    _add(cat, [_row(f"b{i}", "bob", "red red red paint") for i in range(20)])
    after = cat.lexical_search("red kayak", user_id="alice", limit=10)
    assert [i for i, _ in after] == [i for i, _ in before]
    assert [s for _, s in after] == pytest.approx([s for _, s in before])
    assert cat.lexical_search("kayak", user_id="nobody", limit=5) == []
    assert cat.lexical_search("the a of", user_id="alice", limit=5) == []  # stop words only


def test_lexical_stems_words(cat: Catalog) -> None:
    _add(cat, [_row("a", text="she was painting fences")])
    assert [i for i, _ in cat.lexical_search("painted fence", user_id="u", limit=5)] == ["a"]


def test_erasing_a_users_entries_empties_their_lexical_index(cat: Catalog) -> None:
    _add(cat, [_row("a1", "alice", "secret kayak"), _row("b1", "bob", "kayak")])
    cat.delete(["a1"])
    cat.scrub(user_ids=["alice"])
    assert cat.lexical_search("secret kayak", user_id="alice", limit=5) == []
    assert [i for i, _ in cat.lexical_search("kayak", user_id="bob", limit=5)] == ["b1"]


def test_turn_context_two_turns_each_side(cat: Catalog) -> None:
    _add(cat, [_row(f"t{i}", session="s1", at=float(i)) for i in range(5)]
         + [_row("x", session="s2", at=2.5), _row("k", session="s1", at=2.2, kind="fact"), _row("n", at=1.0)]
         + [_row("o", user="v", session="s1", at=1.5)])  # another user's session of the same name
    ctx = cat.turn_context(["t0", "t2", "t4", "k", "n", "o", "missing"])
    assert ctx["t2"].before == ("t1", "t0") and ctx["t2"].after == ("t3", "t4")
    assert ctx["t0"].before == () and ctx["t4"].after == ()
    assert ctx["o"].before == ctx["o"].after == () and ctx["o"].turn  # the user's own turns only
    assert ctx["k"].session_id == "s1" and ctx["k"].before == () and not ctx["k"].turn
    assert ctx["n"].session_id is None and not ctx["n"].turn and "missing" not in ctx


def test_turn_neighbours_and_a_sessions_turns_around_a_time_are_committed_turns(cat: Catalog) -> None:
    # what context vectors are computed from (agentmem.entries.context_vectors): the turn before / after each turn
    _add(cat, [_row(f"t{i}", session="s1", at=float(i)) for i in range(4)]
         + [_row("k", session="s1", at=1.5, kind="fact"), _row("o", user="v", session="s1", at=1.2)])
    _add(cat, [_row("p", session="s1", at=2.5)], pending=True)  # in flight: nobody's neighbour
    near = lambda ids, **kw: {i: (c.before, c.after) for i, c in cat.turn_context(ids, window=1, **kw).items()  # noqa: E731
                              if c.turn}
    assert near(["t0", "t2", "k", "o", "p", "missing"]) == {
        "t0": ((), ("t1",)), "t2": (("t1",), ("t3",)), "o": ((), ())}
    assert near(["p"], committed=False) == {"p": (("t2",), ("t3",))}  # a row being erased still knows its place
    # a new turn's neighbours before it is written (context vectors): the newest turn before, the oldest after
    edge = lambda user, at, after: [r.id for r in cat.list_entries(  # noqa: E731
        CatalogScope(user_id=user, session_id="s1", kinds=["turn"],
                     **{"created_after" if after else "created_before": at}), limit=1, newest_first=not after)]
    assert edge("u", 2.7, after=False) == ["t2"] and edge("u", 2.7, after=True) == ["t3"]
    assert edge("u", 9.0, after=True) == [] and edge("v", 9.0, after=False) == ["o"]
    assert edge("u", 2.0, after=False) == ["t1"] and edge("u", 2.0, after=True) == ["t3"]  # strictly before / after


def test_info_items_lists_a_prefix_in_key_order_after_a_key_and_delete_infos_forgets(cat: Catalog) -> None:
    for key in ("erasure:003", "erasure:001", "erasure:002", "erasurf:000", "kb:erasure:1", "erasure_%"):
        cat.set_info(key, key.upper())
    assert cat.info_items("erasure:") == [("erasure:001", "ERASURE:001"), ("erasure:002", "ERASURE:002"),
                                          ("erasure:003", "ERASURE:003")]
    assert [k for k, _ in cat.info_items("erasure:", after="erasure:001")] == ["erasure:002", "erasure:003"]
    assert [k for k, _ in cat.info_items("erasure_")] == ["erasure_%"]  # LIKE's wildcards are plain characters
    cat.delete_infos(["erasure:001", "erasure:003", "missing"])
    cat.delete_infos([])
    assert [k for k, _ in cat.info_items("erasure:")] == ["erasure:002"] and cat.infos(["kb:erasure:1"])


def test_infos_reads_several_keys_and_a_scope_finds_where_chains_start(cat: Catalog) -> None:
    cat.set_info("a", "1")
    cat.set_info("b", "two")
    assert cat.infos(["a", "b", "missing"]) == {"a": "1", "b": "two"} and cat.infos([]) == {}
    old, new, retracted = _row("old"), _row("new", at=1.0), _row("retracted", at=2.0)
    old.status, old.superseded_by = "superseded", "new"
    retracted.status, retracted.superseded_by = "deleted", "new"  # any status starts a chain
    _add(cat, [old, new, retracted, _row("w", user="v")])
    assert _ids(cat, CatalogScope(user_id="u", has_successor=True)) == ["old", "retracted"]
    assert _ids(cat, CatalogScope(user_id="v", has_successor=True)) == []
    assert _ids(cat, CatalogScope(has_successor=False)) == ["new", "w"]
