"""The README's quickstart (its first python block), run as written on the embedded defaults, does what it shows:
the memory it stores is recalled, and both the one-shot answer and the session's first turn mount it (the default
mount threshold keeps a memory that answers the question; it once left "I moved to Lyon last May." out of "Where do
I live?", so the quickstart printed an empty mount). Slow: loads SmolLM2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentmem.kv.model import EMBEDDED_GGUF_FILE, embedded_model_dir

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_quickstart_mounts_the_memory_it_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not (embedded_model_dir() / EMBEDDED_GGUF_FILE).exists():
        pytest.skip("embedded SmolLM2 not installed")
    quickstart = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)[0]
    assert "mem.generate(" in quickstart and "chat.send(" in quickstart
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "readme_quickstart"}
    exec(compile(quickstart, f"{README}, first python block", "exec"), scope)
    lyon = [h.id for h in scope["hits"] if h.text == "I moved to Lyon last May."]
    assert lyon, [h.text for h in scope["hits"]]
    assert scope["out"].mounted == lyon  # generate("Where do I live?") mounts it
    assert scope["reply"].mounted == lyon  # and so does the session's "Remind me where I moved?"
    assert scope["out"].text and scope["reply"].text
