"""One conformance suite for every SessionTierStore: files under a path, and Redis (a real redis-server)."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentmem.backends.file_sessions import FileSessionStore
from agentmem.errors import InvalidInputError
from agentmem.ports.sessions import SessionTierStore, put

BACKENDS = ["files", "redis"]


def make_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> SessionTierStore:
    if kind == "files":
        return FileSessionStore(tmp_path / "sessions")
    from agentmem.backends.redis_sessions import RedisSessionStore

    return RedisSessionStore(request.getfixturevalue("fresh_redis_url"))


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionTierStore]:
    yield make_store(request.param, request, tmp_path)


def test_is_a_session_tier_store(store: SessionTierStore) -> None:
    assert isinstance(store, SessionTierStore) and store.name == "cold"


def test_stage_is_invisible_until_published(store: SessionTierStore) -> None:
    token = store.stage("u1/s1", b"first", last_used=100.0)
    assert store.get("u1/s1") is None and store.last_used("u1/s1") is None and store.keys() == []
    store.publish(token)
    assert bytes(store.get("u1/s1")) == b"first"
    assert store.last_used("u1/s1") == pytest.approx(100.0)
    assert store.keys() == ["u1/s1"] and store.nbytes() == 5


def test_publish_replaces_and_discard_drops(store: SessionTierStore) -> None:
    put(store, "u1/s1", b"one", last_used=1.0)
    staged = store.stage("u1/s1", b"two!", last_used=2.0)
    dropped = store.stage("u1/s1", b"never", last_used=3.0)
    store.discard(dropped)
    store.discard(dropped)  # twice is a no-op
    assert bytes(store.get("u1/s1")) == b"one"
    store.publish(staged)
    assert bytes(store.get("u1/s1")) == b"two!" and store.last_used("u1/s1") == pytest.approx(2.0)
    assert store.nbytes() == 4


def test_binary_values_round_trip(store: SessionTierStore) -> None:
    blob = bytes(range(256)) * 1000
    put(store, "u1/s1", blob, last_used=time.time())
    assert bytes(store.get("u1/s1")) == blob


def test_keys_by_folder_and_delete(store: SessionTierStore) -> None:
    for key in ("ua/s1", "ua/s2", "ub/s1"):
        put(store, key, key.encode(), last_used=1.0)
    assert sorted(store.keys()) == ["ua/s1", "ua/s2", "ub/s1"]
    assert sorted(store.keys("ua")) == ["ua/s1", "ua/s2"] and store.keys("uc") == []
    assert store.delete("ua/s1") and not store.delete("ua/s1")
    assert store.get("ua/s1") is None and store.last_used("ua/s1") is None
    assert sorted(store.keys()) == ["ua/s2", "ub/s1"]
    store.purge()
    assert bytes(store.get("ub/s1")) == b"ub/s1"


def test_bad_keys_are_typed_errors(store: SessionTierStore) -> None:
    for bad in ("noslash", "a/b/c", "/s", "u/"):
        with pytest.raises(InvalidInputError, match="folder"):
            store.stage(bad, b"x", last_used=1.0)
        with pytest.raises(InvalidInputError):
            store.get(bad)


def test_lease_has_one_owner_until_released_or_expired(store: SessionTierStore) -> None:
    assert store.acquire_lease("u1/s1", "w1", 30.0)
    assert store.acquire_lease("u1/s1", "w1", 30.0)  # renewal by the holder
    assert not store.acquire_lease("u1/s1", "w2", 30.0)
    assert store.acquire_lease("u1/s2", "w2", 30.0)  # leases are per key
    store.release_lease("u1/s1", "w2")  # not the holder: no effect
    assert not store.acquire_lease("u1/s1", "w2", 30.0)
    store.release_lease("u1/s1", "w1")
    assert store.acquire_lease("u1/s1", "w2", 0.2)
    time.sleep(0.35)
    assert store.acquire_lease("u1/s1", "w1", 30.0)  # w2's lease expired


def _contend(args: tuple[str, str, str, int]) -> int:
    kind, where, owner, tries = args
    from agentmem.backends.file_sessions import FileSessionStore
    from agentmem.backends.redis_sessions import RedisSessionStore

    store = FileSessionStore(where) if kind == "files" else RedisSessionStore(where)
    won = 0
    for i in range(tries):
        if store.acquire_lease(f"u/s{i}", owner, 60.0):
            won += 1
    return won


@pytest.mark.parametrize("kind", BACKENDS)
def test_lease_is_exclusive_across_processes(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    where = str(tmp_path / "sessions") if kind == "files" else request.getfixturevalue("fresh_redis_url")
    tries = 60
    # fork: the children need no imports of their own (spawn would re-import torch in each, ~10 s apiece here)
    with mp.get_context("fork").Pool(4) as pool:
        wins = pool.map(_contend, [(kind, where, f"w{i}", tries) for i in range(4)])
    assert sum(wins) == tries  # every key has exactly one owner, whoever raced for it


def test_underscore_folders_are_metadata_not_sessions(store: SessionTierStore) -> None:
    put(store, "_agentmem/epoch", b"e1", last_used=1.0)
    put(store, "u1/s1", b"kv", last_used=1.0)
    assert bytes(store.get("_agentmem/epoch")) == b"e1"
    assert store.keys() == ["u1/s1"] and store.nbytes() == 2 and store.keys("_agentmem") == []


def test_files_erase_a_crashed_writers_staged_file_once_it_is_old(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "sessions")
    token = store.stage("u1/s1", b"half", last_used=1.0)  # never published: its writer "crashed"
    assert store.cleanup_staged() == 0 and Path(token).exists()  # young: maybe a live writer
    assert store.cleanup_staged(older_than_s=0.0) == 1 and not Path(token).exists()
