"""The embedded catalog: SQLite through SQLAlchemy 2.0 (:mod:`.catalog`), its numbered migrations (:mod:`.schema`,
shared with PostgreSQL) and recall's read-only rows (:mod:`.entry_records`)."""
