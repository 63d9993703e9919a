"""The real-server fixtures answer: PostgreSQL has pgvector, Redis stores, Chroma's server takes a collection."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.servers import Server, _redis_command, in_ci, start_redis


def test_postgres_has_pgvector(postgres_server: Server, fresh_postgres_url: str) -> None:
    db = fresh_postgres_url.rsplit("/", 1)[1]
    out = subprocess.run(
        [postgres_server.extra["psql"], "-h", "127.0.0.1", "-p", str(postgres_server.port), "-U", "postgres",
         "-d", db, "-tA", "-c", "SELECT '[1,2,3]'::vector <-> '[1,2,4]'::vector"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert float(out.stdout.strip()) == pytest.approx(1.0)
    assert postgres_server.url.startswith("postgresql+psycopg://postgres@127.0.0.1:")


def test_redis_set_get(fresh_redis_url: str) -> None:
    redis = pytest.importorskip("redis")
    r = redis.Redis.from_url(fresh_redis_url)
    r.set("k", b"v")
    assert r.get("k") == b"v"
    assert r.dbsize() == 1


def test_fresh_redis_is_empty(fresh_redis_url: str) -> None:
    redis = pytest.importorskip("redis")
    assert redis.Redis.from_url(fresh_redis_url).dbsize() == 0


def test_chroma_server_takes_a_collection(fresh_chroma_http_url: str, chroma_server: Server) -> None:
    import chromadb

    client = chromadb.HttpClient(host="127.0.0.1", port=chroma_server.port)
    col = client.create_collection("smoke")
    col.add(ids=["a"], embeddings=[[1.0, 0.0, 0.0]], documents=["x"])
    assert col.query(query_embeddings=[[1.0, 0.0, 0.0]], n_results=1)["ids"] == [["a"]]


def test_server_stops_by_pid(tmp_path: Path) -> None:
    srv = start_redis(tmp_path)
    pid, port = srv.pid, srv.port
    assert _redis_command(port, "PING").startswith(b"+PONG")
    srv.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_missing_server_fails_under_ci(tmp_path: Path) -> None:
    # A conftest-free pytest run whose server cannot start: skipped outside CI, failed (exit 1) with CI=true.
    test = tmp_path / "test_missing.py"
    test.write_text(
        "import pytest\n"
        "from tests.servers import ServerUnavailable, _server_fixture\n"
        "def _boom(base):\n    raise ServerUnavailable('no such server')\n"
        "@pytest.fixture\ndef srv(tmp_path_factory):\n    yield from _server_fixture(_boom, tmp_path_factory)\n"
        "def test_it(srv):\n    pass\n"
    )
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for ci, expected_rc, word in (("false", 0, "1 skipped"), ("true", 1, "1 error")):
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(test)],
            capture_output=True, text=True, env={**env, "CI": ci}, cwd=tmp_path,
        )  # fmt: skip
        assert out.returncode == expected_rc, out.stdout + out.stderr
        assert word in out.stdout
    assert "CI=true: a missing server is a failure" in out.stdout


def test_in_ci_reads_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    assert in_ci()
    monkeypatch.setenv("CI", "")
    assert not in_ci()


@pytest.mark.skipif(os.geteuid() != 0, reason="the copy is only made when root runs PostgreSQL as another user")
def test_postgres_binaries_hidden_from_the_server_user_are_copied(tmp_path: Path) -> None:
    # CI may clone under /root (mode 0700): the server user cannot reach the venv's pgserver binaries there.
    from tests.servers import _postgres_bin_dir, _postgres_os_user, _runs_as, runnable_bin_dir

    user = _postgres_os_user()
    src = _postgres_bin_dir().parent
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    os.chmod(tmp_path, 0o700)
    for part in ("bin", "lib", "share"):
        shutil.copytree(src / part, hidden / "pginstall" / part, symlinks=True)
    assert user is not None and not _runs_as(hidden / "pginstall" / "bin", user)
    usable = runnable_bin_dir(hidden / "pginstall" / "bin", user)
    assert usable != hidden / "pginstall" / "bin" and _runs_as(usable, user)
    shutil.rmtree(usable.parent)


def _dev_servers(tmp_path: Path, *only: str) -> tuple[subprocess.Popen[str], dict[str, int]]:
    """``python -m tests.servers`` as a shell starts a background job (``make servers &``: SIGINT ignored), and the
    pid of each server it printed."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.servers", "--dir", str(tmp_path / "srv"), "--only", *only],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=repo,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    pids: dict[str, int] = {}
    for line in proc.stdout:  # type: ignore[union-attr]
        if "(pid " in line:
            pids[line.split()[0]] = int(line.split("(pid ", 1)[1].split(",", 1)[0])
        if line.startswith("Ctrl-C stops them"):
            return proc, pids
    raise AssertionError(f"tests.servers exited {proc.wait()} before its servers were up")


def _gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["SIGINT-in-background", "SIGTERM", "SIGKILL"])
def test_dev_servers_stop_their_children_on_every_exit(tmp_path: Path, signum: int) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    proc, pids = _dev_servers(tmp_path, "redis")
    try:
        os.kill(proc.pid, signum)
        proc.wait(timeout=60)
        assert _gone(pids["redis"]), f"redis (pid {pids['redis']}) outlived tests.servers after {signum!r}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
