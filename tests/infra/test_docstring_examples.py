"""Every docstring example in the package runs, so a docstring cannot drift from the code it describes.

Each module's examples run as ``python -m doctest`` would run them (``ELLIPSIS`` allowed), in a fresh temporary
directory, because several examples open a store at a relative path. Examples that are fragments by design (they
use a loaded model or engine the example does not build) are listed by name in ``illustrative_doctests.txt``; a
listed example that starts to pass fails here too, so that list only shrinks.
"""

from __future__ import annotations

import doctest
import importlib
import io
import pkgutil
from pathlib import Path

import pytest

import agentmem

ILLUSTRATIVE_LIST = Path(__file__).with_name("illustrative_doctests.txt")
MODULES = sorted(info.name for info in pkgutil.walk_packages(agentmem.__path__, "agentmem."))


def _illustrative() -> frozenset[str]:
    lines = (line.strip() for line in ILLUSTRATIVE_LIST.read_text().splitlines())
    return frozenset(line for line in lines if line and not line.startswith("#"))


def _examples(module_name: str) -> list[doctest.DocTest]:
    """The module's docstring examples that have at least one example line (as pytest's doctest plugin finds them)."""
    module = importlib.import_module(module_name)
    return [test for test in doctest.DocTestFinder().find(module, module_name) if test.examples]


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    illustrative = _illustrative()
    failures, now_passing = [], []
    for test in _examples(module_name):
        report = io.StringIO()
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        result = runner.run(test, out=report.write)
        if test.name in illustrative:
            if not result.failed:
                now_passing.append(test.name)
        elif result.failed:
            failures.append(report.getvalue())
    assert not failures, "docstring examples that no longer match the code:\n" + "\n".join(failures)
    assert not now_passing, f"these examples run now: delete them from {ILLUSTRATIVE_LIST.name}: {now_passing}"


def test_every_listed_example_exists() -> None:
    names = {test.name for module_name in MODULES for test in _examples(module_name)}
    missing = sorted(_illustrative() - names)
    assert not missing, f"{ILLUSTRATIVE_LIST.name} lists examples that are gone (delete their lines): {missing}"
