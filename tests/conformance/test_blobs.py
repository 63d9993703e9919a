"""One conformance suite for every BlobStore: files under a path, Redis, in-process (``blob_url="memory"``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentmem.backends.files import FileBlobStore
from agentmem.errors import BlobCorruptedError
from agentmem.ports import BlobStore

BACKENDS = ["files", "redis", "memory"]


def make_blobs(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if kind == "files":
        return FileBlobStore(tmp_path / "store")
    if kind == "memory":
        from agentmem.backends.in_memory import MemoryBlobStore

        return MemoryBlobStore()
    from agentmem.backends.redis_blobs import RedisBlobStore

    return RedisBlobStore(request.getfixturevalue("fresh_redis_url"))


@pytest.fixture(params=BACKENDS)
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    b = make_blobs(request.param, request, tmp_path)
    yield b
    b.close()


def test_is_a_blob_store(blobs: BlobStore) -> None:
    assert isinstance(blobs, BlobStore) and list(blobs.keys()) == []


def test_staged_is_invisible_until_published(blobs: BlobStore) -> None:
    token = blobs.stage("e1", b"kv-bytes")
    assert not blobs.exists("e1") and list(blobs.keys()) == []
    with pytest.raises(BlobCorruptedError):
        blobs.read("e1")
    assert token in blobs.list_pending()
    blobs.publish(token)
    assert blobs.exists("e1") and bytes(blobs.read("e1")) == b"kv-bytes" and bytes(blobs.view("e1")) == b"kv-bytes"
    assert blobs.list_pending() == [] and list(blobs.keys()) == ["e1"]


def test_publish_replaces_discard_drops_delete_erases(blobs: BlobStore) -> None:
    blobs.publish(blobs.stage("e1", b"one"))
    dropped = blobs.stage("e1", b"never")
    blobs.discard(dropped)
    blobs.discard(dropped)  # twice is a no-op
    blobs.publish(blobs.stage("e1", b"two!"))
    assert bytes(blobs.read("e1")) == b"two!"
    assert blobs.delete("e1") and not blobs.delete("e1") and not blobs.exists("e1")


def test_list_pending_filters_by_age(blobs: BlobStore) -> None:
    token = blobs.stage("e2", b"x")
    assert blobs.list_pending(older_than_s=3600) == []
    time.sleep(0.05)
    assert blobs.list_pending(older_than_s=0.01) == [token]


def test_binary_round_trip_and_location(blobs: BlobStore) -> None:
    data = bytes(range(256)) * 4000
    blobs.publish(blobs.stage("e3", data))
    assert bytes(blobs.view("e3")) == data and isinstance(blobs.location("e3"), str)
