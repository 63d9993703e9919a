"""A real agentmem server for the server tests: the INSTALLED ``agentmem`` entry point run in a subprocess on
127.0.0.1 (a free port), with a tiny random model saved to disk (``--model DIR``), real SQLite / Chroma / MiniLM,
and two API keys made with ``agentmem keys add``: one for u1 (+ u3), one for u2.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from server_helpers import Server, run_cli, start_server, stop_server


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from agentmem.kv.testing import tiny_causal_lm

    path = tmp_path_factory.mktemp("tiny-llama")
    model, tok = tiny_causal_lm("llama", seed=0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def wide_model_dir(tmp_path_factory) -> Path:
    """The tiny model reading 4,096 positions instead of 512 (RoPE: positions are computed, not learned): room for
    the tool instructions (~700 of its byte tokens) or answers of a thousand tokens."""
    from agentmem.kv.testing import tiny_causal_lm

    path = tmp_path_factory.mktemp("tiny-wide")
    model, tok = tiny_causal_lm("llama", seed=0)
    model.config.max_position_embeddings = 4096
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def server(tmp_path_factory, tiny_model_dir) -> Iterator[Server]:
    path = tmp_path_factory.mktemp("served") / "store"
    key_u1 = run_cli("keys", "add", "--path", str(path), "--user", "u1", "--user", "u3").stdout.strip()
    key_u2 = run_cli("keys", "add", "--path", str(path), "--user", "u2").stdout.strip()
    proc, url = start_server(path, tiny_model_dir, "--fidelity-share", "1.0", "--model-id", "tiny-llama")
    yield Server(url=url, path=path, key_u1=key_u1, key_u2=key_u2, proc=proc)
    stop_server(proc)
