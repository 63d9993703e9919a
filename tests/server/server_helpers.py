"""Helpers of the server tests (used by conftest.py and the tests): run the INSTALLED ``agentmem`` entry point in a
subprocess with this checkout's sources, and start ``agentmem serve`` on a free loopback port.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
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
    env.pop("AGENTMEM_CONFIG", None)
    return env


def run_cli(*args: str, timeout: float = 120, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([agentmem_exe(), *args], capture_output=True, text=True, env={**cli_env(), **(env or {})},
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"agentmem {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def stop_server(proc: subprocess.Popen) -> None:
    """Stop a server started by :func:`start_server` (killed if it has not exited within 30 s)."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


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


