"""One conformance suite for every API-key store (:class:`agentmem.ports.api_keys.ApiKeyRecords`): the embedded
``api_keys.db``, the in-process one (``url="memory"``) and PostgreSQL's (several servers sharing one set of keys),
each opened as the server opens them
(:func:`agentmem.api_keys.open_api_keys`), and the server's :class:`~agentmem.server.KeyStore` policy on each."""

from __future__ import annotations

import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentmem.api_keys import ApiKeyRecord, ApiKeyRecords, open_api_keys
from agentmem.errors import InvalidInputError, NotFoundError
from agentmem.server import KeyStore

KINDS = ["sqlite", "memory", "postgres"]


def _url(kind: str, request: pytest.FixtureRequest) -> str | None:
    """The url open_api_keys takes for ``kind`` (None: <store>/api_keys.db; PostgreSQL: a fresh database)."""
    return {"sqlite": None, "memory": "memory"}.get(kind) or request.getfixturevalue("fresh_postgres_url")


@pytest.fixture(params=KINDS)
def records(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ApiKeyRecords]:
    opened = open_api_keys(tmp_path / "store", url=_url(request.param, request))
    yield opened
    opened.close()


def _record(key_id: str, at: float, users: tuple[str, ...] = ("u1",)) -> ApiKeyRecord:
    return ApiKeyRecord(id=key_id, key_hash=key_id * 4, users=users, label=f"label {key_id}", created_at=at)


def test_is_a_key_store_and_starts_empty(records: ApiKeyRecords) -> None:
    assert isinstance(records, ApiKeyRecords) and records.records() == [] and records.get("k1") is None


def test_a_record_comes_back_as_it_went_in_and_listed_oldest_first(records: ApiKeyRecords) -> None:
    later, earlier = _record("k2", 20.0, users=("a", "b")), _record("k1", 10.0)
    records.insert(later)
    records.insert(earlier)
    assert records.get("k2") == later and records.get("k1") == earlier and records.get("k3") is None
    assert records.records() == [earlier, later]


def test_revoke_stamps_once_keeps_the_record_and_names_an_unknown_key(records: ApiKeyRecords) -> None:
    records.insert(_record("k1", 10.0))
    assert records.revoke("k1", at=11.0) is True
    assert records.revoke("k1", at=12.0) is False  # already revoked: the first stamp stays
    assert records.get("k1").revoked_at == 11.0 and [r.revoked_at for r in records.records()] == [11.0]
    with pytest.raises(NotFoundError, match="k9"):
        records.revoke("k9", at=13.0)


@pytest.mark.parametrize("kind", KINDS)
def test_the_servers_key_policy_runs_on_each_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    keys = KeyStore(tmp_path / "store", url=_url(kind, request))
    key = keys.add(["u2", "u1", "u1"], label="laptop")
    principal = keys.authenticate(key)
    assert principal is not None and principal.users == {"u1", "u2"} and principal.may("u1") and not principal.may("u3")
    assert keys.authenticate(key[:-1] + ("A" if key[-1] != "A" else "B")) is None  # same id, wrong secret
    assert keys.count() == 1 and keys.list()[0]["users"] == ["u1", "u2"]
    with pytest.raises(InvalidInputError):
        keys.add("u1")
    assert keys.revoke(principal.key_id) and keys.authenticate(key) is None and keys.count() == 0
    assert len(keys.list(include_revoked=True)) == 1
    keys.close()


def test_the_sqlite_store_persists_in_a_private_file(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path / "store")
    key = keys.add(["u1"])
    keys.close()
    assert stat.S_IMODE((tmp_path / "store" / "api_keys.db").stat().st_mode) == 0o600
    assert KeyStore(tmp_path / "store").authenticate(key) is not None
    elsewhere = tmp_path / "keys" / "server.db"
    KeyStore(None, url=f"sqlite:///{elsewhere}").add(["u1"])
    assert KeyStore(None, url=f"sqlite:///{elsewhere}").count() == 1 and stat.S_IMODE(elsewhere.stat().st_mode) == 0o600


def test_a_key_file_written_by_earlier_versions_opens_as_it_is(tmp_path: Path) -> None:
    # the table and the row exactly as the server wrote them before the key store became a backend (SQLAlchemy's
    # create_all of the old ApiKeyRow; users as JSON text)
    store = tmp_path / "store"
    store.mkdir()
    key = "am_76807b9f7053_zYXU8ERcxQluSpE0KHgAM3zjaBIM05ysxxdxouW0KGM"
    with sqlite3.connect(store / "api_keys.db") as db:
        db.execute("CREATE TABLE api_keys (\n\tid VARCHAR(16) NOT NULL, \n\tkey_hash VARCHAR(64) NOT NULL, \n\t"
                   "users JSON NOT NULL, \n\tlabel VARCHAR, \n\tcreated_at FLOAT NOT NULL, \n\trevoked_at FLOAT, \n\t"
                   "PRIMARY KEY (id)\n)")
        db.execute("INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, NULL)",
                   ("76807b9f7053", "d50c6bf7de0c6e9fe9741ae3d204e34c740f1e7a2f1a1d39e5f64fcb05913f4f",
                    '["u1", "u2"]', "laptop", 1796474560.903861))
    keys = KeyStore(store)
    assert keys.authenticate(key).users == {"u1", "u2"}
    assert keys.list() == [{"id": "76807b9f7053", "users": ["u1", "u2"], "label": "laptop",
                            "created_at": 1796474560.903861, "revoked_at": None}]
    assert keys.revoke("76807b9f7053") and keys.authenticate(key) is None


def test_open_api_keys_needs_a_store_or_a_url() -> None:
    with pytest.raises(InvalidInputError, match="store directory or a key store URL"):
        open_api_keys(None)
    with pytest.raises(InvalidInputError, match="api_keys_url"):
        open_api_keys(None, url="mongodb://nowhere")
