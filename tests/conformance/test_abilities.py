"""The optional abilities of agentmem.ports.abilities, decided once by the factory, on every backend that has one.

``JoinsCatalogTransaction``: pgvector keeps vectors in the catalog's PostgreSQL database and writes them inside the
catalog's insert transaction; every other index is written after the row (and the row is committed last).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agentmem import MemoryConfig
from agentmem.ports.catalog import EntryRecord
from agentmem.factory import BuildContext, build_store_parts
from agentmem.ports.abilities import JoinsCatalogTransaction


def _parts(tmp_path: Path, **urls: str):
    (tmp_path / "store").mkdir(exist_ok=True)  # the embedded parts live under the store's folder
    return build_store_parts(BuildContext(root=tmp_path / "store", config=MemoryConfig(**urls)))


def _row(entry_id: str) -> EntryRecord:
    return EntryRecord(id=entry_id, user_id="u", kind="turn", text="t", memory_text="t", created_at=0.0, metadata_json={})


@pytest.mark.parametrize("urls", [{}, {"vector_url": "memory", "blob_url": "memory"}], ids=["embedded", "memory"])
def test_indexes_outside_the_catalog_join_no_transaction(tmp_path: Path, urls: dict[str, str]) -> None:
    parts = _parts(tmp_path, **urls)
    try:
        assert parts.joint_vectors is None and not isinstance(parts.vectors, JoinsCatalogTransaction)
    finally:
        for part in (parts.catalog, parts.vectors, parts.blobs):
            part.close()


def test_pgvector_joins_its_catalogs_transaction_and_no_other(tmp_path: Path, fresh_postgres_url: str) -> None:
    parts = _parts(tmp_path, catalog_url=fresh_postgres_url, vector_url="pgvector")
    vec = np.ones((1, 4), np.float32) / 2
    try:
        assert parts.joint_vectors is parts.vectors and isinstance(parts.vectors, JoinsCatalogTransaction)
        joint = parts.joint_vectors
        parts.catalog.insert([_row("e1")], index_texts=["t"],
                             extra=lambda s: joint.add_in(s, ["u"], ["e1"], vec, [{"kind": "turn"}]))
        assert [r.id for r in parts.catalog.get(["e1"])] == ["e1"] and parts.vectors.user_ids("u") == ["e1"]

        def fail(s: object) -> None:
            joint.add_in(s, ["u"], ["e2"], vec, [{"kind": "turn"}])
            raise RuntimeError("the write fails after the vector")

        with pytest.raises(RuntimeError):
            parts.catalog.insert([_row("e2")], index_texts=["t"], extra=fail)
        assert parts.catalog.get(["e2"]) == [] and parts.vectors.user_ids("u") == ["e1"]  # neither is left
        from agentmem.backends.postgres import PostgresCatalog

        other = PostgresCatalog(fresh_postgres_url)  # the same database, another catalog object
        try:
            assert build_store_parts(BuildContext(root=tmp_path / "s2", config=MemoryConfig()), catalog=other,
                                     vectors=parts.vectors, blobs=parts.blobs).joint_vectors is None
        finally:
            other.close()
    finally:
        for part in (parts.vectors, parts.blobs, parts.catalog):
            part.close()
