"""Schema migrations: numbered, forward-only, applied on open, tested from every earlier schema.

Each earlier schema is built for real by applying the migration list up to that version, filled with data the way
that version stored it, then opened with today's :class:`SqliteCatalog`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from agentmem.backends.migrations import Migration, apply_migrations, schema_version
from agentmem.errors import AgentMemError
from agentmem.backends.sqlite.catalog import SqliteCatalog
from agentmem.backends.sqlite.lexical import lexical_table
from agentmem.backends.sqlite.rows import Base
from agentmem.ports.catalog import EntryRecord
from agentmem.backends.sqlite.schema import MIGRATIONS, SCHEMA_VERSION

_ROWS = [("a1", "alice", "red kayak"), ("b1", "bob", "blue kayak")]


def _old_store(path: Path, version: int) -> None:
    """A catalog file as schema ``version`` wrote it, holding two users' entries."""
    eng = create_engine(f"sqlite:///{path}")
    with eng.begin() as conn:
        apply_migrations(conn, MIGRATIONS, target=version)
        for entry_id, user, words in _ROWS:
            conn.execute(text("INSERT INTO entries (id, user_id, kind, text, memory_text, metadata, created_at) "
                              "VALUES (:i, :u, 'turn', :t, :t, '{}', 1.0)"), {"i": entry_id, "u": user, "t": words})
            if version == 1:  # schema 1: one FTS5 table for every user
                conn.execute(text("INSERT INTO entries_fts VALUES (:i, :u, :t)"), {"i": entry_id, "u": user, "t": words})
            else:
                conn.execute(text(f"CREATE VIRTUAL TABLE IF NOT EXISTS {lexical_table(user)} USING fts5(id UNINDEXED, "
                                  "content, tokenize='porter unicode61')"))
                conn.execute(text(f"INSERT INTO {lexical_table(user)}(id, content) VALUES (:i, :t)"),
                             {"i": entry_id, "t": words})
    eng.dispose()


@pytest.mark.parametrize("version", list(range(1, SCHEMA_VERSION)))
def test_every_earlier_schema_migrates_on_open_and_keeps_its_data(tmp_path: Path, version: int) -> None:
    path = tmp_path / "c.db"
    _old_store(path, version)
    cat = SqliteCatalog(str(path))
    assert cat.get_info("schema_version") == str(SCHEMA_VERSION)
    assert [r.id for r in cat.get(["a1", "b1"])] == ["a1", "b1"]  # old rows are committed rows
    assert [i for i, _ in cat.lexical_search("kayak", user_id="alice", limit=5)] == ["a1"]
    assert [i for i, _ in cat.lexical_search("kayak", user_id="bob", limit=5)] == ["b1"]
    assert cat.pending(float("inf")) == []
    cat.close()
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'entries_fts'").fetchone()[0] == 0


def _columns(engine) -> dict[str, set[str]]:
    insp = inspect(engine)
    return {t: {c["name"] for c in insp.get_columns(t)} for t in insp.get_table_names()
            if t in Base.metadata.tables}


def _indexes(engine) -> dict[str, set[str]]:
    insp = inspect(engine)
    return {t: {i["name"] for i in insp.get_indexes(t)} for t in Base.metadata.tables}


def test_migrated_schema_equals_the_orm_model(tmp_path: Path) -> None:
    SqliteCatalog(str(tmp_path / "migrated.db")).close()
    migrated = create_engine(f"sqlite:///{tmp_path / 'migrated.db'}")
    fresh = create_engine(f"sqlite:///{tmp_path / 'orm.db'}")
    Base.metadata.create_all(fresh)
    assert _columns(migrated) == _columns(fresh)
    assert _indexes(migrated) == _indexes(fresh)


def test_two_opens_race_on_a_new_store_and_both_work(tmp_path: Path) -> None:
    import threading

    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            SqliteCatalog(str(tmp_path / "c.db")).close()
        except BaseException as exc:  # asserted below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    cat = SqliteCatalog(str(tmp_path / "c.db"))
    cat.insert([EntryRecord(id="x", user_id="u", kind="turn", text="t", memory_text="t", created_at=0.0)],
               index_texts=["t"])
    assert cat.get_info("schema_version") == str(SCHEMA_VERSION)


def test_a_store_from_newer_code_is_refused(tmp_path: Path) -> None:
    SqliteCatalog(str(tmp_path / "c.db")).close()
    with sqlite3.connect(tmp_path / "c.db") as con:
        con.execute("UPDATE store_info SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(AgentMemError, match="newer"):
        SqliteCatalog(str(tmp_path / "c.db"))


def test_runner_applies_in_order_once_and_rejects_gaps() -> None:
    eng = create_engine("sqlite://")
    seen: list[int] = []
    steps = [Migration(1, "info", lambda c: (seen.append(1), c.execute(text(
                 'CREATE TABLE store_info ("key" VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)')))),
             Migration(2, "t", lambda c: (seen.append(2), c.execute(text("CREATE TABLE t (x INTEGER)"))))]
    with eng.begin() as conn:
        assert apply_migrations(conn, steps) == [1, 2]
        assert apply_migrations(conn, steps) == []
        assert schema_version(conn) == 2
    assert seen == [1, 2]
    with eng.begin() as conn, pytest.raises(ValueError, match="without gaps"):
        apply_migrations(conn, [steps[1]])


def test_a_postgres_store_at_schema_4_gets_bm25_postings_on_open(fresh_postgres_url: str) -> None:
    from agentmem.backends.postgres import PostgresCatalog

    eng = create_engine(fresh_postgres_url)
    with eng.begin() as conn:  # schema 4 stored a tsvector per entry, its length in distinct lexemes
        apply_migrations(conn, MIGRATIONS, target=4)
        for entry_id, user, words in [*_ROWS, ("a2", "alice", "green kayak and a red kayak paddle")]:
            conn.execute(text("INSERT INTO entries (id, user_id, kind, text, memory_text, metadata, created_at) "
                              "VALUES (:i, :u, 'turn', :t, :t, '{}', 1.0)"), {"i": entry_id, "u": user, "t": words})
            conn.execute(text("INSERT INTO lexical_docs SELECT :i, :u, d, length(d) FROM to_tsvector('english', :t) d"),
                         {"i": entry_id, "u": user, "t": words})
        conn.execute(text("INSERT INTO lexical_users SELECT user_id, count(*), sum(doc_len) FROM lexical_docs "
                          "GROUP BY user_id"))
        conn.execute(text("INSERT INTO lexical_terms SELECT user_id, t, count(*) FROM lexical_docs, "
                          "unnest(tsvector_to_array(doc)) t GROUP BY user_id, t"))
    eng.dispose()
    cat = PostgresCatalog(fresh_postgres_url)
    with cat.engine.connect() as conn:
        assert schema_version(conn) == SCHEMA_VERSION
        postings = conn.execute(text("SELECT entry_id, term, tf, doc_len FROM lexical_postings WHERE user_id = 'alice' "
                                     "ORDER BY entry_id, term")).all()
    # a2's document is 7 tokens long ("and", "a" count as FTS5 counts them), and "kayak" occurs twice in it
    assert ("a2", "kayak", 2, 7) in postings and ("a1", "red", 1, 2) in postings
    assert [i for i, _ in cat.lexical_search("red kayak", user_id="alice", limit=5)] == ["a1", "a2"]
    assert [i for i, _ in cat.lexical_search("kayak", user_id="bob", limit=5)] == ["b1"]
