"""The embedded catalog: SQLite through SQLAlchemy 2.0 (:mod:`.catalog`), over the SQL model both SQL catalogs
share (:mod:`.rows`), its per-user FTS5 tables and BM25 bounds (:mod:`.lexical`), its numbered migrations
(:mod:`.schema`, shared with PostgreSQL) and recall's read-only rows (:mod:`.entry_records`)."""
