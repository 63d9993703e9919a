"""Early-terminated lexical top-k (agentmem.backends.lexical_bounds) equals exhaustive BM25 on a real store, on SQLite
(FTS5) and PostgreSQL: same scores position by position, same ids except where scores tie at the cut.

The corpus is built so the shortcut both fires and must be refused: Zipf-distributed words (a few in most
documents), lengths from 2 to 60 tokens, words repeated inside a document, stems shared by several word forms.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from agentmem.backends.migrations import apply_migrations
from agentmem.backends.sqlite.catalog import SqliteCatalog
from agentmem.backends.sqlite.lexical import lexical_table
from agentmem.ports.catalog import EntryRecord
from agentmem.backends.lexical_bounds import can_stop, doc_bounds, prefix_counts, term_bound
from agentmem.backends.sqlite.schema import MIGRATIONS

STEMS = ("kayak heron lantern orchard paint garden violin harbour market river bridge ferry museum coffee winter "
         "doctor sister station recipe festival glacier canyon pottery library bicycle concert airport meadow").split()
FORMS = ("", "s", "ing", "ed")  # paint, paints, painting, painted: one Porter stem, four tokens


def _corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    weights = [1 / (i + 1) ** 0.8 for i in range(len(STEMS))]
    docs = []
    for _ in range(n):
        length = rng.choice([2, 3, 5, 8, 12, 12, 15, 20, 30, 60])
        words = [rng.choices(STEMS, weights)[0] + rng.choice(FORMS) for _ in range(length)]
        docs.append(" ".join(words) + rng.choice(["", " the end", " and then we left"]))
    return docs


def _queries(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = rng.sample(STEMS[:12], rng.choice([2, 2, 3])) + (["unheardof"] if rng.random() < 0.2 else [])
        out.append("what about the " + " and ".join(words) + "?")
    return out


def _fill(cat, docs: list[str], user: str = "u") -> None:
    for start in range(0, len(docs), 500):
        rows = [EntryRecord(id=f"e{i:05d}" if user == "u" else f"{user}{i}", user_id=user, kind="turn", text=d, memory_text=d, created_at=float(i),
                         metadata_json={}) for i, d in enumerate(docs[start:start + 500], start)]
        cat.insert(rows, index_texts=[r.text for r in rows])


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def filled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    if request.param == "sqlite":
        cat = SqliteCatalog(str(tmp_path_factory.mktemp("lex") / "catalog.db"))
    else:
        from agentmem.backends.postgres import PostgresCatalog

        from tests.servers import create_postgres_database

        url = create_postgres_database(request.getfixturevalue("postgres_server"), "lexical_topk")
        cat = PostgresCatalog(url)
    _fill(cat, _corpus(3000))
    _fill(cat, _corpus(300, seed=5), user="other")  # another user's words must not count
    yield cat
    cat.close()


def _exhaustive(cat, query: str, limit: int, user: str = "u") -> list[tuple[str, float]]:
    saved, cat.prune_min_docs = cat.prune_min_docs, 10**12
    try:
        return cat.lexical_search(query, user_id=user, limit=limit)
    finally:
        cat.prune_min_docs = saved


def _same_top(fast: list[tuple[str, float]], full: list[tuple[str, float]]) -> None:
    assert len(fast) == len(full)
    assert [s for _, s in fast] == pytest.approx([s for _, s in full], rel=1e-9)
    if full:
        cut = full[-1][1]
        above = lambda hits: {i for i, s in hits if s > cut * (1 + 1e-9)}  # noqa: E731 - ids not tied at the cut
        assert above(fast) == above(full)


@pytest.mark.parametrize("limit", [5, 20, 100])
def test_early_terminated_top_k_equals_exhaustive_bm25(filled, limit: int) -> None:
    stops_before = filled.early_stops
    queries = _queries(60)
    for q in queries:
        _same_top(filled.lexical_search(q, user_id="u", limit=limit), _exhaustive(filled, q, limit))
    stopped = filled.early_stops - stops_before
    # the shortcut must have been taken for some queries and refused for others, or this proves nothing
    assert 0 < stopped < len(queries), stopped


def test_a_small_table_is_scored_exhaustively(filled) -> None:
    stops = filled.early_stops
    hits = filled.lexical_search("kayak heron", user_id="other", limit=5)  # 300 documents: below prune_min_docs
    assert hits and filled.early_stops == stops


def test_bounds_only_loosen_when_documents_are_deleted_and_stay_exact(filled) -> None:
    q = "kayak and heron"
    filled.delete([f"e{i:05d}" for i in range(0, 3000, 7)])
    _same_top(filled.lexical_search(q, user_id="u", limit=20), _exhaustive(filled, q, 20))
    doc = "kayak " * 40 + "heron " * 40  # a long document repeating both terms: the bounds must grow with it
    filled.insert([EntryRecord(id="long", user_id="u", kind="turn", text=doc, memory_text=doc, created_at=9e9,
                            metadata_json={})], index_texts=[doc])
    fast, full = filled.lexical_search(q, user_id="u", limit=20), _exhaustive(filled, q, 20)
    _same_top(fast, full)
    assert fast[0][0] == "long"


def test_the_bound_arithmetic() -> None:
    ub = term_bound(2.0, max_tf=3, min_len=4, avg_len=10.0)
    assert ub == pytest.approx(2.0 * 3 * 2.2 / (3 + 1.2 * (0.25 + 0.75 * 0.4)))
    assert term_bound(2.0, max_tf=1, min_len=10, avg_len=10.0) < ub  # less tf, longer document: less
    assert can_stop(theta=2.01, bounds=[1.0, 2.0]) and not can_stop(theta=2.0, bounds=[1.0, 2.0])
    assert not can_stop(theta=99.0, bounds=[1.0])  # one term: nothing to prune
    # prefixes: "painted", "painting" count under "pa"; a non-ASCII token counts under every prefix ("*")
    assert prefix_counts("painted painting Ωmega")["pa"] == 2 and prefix_counts("Ωmega")["*"] == 1
    assert doc_bounds(["a b c", "paint paints"]) == (2, {"a": 1, "b": 1, "c": 1, "p": 2, "pa": 2})


def test_a_sqlite_store_at_schema_6_gets_its_bounds_on_open(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    eng = create_engine(f"sqlite:///{path}")
    table = lexical_table("u")
    with eng.begin() as conn:
        apply_migrations(conn, MIGRATIONS, target=6)
        conn.execute(text(f"CREATE VIRTUAL TABLE {table} USING fts5(id UNINDEXED, content, tokenize='porter unicode61')"))
        for i, d in enumerate(_corpus(2500)):
            conn.execute(text("INSERT INTO entries (id, user_id, kind, text, memory_text, metadata, created_at) "
                              "VALUES (:i, 'u', 'turn', :t, :t, '{}', 1.0)"), {"i": f"e{i:05d}", "t": d})
            conn.execute(text(f"INSERT INTO {table}(id, content) VALUES (:i, :t)"), {"i": f"e{i:05d}", "t": d})
    eng.dispose()
    cat = SqliteCatalog(str(path))
    with cat.engine.connect() as conn:
        bounds = dict(conn.execute(text("SELECT prefix, value FROM lexical_bounds WHERE tbl = :t"), {"t": table}).all())
    assert bounds[""] == 2 and bounds["ka"] >= 1  # the shortest document has 2 tokens
    for q in _queries(20):
        _same_top(cat.lexical_search(q, user_id="u", limit=10), _exhaustive(cat, q, 10))
    assert cat.early_stops > 0
    cat.close()


def test_a_postgres_store_at_schema_6_gets_its_bounds_on_open(fresh_postgres_url: str) -> None:
    from agentmem.backends.postgres import PostgresCatalog

    eng = create_engine(fresh_postgres_url)
    with eng.begin() as conn:
        apply_migrations(conn, MIGRATIONS, target=6)
    eng.dispose()
    cat = PostgresCatalog(fresh_postgres_url)  # written with today's code, then the bounds taken away
    _fill(cat, ["kayak kayak kayak heron", "heron lake", "a kayak on the long quiet lake at dawn"])
    with cat.engine.begin() as conn:
        conn.execute(text("UPDATE lexical_terms SET max_tf = NULL"))
        conn.execute(text("UPDATE lexical_users SET min_len = NULL"))
        conn.execute(text("UPDATE store_info SET value = '6' WHERE \"key\" = 'schema_version'"))
        conn.execute(text("ALTER TABLE lexical_terms DROP COLUMN max_tf"))
        conn.execute(text("ALTER TABLE lexical_users DROP COLUMN min_len"))
        conn.execute(text("ALTER TABLE entries DROP COLUMN sentence_vectors"))  # schema 10's, replayed on open
    cat.close()
    cat = PostgresCatalog(fresh_postgres_url)
    with cat.engine.connect() as conn:
        terms = dict(conn.execute(text("SELECT term, max_tf FROM lexical_terms WHERE user_id = 'u'")).all())
        min_len = conn.execute(text("SELECT min_len FROM lexical_users WHERE user_id = 'u'")).scalar_one()
    assert terms["kayak"] == 3 and terms["heron"] == 1 and min_len == 2
    cat.close()
