"""Every docstring example in the package runs, so a docstring cannot drift from the code it describes.

Each module's examples run as ``python -m doctest`` would run them (``ELLIPSIS`` allowed), in a fresh temporary
directory, because several examples open a store at a relative path. The examples of the modules in ``SETUP`` also
find in their globals what their set-up builds, fresh for each example (``mem``: a store holding two memories),
so that a docstring shows only the call and its result; those of the modules in ``SERVERS`` find the URL of a
server tests/servers.py started (``redis_url``, ``postgres_url``, ``chroma_http_url``). Examples that are fragments
by design (they need what the suite cannot give them), whether they fail or are marked ``# doctest: +SKIP``, are
listed by name in ``illustrative_doctests.txt``. An unlisted example that fails or skips a
line fails here, and so does a listed one that runs whole and passes, so that list only shrinks.
"""

from __future__ import annotations

import contextlib
import doctest
import functools
import importlib
import io
import pkgutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

import agentmem

ILLUSTRATIVE_LIST = Path(__file__).with_name("illustrative_doctests.txt")
MODULES = sorted(info.name for info in pkgutil.walk_packages(agentmem.__path__, "agentmem."))


@functools.cache
def _smollm2() -> tuple[Any, Any]:
    """The embedded SmolLM2 (model, tokenizer), loaded once for every store the examples use."""
    from agentmem.kv import load_model

    return load_model()


@contextlib.contextmanager
def _store(root: Path) -> Iterator[dict[str, Any]]:
    """``mem``: user u1's store (KV encoding off, the embedded model for answers) holding ``rec`` ("I moved to Lyon
    last May.") and ``dog`` ("My dog is called Rex."), both of session s1."""
    from agentmem import AgentMemory

    with AgentMemory(root / "mem", kv_encoding="off", model=_smollm2()) as mem:
        rec = mem.remember("I moved to Lyon last May.", user_id="u1", session_id="s1")
        dog = mem.remember("My dog is called Rex.", user_id="u1", session_id="s1")
        yield {"mem": mem, "rec": rec, "dog": dog}


@contextlib.contextmanager
def _store_parts(root: Path) -> Iterator[dict[str, Any]]:
    """:func:`_store`'s, the facade's parts that the examples of their modules use by name, and ``row``: ``rec``'s
    catalog row."""
    with _store(root) as built:
        mem = built["mem"]
        yield built | {"store": mem._store, "bank": mem._bank, "config": mem.config, "kb": mem._kb,
                       "consolidator": mem._consolidator, "reads": mem._reads, "forgetting": mem._forgetting,
                       "writer": mem._writer, "answer": mem._answer,
                       "row": mem._store.catalog.get([built["rec"].id])[0]}


@contextlib.contextmanager
def _sessions(root: Path) -> Iterator[dict[str, Any]]:
    """:func:`_store`'s, and ``mgr``: its session manager."""
    with _store(root) as built:
        yield built | {"mgr": built["mem"].sessions}


@contextlib.contextmanager
def _session_parts(root: Path) -> Iterator[dict[str, Any]]:
    """:func:`_store`'s, and the parts of its session manager that the examples of their modules use by name."""
    with _store(root) as built:
        sessions = built["mem"].sessions
        yield built | {"registry": sessions._reg, "leasing": sessions._leasing, "moves": sessions._moves,
                       "hot": sessions.hot, "warm": sessions.warm, "cold": sessions.cold, "store": sessions.store,
                       "config": sessions.config}


@contextlib.contextmanager
def _onnx_query(root: Path) -> Iterator[dict[str, Any]]:
    """``encoder``: the bundled MiniLM's ONNX query encoder (exported once into the default cache)."""
    from agentmem.config import default_cache_dir
    from agentmem.embed.minilm import MiniLMEmbedder
    from agentmem.embed.onnx_query import OnnxQueryEncoder

    yield {"encoder": OnnxQueryEncoder.for_model(MiniLMEmbedder().model, cache_dir=default_cache_dir())}


# module -> what its examples find already built (doctest globals), made anew for each example
SETUP: dict[str, Callable[[Path], AbstractContextManager[dict[str, Any]]]] = {
    **dict.fromkeys(["agentmem.memory", "agentmem.types", "agentmem.aio", "agentmem.export_import",
                     "agentmem.sessions", "agentmem.sessions.session"], _store),
    **dict.fromkeys(["agentmem.answer", "agentmem.bank", "agentmem.forgetting", "agentmem.reads", "agentmem.write",
                     "agentmem.entries.store", "agentmem.entries.context_vectors", "agentmem.consolidate.store_parts"],
                    _store_parts),
    "agentmem.sessions.manager": _sessions,
    **dict.fromkeys(["agentmem.sessions.leasing", "agentmem.sessions.moves", "agentmem.sessions.registry",
                     "agentmem.sessions.worker"], _session_parts),
    "agentmem.embed.onnx_query": _onnx_query,
}

# module -> the server its examples use: its URL from tests/servers.py's fixture of that name (a fresh database, a
# flushed Redis), in their globals under the fixture's name less "fresh_" (skipped with the reason where the server
# cannot start here; a failure under CI)
SERVERS: dict[str, str] = {
    **dict.fromkeys(["agentmem.backends.redis_admission", "agentmem.backends.redis_blobs",
                     "agentmem.backends.redis_common", "agentmem.backends.redis_sessions"], "fresh_redis_url"),
    **dict.fromkeys(["agentmem.backends.postgres", "agentmem.backends.pgvector"], "fresh_postgres_url"),
    "agentmem.backends.chroma_http": "fresh_chroma_http_url",
}


def _illustrative() -> frozenset[str]:
    lines = (line.strip() for line in ILLUSTRATIVE_LIST.read_text().splitlines())
    return frozenset(line for line in lines if line and not line.startswith("#"))


def _skips(test: doctest.DocTest) -> bool:
    """Whether a line of the example is marked ``# doctest: +SKIP`` (so not all of it runs)."""
    return any(example.options.get(doctest.SKIP) for example in test.examples)


def _examples(module_name: str) -> list[doctest.DocTest]:
    """The module's docstring examples that have at least one example line (as pytest's doctest plugin finds them)."""
    module = importlib.import_module(module_name)
    return [test for test in doctest.DocTestFinder().find(module, module_name) if test.examples]


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                request: pytest.FixtureRequest) -> None:
    monkeypatch.chdir(tmp_path)
    illustrative = _illustrative()
    server = SERVERS.get(module_name)
    urls = {server.removeprefix("fresh_"): request.getfixturevalue(server)} if server else {}
    failures, skipped, now_passing = [], [], []
    setup = SETUP.get(module_name)
    for number, test in enumerate(_examples(module_name)):
        report = io.StringIO()
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        with setup(tmp_path / f"setup-{number}") if setup else contextlib.nullcontext({}) as built:
            test.globs.update(built | urls)
            result = runner.run(test, out=report.write)
        if test.name in illustrative:
            if not result.failed and not _skips(test):
                now_passing.append(test.name)
        elif result.failed:
            failures.append(report.getvalue())
        elif _skips(test):
            skipped.append(test.name)
    assert not failures, "docstring examples that no longer match the code:\n" + "\n".join(failures)
    assert not skipped, f"examples with lines that never run (+SKIP): make them run or list them in " \
                        f"{ILLUSTRATIVE_LIST.name}: {skipped}"
    assert not now_passing, f"these examples run now: delete them from {ILLUSTRATIVE_LIST.name}: {now_passing}"


def test_every_listed_example_exists() -> None:
    names = {test.name for module_name in MODULES for test in _examples(module_name)}
    missing = sorted(_illustrative() - names)
    assert not missing, f"{ILLUSTRATIVE_LIST.name} lists examples that are gone (delete their lines): {missing}"
