"""Shared fixtures: a fresh store in a temp dir, with real SQLite, real Chroma and the bundled MiniLM."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# Tests never touch the network: any attempt to reach a model hub fails fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ.pop("AGENTMEM_ENCRYPTION_KEY", None)

from agentmem import AgentMemory  # noqa: E402


@pytest.fixture
def mem_path(tmp_path: Path) -> Path:
    return tmp_path / "store"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "catalogs(*urls): run each test using the mem / catalog_url fixtures once per "
                            "catalog_url (None: the SQLite file; \"memory\": the in-process catalog, vector index and "
                            "blob store, each written against its port alone)")
    config.addinivalue_line("markers", "needs_disk(reason): the test reads or reopens the store's files, which the "
                            "in-process parts do not keep: it runs on the catalogs that persist only")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module marked ``catalogs(None, "memory")`` runs its tests on each catalog; a test marked ``needs_disk`` on
    the persistent ones only (it is not collected for the in-memory catalog, rather than skipped)."""
    marker = metafunc.definition.get_closest_marker("catalogs")
    if marker is None or "catalog_url" not in metafunc.fixturenames:
        return
    urls = [u for u in marker.args
            if not (u == "memory" and metafunc.definition.get_closest_marker("needs_disk") is not None)]
    metafunc.parametrize("catalog_url", urls, ids=[u or "sqlite" for u in urls])


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread for a module (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``): tiny matmuls
    gain nothing from a second thread, and on a shared 2-core box an OpenMP team waiting for a descheduled thread
    makes them ~40x slower."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def catalog_url() -> str | None:
    """The catalog the ``mem`` fixture opens (None: the SQLite file beside the store); parametrised by ``catalogs``."""
    return None


def _ports_for(catalog_url: str | None) -> dict[str, str]:
    """The store's parts for a ``catalogs`` run: ``"memory"`` puts every port in process (catalog, vector index and
    blob store, each written against its port alone), so the facade tests run on a third-party backend end to end."""
    if catalog_url == "memory":
        return {"catalog_url": "memory", "vector_url": "memory", "blob_url": "memory"}
    return {"catalog_url": catalog_url} if catalog_url else {}


@pytest.fixture
def mem(mem_path: Path, request: pytest.FixtureRequest, catalog_url: str | None) -> Iterator[AgentMemory]:
    # indirect parametrisation passes MemoryConfig overrides: @pytest.mark.parametrize("mem", [{...}], indirect=True)
    overrides = _ports_for(catalog_url) | getattr(request, "param", {})
    with AgentMemory(mem_path, **overrides) as m:
        yield m
