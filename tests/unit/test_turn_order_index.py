"""Schemas 8 and 9: the partial covering index of committed turns ``(session_id, user_id, created_at, id, kind,
write_state) WHERE kind = 'turn' AND write_state IS NULL`` that recall's conversation placement
(``SqliteCatalog.turn_context``) reads. A store at schema 7 gets it on open (SQLite and PostgreSQL), the placement
query reads it alone, and the placement it finds is the one found without it (in-flight rows, other kinds and other
sessions left out)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, text

from agentmem.backends.migrations import apply_migrations, schema_version
from agentmem.backends.sqlite.catalog import SqliteCatalog
from agentmem.backends.sqlite.schema import MIGRATIONS, SCHEMA_VERSION

INDEX = "ix_entries_session_user_turns"
# (id, session, kind, created_at, write_state): two sessions of turns, a fact inside one, an in-flight turn, a
# turn without a session
ROWS = [*((f"t{i}", "s1", "turn", float(i), None) for i in range(6)),
        *((f"u{i}", "s2", "turn", 0.5 + i, None) for i in range(3)),
        ("k", "s1", "knowledge", 2.5, None), ("p", "s1", "turn", 3.5, "adding"), ("n", None, "turn", 1.0, None)]
IDS = ["t0", "t2", "t3", "t5", "u1", "k", "n", "p", "missing"]


def _schema7(url: str) -> None:
    eng = create_engine(url)
    with eng.begin() as conn:
        apply_migrations(conn, MIGRATIONS, target=7)
        for entry_id, session, kind, at, state in ROWS:
            conn.execute(text("INSERT INTO entries (id, user_id, session_id, kind, text, memory_text, metadata, "
                              "created_at, write_state) VALUES (:i, 'u', :s, :k, 'x', 'x', '{}', :a, :w)"),
                         {"i": entry_id, "s": session, "k": kind, "a": at, "w": state})
    eng.dispose()


def _placements(cat) -> dict[str, tuple]:
    return {i: tuple(c)[:3] for i, c in sorted(cat.turn_context(IDS).items())}


def _expected() -> dict[str, tuple]:
    return {"t0": ("s1", (), ("t1", "t2")), "t2": ("s1", ("t1", "t0"), ("t3", "t4")),
            "t3": ("s1", ("t2", "t1"), ("t4", "t5")), "t5": ("s1", ("t4", "t3"), ()),
            "u1": ("s2", ("u0",), ("u2",)), "k": ("s1", (), ()), "n": (None, (), ())}


def test_a_sqlite_store_at_schema_7_gets_the_index_and_places_turns_as_without_it(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    _schema7(f"sqlite:///{path}")
    cat = SqliteCatalog(str(path))
    with cat.engine.connect() as conn:
        assert schema_version(conn) == SCHEMA_VERSION >= 9
        plan = conn.exec_driver_sql(
            "EXPLAIN QUERY PLAN SELECT p.id FROM entries p WHERE p.session_id = 's1' AND p.user_id = 'u' AND p.kind = 'turn' "
            "AND p.write_state IS NULL AND p.created_at < 3 ORDER BY p.created_at DESC LIMIT 2").all()
    assert any(f"COVERING INDEX {INDEX}" in row[-1] for row in plan), plan  # no table row read per neighbour
    with_index = _placements(cat)
    with cat.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP INDEX {INDEX}")
    assert with_index == _placements(cat) == _expected()
    cat.close()


def test_a_postgres_store_at_schema_7_gets_the_index_and_places_turns_as_without_it(
        fresh_postgres_url: str) -> None:
    from agentmem.backends.postgres import PostgresCatalog

    _schema7(fresh_postgres_url)
    cat = PostgresCatalog(fresh_postgres_url)
    with cat.engine.connect() as conn:
        assert schema_version(conn) == SCHEMA_VERSION
        definition = conn.execute(text("SELECT indexdef FROM pg_indexes WHERE indexname = :n"), {"n": INDEX}).scalar()
    assert definition is not None and "(session_id, user_id, created_at, id, kind, write_state)" in definition and "WHERE" in definition
    with_index = _placements(cat)
    with cat.engine.begin() as conn:
        conn.execute(text(f"DROP INDEX {INDEX}"))
    assert with_index == _placements(cat) == _expected()
    cat.close()

