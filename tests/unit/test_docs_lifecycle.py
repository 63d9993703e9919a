"""docs/lifecycle.md's python code blocks run as written (in a fresh directory, each in its own namespace)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "lifecycle.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_the_doc_has_code_to_run() -> None:
    assert len(BLOCKS) >= 2 and any("restore(" in b for b in BLOCKS)


@pytest.mark.parametrize("n", range(len(BLOCKS)))
def test_a_code_block_of_docs_lifecycle_runs(n: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[n], f"{DOC}, python block {n + 1}", "exec"), {"__name__": "docs_lifecycle"})
