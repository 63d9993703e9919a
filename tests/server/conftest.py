"""A real agentmem server for the server tests: the INSTALLED ``agentmem`` entry point run in a subprocess on
127.0.0.1 (a free port), with a tiny random model saved to disk (``--model DIR``), real SQLite / Chroma / MiniLM,
and two API keys made with ``agentmem keys add``: one for u1 (+ u3), one for u2.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def agentmem_exe() -> str:
    """The installed console script of the interpreter running the tests."""
    exe = Path(sys.executable).with_name("agentmem")
    found = str(exe) if exe.exists() else shutil.which("agentmem")
    if not found:
        pytest.fail("the agentmem console script is not installed (pip install -e '.[server]')")
    return found


def cli_env() -> dict[str, str]:
    """The environment for CLI subprocesses: this checkout's sources first (the editable install may point
    at another one), no hub access."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "integrations" / "langgraph"),
                                         env.get("PYTHONPATH", "")])
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", ANONYMIZED_TELEMETRY="False")
    env.pop("AGENTMEM_ENCRYPTION_KEY", None)
    return env


def run_cli(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([agentmem_exe(), *args], capture_output=True, text=True, env=cli_env(), timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"agentmem {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from agentmem.kv.testing import tiny_causal_lm

    path = tmp_path_factory.mktemp("tiny-llama")
    model, tok = tiny_causal_lm("llama", seed=0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@dataclass
class Server:
    url: str
    path: Path
    key_u1: str  # may touch u1 and u3
    key_u2: str
    proc: subprocess.Popen

    def client(self, key: str | None = None, **kw) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=120, **kw)


def start_server(path: Path, model_dir: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """Start ``agentmem serve`` and wait until /healthz answers."""
    port = free_port()
    log = open(path.parent / f"server-{port}.log", "w")
    proc = subprocess.Popen([agentmem_exe(), "serve", "--path", str(path), "--model", str(model_dir),
                             "--port", str(port), *extra], env=cli_env(), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}: {Path(log.name).read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise AssertionError("server did not start within 180 s")


@pytest.fixture(scope="session")
def server(tmp_path_factory, tiny_model_dir) -> Iterator[Server]:
    path = tmp_path_factory.mktemp("served") / "store"
    key_u1 = run_cli("keys", "add", "--path", str(path), "--user", "u1", "--user", "u3").stdout.strip()
    key_u2 = run_cli("keys", "add", "--path", str(path), "--user", "u2").stdout.strip()
    proc, url = start_server(path, tiny_model_dir, "--fidelity-share", "1.0", "--model-id", "tiny-llama")
    yield Server(url=url, path=path, key_u1=key_u1, key_u2=key_u2, proc=proc)
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
