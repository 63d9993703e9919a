"""The package's layout rules, checked on every run.

* import-linter's contracts in ``.importlinter`` (server, CLI and integrations → facade → parts → ports; only the
  factory builds backends; no import circles), run through its own CLI, ``lint-imports``, as CI runs it;
* no module outside ``agentmem/backends/`` (and the factory) imports a database client (``sqlalchemy``,
  ``chromadb``, ``redis``), found by walking every module's syntax tree, imports inside functions and
  ``TYPE_CHECKING`` blocks included;
* no part probes a port object for what it is or what it has (``getattr`` / ``hasattr`` / ``isinstance`` on a
  catalog, vector index, blob store, embedder or session store, or against a port's or a backend's class): the
  factory decides a backend's optional abilities once (``agentmem.ports.abilities``, ``factory.StoreParts``).

Known exceptions are listed by name with what is left to do, here and in ``.importlinter`` (``ignore_imports``),
never skipped silently: a listed exception that no longer happens fails too, so the lists only shrink.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "agentmem"
CLIENTS = ("sqlalchemy", "chromadb", "redis")
# Where database clients belong: the backends, and the factory that builds them.
CLIENT_HOMES = ("agentmem/backends/", "agentmem/factory.py")
# Modules outside those homes that still import a client, and what is left to move them (issue #36).
KNOWN_CLIENT_IMPORTS: dict[str, str] = {}


def _lint_imports(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """import-linter's CLI (the one beside this interpreter) in ``cwd``, analysing the code found there."""
    lint = Path(sys.executable).with_name("lint-imports")
    assert lint.is_file(), f"{lint} missing: import-linter comes with the dev extra (pip install -e '.[dev]')"
    paths = [str(cwd), str(cwd / "integrations" / "langgraph"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    return subprocess.run([str(lint), "--no-cache", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_import_contracts_are_kept() -> None:
    done = _lint_imports(REPO)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_lint_imports_catches_a_circle_and_a_reach_into_a_backend(tmp_path: Path) -> None:
    # The contract types .importlinter relies on, on a package that breaks each: the check can fail.
    pkg = tmp_path / "toy"
    (pkg / "backends").mkdir(parents=True)
    for name, text in {"__init__.py": "", "a.py": "from toy import b\n", "b.py": "from toy import a\n",
                       "factory.py": "", "backends/__init__.py": "", "backends/db.py": "",
                       "part.py": "from toy.backends import db\n"}.items():
        (pkg / name).write_text(text)
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_packages =\n    toy\n\n"
        "[importlinter:contract:acyclic]\nname = no circles\ntype = acyclic_siblings\nancestors =\n    toy\n\n"
        "[importlinter:contract:backends]\nname = only the factory builds backends\ntype = protected\n"
        "protected_modules =\n    toy.backends\nallowed_importers =\n    toy.factory\n")
    done = _lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout
    assert "toy.part -> toy.backends.db" in done.stdout
    assert ".a -> .b" in done.stdout or ".b -> .a" in done.stdout


def _client_imports(path: Path) -> set[str]:
    """The database clients ``path`` imports anywhere in its syntax tree."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.update(name.split(".")[0] for name in names if name.split(".")[0] in CLIENTS)
    return found


def _importers_of_clients() -> dict[str, set[str]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if not rel.startswith(CLIENT_HOMES) and (clients := _client_imports(path)):
            out[rel] = clients
    return out


def _assert_only_known(found: dict[Any, Any], known: dict[Any, str], broken: str, list_name: str) -> None:
    """Every finding is a listed exception, and every listed exception still happens (the lists only shrink)."""
    unexpected = {k: v for k, v in found.items() if k not in known}
    assert not unexpected, f"{broken}: {unexpected}"
    cleared = sorted(set(known) - set(found))
    assert not cleared, f"no longer happen: remove them from {list_name}: {cleared}"


def test_database_clients_are_imported_only_by_backends() -> None:
    _assert_only_known({rel: sorted(c) for rel, c in _importers_of_clients().items()}, KNOWN_CLIENT_IMPORTS,
                       "database clients imported outside agentmem/backends/ and the factory", "KNOWN_CLIENT_IMPORTS")


@pytest.mark.parametrize("source, clients", [
    ("import sqlalchemy as sa\n", {"sqlalchemy"}),
    ("def f():\n    from chromadb.config import Settings\n", {"chromadb"}),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import redis.asyncio\n", {"redis"}),
    ("from . import redis_common\nimport redisearch\n", set()),
])
def test_the_client_walk_sees_every_kind_of_import(tmp_path: Path, source: str, clients: set[str]) -> None:
    module = tmp_path / "m.py"
    module.write_text(source)
    assert _client_imports(module) == clients


# --- no probing of port objects outside the factory --------------------------------------------------------------
# Names the parts give port objects (the attribute or variable holding a Catalog, VectorIndex, BlobStore, Embedder or
# SessionTierStore), and the classes a probe would test against: the ports, their abilities, the backends'.
PORT_OBJECTS = {"catalog", "vectors", "blobs", "embedder", "index", "session_store", "cold_store"}
PORT_CLASS_SUFFIXES = ("Catalog", "VectorIndex", "Index", "BlobStore", "SessionStore", "TierStore", "Embedder",
                       "JoinsCatalogTransaction")
PROBES = ("getattr", "hasattr", "isinstance")
# Where probing belongs: the factory, and the backends (each builder checks what it is handed to build on).
PROBE_HOMES = ("agentmem/backends/", "agentmem/factory.py")
# Probes that remain, by module and function, with the reason they stay.
KNOWN_PROBES: dict[tuple[str, str], str] = {}


def _names_a_port(node: ast.expr) -> bool:
    """Whether an expression is a port object by its name (``catalog``, ``self.store.vectors``, ``vectors_``...)."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    return name is not None and name.strip("_") in PORT_OBJECTS


def _names_a_port_class(node: ast.expr) -> bool:
    names = node.elts if isinstance(node, ast.Tuple) else [node]
    return any((n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "")).endswith(PORT_CLASS_SUFFIXES)
               for n in names)


def _probes(path: Path) -> set[str]:
    """``function_name`` of every function in ``path`` that probes a port object (module level: ``<module>``)."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()

    def walk(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id in PROBES \
                    and child.args and (_names_a_port(child.args[0]) or (
                        child.func.id == "isinstance" and len(child.args) > 1 and _names_a_port_class(child.args[1]))):
                found.add(inner)
            walk(child, inner)

    walk(tree, "<module>")
    return found


def _port_probes() -> set[tuple[str, str]]:
    out = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if not rel.startswith(PROBE_HOMES):
            out.update((rel, fn) for fn in _probes(path))
    return out


def test_no_part_probes_a_port_object() -> None:
    _assert_only_known(dict.fromkeys(_port_probes(), "probe"), KNOWN_PROBES,
                       "getattr/hasattr/isinstance on a port object outside the factory (declare the ability in "
                       "agentmem/ports/abilities.py and decide it in factory.build_store_parts)", "KNOWN_PROBES")


@pytest.mark.parametrize("source, probes", [
    ("def f(catalog):\n    return getattr(catalog, 'engine', None)\n", {"f"}),
    ("def g(self):\n    return hasattr(self.store.vectors, 'add_in')\n", {"g"}),
    ("def h(x):\n    return isinstance(x, (int, PostgresCatalog))\n", {"h"}),
    ("import inspect\nOK = isinstance(3, int)\ndef k(row):\n    return getattr(row, 'id')\n", set()),
])
def test_the_probe_walk_sees_each_kind_of_probe(tmp_path: Path, source: str, probes: set[str]) -> None:
    module = tmp_path / "m.py"
    module.write_text(source)
    assert _probes(module) == probes


# --- benchmarks/ hold the product's claims, through the public API -------------------------------------------------
BENCHMARKS = REPO / "benchmarks"
# Reaches into the product that remain in benchmarks/, by file and the expression, with what is left to do. Empty
# since benchmarks/scale.py writes its bulk through remember_many(vectors=...) and its per-part timing moved to
# research/scale_profile.py: a new entry needs a reason the public API cannot serve.
KNOWN_BENCHMARK_REACHES: dict[tuple[str, str], str] = {}

NAMEDTUPLE_API = ("_asdict", "_replace", "_fields", "_make")  # public methods of a namedtuple, despite the underscore


def _private_reaches(path: Path) -> set[str]:
    """What ``path`` reaches that is not public: an attribute with one leading underscore on anything but the
    script's own objects (``mem._store``; a namedtuple's ``_asdict`` is its public API), anything named ``_store``,
    and a private ``agentmem`` module or name imported."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if (owner not in ("self", "cls") and node.attr not in NAMEDTUPLE_API) or node.attr == "_store":
                found.add(ast.unparse(node))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "agentmem":
            found.update(f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")
                         or any(part.startswith("_") for part in node.module.split(".")))
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "agentmem"
                         and any(part.startswith("_") for part in a.name.split(".")))
    return found


def test_benchmarks_use_only_the_public_api() -> None:
    found = {(path.relative_to(REPO).as_posix(), reach): "reach" for path in sorted(BENCHMARKS.glob("*.py"))
             for reach in _private_reaches(path)}
    _assert_only_known(found, KNOWN_BENCHMARK_REACHES,
                       "a benchmark reaches past the public API (give the claim a public, documented path, or move "
                       "the measurement of an internal stage to research/)", "KNOWN_BENCHMARK_REACHES")


@pytest.mark.parametrize("source, reaches", [
    ("def f(mem):\n    return mem._store.vectors\n", {"mem._store"}),
    ("def f(mem):\n    return mem._recall('q', user_id='u', k=3, for_mount=True)\n", {"mem._recall"}),
    ("def f(mem):\n    st = mem.engine\n    return st._store\n", {"st._store"}),
    ("from agentmem.train import _kv\nimport agentmem._fs\n", {"agentmem.train._kv", "agentmem._fs"}),
    ("class T:\n    def f(self):\n        return self._rest, row._asdict()\n", set()),
    ("from agentmem import AgentMemory\ndef f(mem):\n    return mem.recall_for_mount('q', user_id='u')\n", set()),
])
def test_the_benchmark_walk_sees_each_kind_of_reach(tmp_path: Path, source: str, reaches: set[str]) -> None:
    module = tmp_path / "m.py"
    module.write_text(source)
    assert _private_reaches(module) == reaches
