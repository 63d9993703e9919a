"""The python blocks of README.md and docs/ run as written, on real components. The pages whose blocks other tests
run are listed in ``RUN_ELSEWHERE``; this file runs the rest, swapping only what a test machine must: the model
for a tiny one, a server's URL and key, PostgreSQL's URL. A block that outlines an API (signatures, not code to run)
is marked ``<!-- summary: an outline of the API, not code to run -->`` on the line above it, and
``test_every_python_block_is_run_or_marked`` fails for a new block that is neither."""

from __future__ import annotations

import asyncio
import re
import textwrap
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- summary: an outline of the API, not code to run -->"
# page -> the test that runs its python blocks (all of them unless a list of indices is given)
RUN_ELSEWHERE = {
    "README.md": ([0], "tests/integration/test_readme_quickstart.py"),
    "docs/lifecycle.md": (None, "tests/unit/test_docs_lifecycle.py"),
    "docs/recall.md": (None, "tests/unit/test_ranking_weights.py::test_the_docs_recall_page_runs"),
    "docs/langgraph.md": (None, "integrations/langgraph/tests/test_lg_docs.py"),
}
RUN_HERE = {"README.md": [1], "docs/agents.md": [0, 1], "docs/server.md": [0], "docs/sessions.md": [0]}


def python_blocks(page: str) -> list[tuple[str, bool]]:
    """``(code, marked as a summary)`` for every python block of ``page``, in order."""
    text = (ROOT / page).read_text(encoding="utf-8")
    return [(m.group(2), m.group(1) is not None)
            for m in re.finditer(r"(" + re.escape(MARK) + r"\n)?```python\n(.*?)```", text, flags=re.S)]


def block(page: str, index: int) -> str:
    code, marked = python_blocks(page)[index]
    assert not marked
    return code


def test_every_python_block_is_run_or_marked():
    pages = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
    unrun = []
    for page in pages:
        elsewhere = RUN_ELSEWHERE.get(page, ([], ""))[0]
        for i, (_, marked) in enumerate(python_blocks(page)):
            run = elsewhere is None or i in elsewhere or i in RUN_HERE.get(page, [])
            if not run and not marked:
                unrun.append(f"{page} python block {i + 1}")
            assert not (run and marked), f"{page} python block {i + 1} is run and marked as a summary"
    assert not unrun, f"run these in a test, or mark them as an API outline ({MARK}): {unrun}"


def test_readme_backends_block(tmp_path, monkeypatch, fresh_postgres_url):
    code = block("README.md", 1)
    assert "postgresql+psycopg://postgres@127.0.0.1:5432/agentmem" in code
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(code.replace("postgresql+psycopg://postgres@127.0.0.1:5432/agentmem", fresh_postgres_url), scope)
    with scope["mem"] as mem:
        rec = mem.remember("I moved to Lyon last May.", user_id="u1")
        assert [h.id for h in mem.recall("where do I live?", user_id="u1", k=1)] == [rec.id]
        assert type(mem._store.catalog).__name__ == "PostgresCatalog"


def test_agents_devices_block(tmp_path, monkeypatch, tiny_model_dir):
    code = block("docs/agents.md", 0)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(code.replace('"/models/Qwen2.5-1.5B-Instruct"', repr(str(tiny_model_dir))), scope)
    with scope["mem"] as mem:
        out = mem.generate("hi", user_id="u1", max_new_tokens=2)
        assert mem.config.device == "auto" and out.token_ids


def test_agents_async_block(tmp_path, monkeypatch, capsys, tiny_model_dir):
    code = block("docs/agents.md", 1)
    monkeypatch.chdir(tmp_path)
    tiny = f'AsyncAgentMemory("./memdata", model={str(tiny_model_dir)!r})'
    code = code.replace('AsyncAgentMemory("./memdata")', tiny)
    scope: dict = {}
    exec("async def main():\n" + textwrap.indent(code, "    ") + "\n    return hits, out, reply\n", scope)
    hits, out, reply = asyncio.run(scope["main"]())
    assert [h.text for h in hits][:1] == ["I moved to Lyon."] and out.token_ids and reply.token_ids


def test_sessions_block(tmp_path, monkeypatch, tiny_model_dir):
    from agentmem import AgentMemory

    monkeypatch.chdir(tmp_path)
    with AgentMemory("./memdata", model=str(tiny_model_dir)) as mem:
        scope = {"mem": mem}
        exec(block("docs/sessions.md", 0), scope)
        assert scope["r"].text is not None and mem.sessions.stats()


def test_server_openai_block(server, capsys):
    code = block("docs/server.md", 0)
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.key_u1}"}, timeout=120) as c:
        saved = c.post("/v1/memories", json={"text": "I live in Lyon.", "user_id": "u1"})
        saved.raise_for_status()
    code = code.replace('"http://127.0.0.1:8765/v1"', repr(f"{server.url}/v1")).replace('"am_..."',
                                                                                        repr(server.key_u1))
    exec(code, {})
    assert f"'id': '{saved.json()['id']}'" in capsys.readouterr().out  # the answer, then what was mounted
