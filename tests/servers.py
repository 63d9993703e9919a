"""Real servers for the tests: PostgreSQL + pgvector, Redis and Chroma, each on 127.0.0.1 in a temp dir.

Each server is started once per test session, waited on until it answers, and stopped by its PID at the end
(the data dir is removed). Outside CI a server that cannot start skips the tests that need it, with the reason;
with ``CI=true`` it fails them, so a CI run never passes by skipping its server tests.

The fixtures give URLs in the form ``MemoryConfig`` takes:

- ``postgres_url`` ``postgresql+psycopg://postgres@127.0.0.1:P/agentmem`` (pgvector created), and
  ``fresh_postgres_url``: a new, empty database (with pgvector) for one test.
- ``redis_url`` ``redis://127.0.0.1:P/0``, and ``fresh_redis_url``: the same server flushed before the test.
- ``chroma_http_url`` ``chroma+http://127.0.0.1:P``, and ``fresh_chroma_http_url``: every collection dropped first.

Run as a script, it starts all three for a developer and prints the URLs until Ctrl-C::

    .venv/bin/python -m tests.servers --dir ./.servers      # or: scripts/dev-servers
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import glob
import hashlib
import importlib.util
import itertools
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

START_TIMEOUT_S = 60.0
_RUNNING: list[Server] = []
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class ServerUnavailable(RuntimeError):
    """A server could not be found or started here; the message says what is missing."""


def in_ci() -> bool:
    """True when running under CI (``CI=true``), where a missing server is a failure, never a skip.

    Example:
        >>> isinstance(in_ci(), bool)
        True
    """
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    Example:
        >>> 0 < free_port() < 65536
        True
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """One started server process: its URL, PID, data dir and log, and how to stop it."""

    name: str
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    data_dir: Path
    log_path: Path
    stop_signal: int = signal.SIGTERM
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the server's log, for error messages."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, remove_data: bool = True) -> None:
        """Stop the process by its PID (``stop_signal``, then SIGKILL after 20 s) and remove its data dir.

        Example:
            >>> # srv = start_redis(Path(tempfile.mkdtemp())); srv.stop()
        """
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, self.stop_signal)
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        if self in _RUNNING:
            _RUNNING.remove(self)
        if remove_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)


@atexit.register
def _stop_all() -> None:
    # A crashed or interrupted session must not leave servers behind: stop whatever this process started.
    for srv in list(_RUNNING):
        srv.stop()


def _die_with_parent(stop_signal: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets ``stop_signal`` when the process that started it dies, however it dies
    (SIGKILL included, where no handler or atexit of ours runs). Linux only (``prctl(PR_SET_PDEATHSIG)``);
    elsewhere the signal handlers and atexit below are the only net."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child must not load anything
    except (OSError, AttributeError):
        return lambda: None
    parent = os.getpid()

    def arm() -> None:  # runs in the child, after fork and the user switch, before exec
        prctl(_PR_SET_PDEATHSIG, stop_signal, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody would ever stop this server
            os.kill(os.getpid(), stop_signal)

    return arm


def _launch(
    name: str, cmd: list[str], data_dir: Path, *, user: str | None = None, env: dict[str, str] | None = None,
    stop_signal: int = signal.SIGTERM,
) -> tuple[subprocess.Popen[bytes], Path]:
    log_path = data_dir.parent / f"{data_dir.name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            user=user,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # Ctrl-C in the terminal reaches pytest, which stops the server itself
            preexec_fn=_die_with_parent(stop_signal),
        )
    return proc, log_path


def _wait_until(srv: Server, ready: Callable[[], bool], timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if srv.proc.poll() is not None:
            srv.stop(remove_data=False)
            raise ServerUnavailable(f"{srv.name} exited with code {srv.proc.returncode}:\n{srv.log_tail()}")
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.1)
    srv.stop(remove_data=False)
    raise ServerUnavailable(f"{srv.name} did not answer within {timeout:.0f} s:\n{srv.log_tail()}")


# ---------------------------------------------------------------- Redis


def _redis_command(port: int, *args: str, timeout: float = 5.0) -> bytes:
    """Send one command in RESP and return the raw first reply line (enough for PING / FLUSHALL)."""
    parts = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"".join(parts))
        return s.recv(1024)


def start_redis(base_dir: Path) -> Server:
    """Start Debian's ``redis-server`` on a free loopback port, persistence off, data under ``base_dir``.

    Example:
        >>> # srv = start_redis(Path(tempfile.mkdtemp())); srv.url  -> 'redis://127.0.0.1:PORT/0'
    """
    exe = shutil.which("redis-server")
    if exe is None:
        raise ServerUnavailable("redis-server not found (Debian: apt-get install -y redis-server)")
    data_dir = base_dir / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [exe, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data_dir), "--save", "",
           "--appendonly", "no", "--daemonize", "no", "--databases", "16"]  # fmt: skip
    proc, log = _launch("redis", cmd, data_dir)
    srv = Server("redis", f"redis://127.0.0.1:{port}/0", port, proc, data_dir, log)
    _RUNNING.append(srv)
    _wait_until(srv, lambda: _redis_command(port, "PING").startswith(b"+PONG"))
    return srv


def flush_redis(srv: Server) -> None:
    """Empty every database of a test Redis server."""
    reply = _redis_command(srv.port, "FLUSHALL")
    if not reply.startswith(b"+OK"):
        raise ServerUnavailable(f"FLUSHALL failed: {reply!r}")


# ---------------------------------------------------------------- PostgreSQL + pgvector


def _postgres_bin_dir() -> Path:
    """The bin dir of a PostgreSQL that has pgvector: the ``pgserver`` wheel's first, else a Debian one."""
    candidates: list[Path] = []
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.submodule_search_locations:
        candidates.append(Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin")
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for bin_dir in candidates:
        if not (bin_dir / "postgres").exists():
            continue
        share = subprocess.run([str(bin_dir / "pg_config"), "--sharedir"], capture_output=True, text=True)
        if share.returncode == 0 and Path(share.stdout.strip(), "extension", "vector.control").exists():
            return bin_dir
    raise ServerUnavailable(
        "no PostgreSQL with pgvector found (pip install pgserver, which bundles both; it is in the dev extra)"
    )


def _postgres_os_user() -> str | None:
    """PostgreSQL refuses to run as root: as root, run it as the ``postgres`` user (created if missing)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "agentmem-pg"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--no-create-home", "agentmem-pg"], check=True, capture_output=True)
    return "agentmem-pg"


def runnable_bin_dir(bin_dir: Path, user: str | None) -> Path:
    """``bin_dir``, or a world-readable copy of its install tree if ``user`` cannot run the binaries there.

    PostgreSQL runs as a non-root user, who must reach the binaries: a checkout under ``/root`` (mode 0700) hides
    the venv's ``pgserver`` from it. The copy (bin, lib, share; ~30 MB) is made once per install and reused.

    Example:
        >>> # runnable_bin_dir(Path(".venv/.../pginstall/bin"), "postgres")
    """
    if user is None or _runs_as(bin_dir, user):
        return bin_dir
    tree = bin_dir.parent
    digest = hashlib.sha256(str(tree.resolve()).encode()).hexdigest()[:12]
    target = Path(tempfile.gettempdir()) / f"agentmem-pginstall-{digest}"
    if not (target / "bin" / "postgres").exists():
        staging = Path(tempfile.mkdtemp(prefix="agentmem-pginstall-"))
        for part in ("bin", "lib", "share"):
            shutil.copytree(tree / part, staging / part, symlinks=True)
        for root, dirs, files in os.walk(staging):
            for name in dirs + files:
                path = os.path.join(root, name)
                if os.path.islink(path):
                    continue
                mode = os.stat(path).st_mode
                readable = 0o555 if name in dirs or mode & 0o100 else 0o444  # dirs and executables: r-x for all
                os.chmod(path, mode | readable)
        os.chmod(staging, 0o755)
        try:
            os.rename(staging, target)
        except OSError:  # another test process made it first
            shutil.rmtree(staging, ignore_errors=True)
    if not _runs_as(target / "bin", user):
        raise ServerUnavailable(f"the PostgreSQL binaries cannot be run as {user!r}, even copied to {target}")
    return target / "bin"


def _runs_as(bin_dir: Path, user: str) -> bool:
    try:
        out = subprocess.run([str(bin_dir / "postgres"), "--version"], capture_output=True, user=user, timeout=30)
    except OSError:
        return False
    return out.returncode == 0


def _psql(srv: Server, database: str, sql: str) -> None:
    cmd = [srv.extra["psql"], "-h", "127.0.0.1", "-p", str(srv.port), "-U", "postgres", "-d", database,
           "-v", "ON_ERROR_STOP=1", "-q", "-c", sql]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise ServerUnavailable(f"psql failed on {database!r}: {out.stderr.strip()}")


def create_postgres_database(srv: Server, name: str) -> str:
    """Create database ``name`` with the pgvector extension on a test server; return its SQLAlchemy URL.

    Example:
        >>> # create_postgres_database(srv, "t1") -> 'postgresql+psycopg://postgres@127.0.0.1:PORT/t1'
    """
    _psql(srv, "postgres", f'CREATE DATABASE "{name}"')
    _psql(srv, name, "CREATE EXTENSION IF NOT EXISTS vector")
    return f"postgresql+psycopg://postgres@127.0.0.1:{srv.port}/{name}"


def start_postgres(base_dir: Path) -> Server:
    """initdb + start PostgreSQL (with pgvector) on a free loopback port; database ``agentmem`` is created.

    Durability is off (fsync, synchronous_commit, full_page_writes): these are throwaway test clusters.

    Example:
        >>> # srv = start_postgres(Path(tempfile.mkdtemp())); srv.url
        >>> # 'postgresql+psycopg://postgres@127.0.0.1:PORT/agentmem'
    """
    user = _postgres_os_user()
    bin_dir = runnable_bin_dir(_postgres_bin_dir(), user)
    data_dir = base_dir / "postgres"
    data_dir.mkdir(parents=True, exist_ok=True)
    if user is not None:
        # The server user must own its data dir and be able to reach it (pytest's temp root is mode 0700).
        os.chmod(base_dir, 0o755)
        shutil.chown(data_dir, user, user)
    fresh = not (data_dir / "PG_VERSION").exists()  # a developer's --dir is reused across runs
    if fresh:
        init = subprocess.run(
            [str(bin_dir / "initdb"), "-D", str(data_dir), "-U", "postgres", "--auth=trust", "-E", "UTF8",
             "--no-sync"], capture_output=True, text=True, user=user, timeout=120,
        )  # fmt: skip
        if init.returncode != 0:
            raise ServerUnavailable(f"initdb failed: {init.stderr.strip()[-2000:]}")
    port = free_port()
    cmd = [str(bin_dir / "postgres"), "-D", str(data_dir), "-h", "127.0.0.1", "-p", str(port), "-k", str(data_dir),
           "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
           "-c", "max_connections=200"]  # fmt: skip
    proc, log = _launch("postgres", cmd, data_dir, user=user, stop_signal=signal.SIGINT)
    # SIGINT is PostgreSQL's "fast" shutdown: it does not wait for clients to disconnect (SIGTERM would).
    srv = Server("postgres", "", port, proc, data_dir, log, stop_signal=signal.SIGINT)
    srv.extra["psql"] = str(bin_dir / "psql")
    _RUNNING.append(srv)
    ready = [str(bin_dir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres"]
    _wait_until(srv, lambda: subprocess.run(ready, capture_output=True).returncode == 0)
    if fresh:
        srv.url = create_postgres_database(srv, "agentmem")
    else:
        srv.url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/agentmem"
    return srv


# ---------------------------------------------------------------- Chroma server


def _http_json(method: str, url: str, body: object | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def start_chroma(base_dir: Path) -> Server:
    """Start Chroma's server (``chroma run``) on a free loopback port, persisting under ``base_dir``.

    Example:
        >>> # srv = start_chroma(Path(tempfile.mkdtemp())); srv.url  -> 'chroma+http://127.0.0.1:PORT'
    """
    exe = shutil.which("chroma") or str(Path(sys.executable).with_name("chroma"))
    if not Path(exe).exists():
        raise ServerUnavailable("the `chroma` command was not found (it comes with the chromadb package)")
    data_dir = base_dir / "chroma"
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [exe, "run", "--path", str(data_dir), "--host", "127.0.0.1", "--port", str(port)]
    proc, log = _launch("chroma", cmd, data_dir, env={"ANONYMIZED_TELEMETRY": "False"})
    srv = Server("chroma", f"chroma+http://127.0.0.1:{port}", port, proc, data_dir, log)
    srv.extra["http"] = f"http://127.0.0.1:{port}"
    _RUNNING.append(srv)
    _wait_until(srv, lambda: _http_json("GET", f"{srv.extra['http']}/api/v2/heartbeat") is not None)
    return srv


def clear_chroma(srv: Server) -> None:
    """Drop every collection of the default tenant / database of a test Chroma server."""
    base = f"{srv.extra['http']}/api/v2/tenants/default_tenant/databases/default_database/collections"
    collections = _http_json("GET", f"{base}?limit=100000")
    for col in collections if isinstance(collections, list) else []:
        _http_json("DELETE", f"{base}/{col['name']}")


# ---------------------------------------------------------------- pytest fixtures


def _unavailable(exc: Exception) -> None:
    """Skip with the reason outside CI; fail under CI (a missing server must never pass as a skip)."""
    msg = f"server unavailable: {exc}"
    if in_ci():
        pytest.fail(msg + "\n(CI=true: a missing server is a failure)", pytrace=False)
    pytest.skip(msg)


def _server_fixture(start: Callable[[Path], Server], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # tempfile, not tmp_path_factory: pytest's temp root is private to root, and PostgreSQL runs as another user.
    base = Path(tempfile.mkdtemp(prefix="agentmem-srv-"))
    try:
        srv = start(base)
    except (ServerUnavailable, OSError, subprocess.SubprocessError) as exc:
        shutil.rmtree(base, ignore_errors=True)
        _unavailable(exc)
        raise  # unreachable: skip/fail raise
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The session's PostgreSQL (+ pgvector) server."""
    yield from _server_fixture(start_postgres, tmp_path_factory)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The session's Redis server."""
    yield from _server_fixture(start_redis, tmp_path_factory)


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The session's Chroma server."""
    yield from _server_fixture(start_chroma, tmp_path_factory)


@pytest.fixture(scope="session")
def postgres_url(postgres_server: Server) -> str:
    """SQLAlchemy URL of database ``agentmem`` (pgvector created), shared by the whole session."""
    return postgres_server.url


@pytest.fixture(scope="session")
def redis_url(redis_server: Server) -> str:
    """``redis://127.0.0.1:P/0`` of the session's Redis, shared by the whole session."""
    return redis_server.url


@pytest.fixture(scope="session")
def chroma_http_url(chroma_server: Server) -> str:
    """``chroma+http://127.0.0.1:P`` of the session's Chroma server, shared by the whole session."""
    return chroma_server.url


_db_counter = itertools.count(1)


@pytest.fixture
def fresh_postgres_url(postgres_server: Server) -> str:
    """A new empty database (with pgvector) on the session's PostgreSQL, for one test."""
    return create_postgres_database(postgres_server, f"t{os.getpid()}_{next(_db_counter)}")


@pytest.fixture
def fresh_redis_url(redis_server: Server) -> str:
    """The session's Redis, flushed before this test."""
    flush_redis(redis_server)
    return redis_server.url


@pytest.fixture
def fresh_chroma_http_url(chroma_server: Server) -> str:
    """The session's Chroma server with every collection dropped before this test."""
    clear_chroma(chroma_server)
    return chroma_server.url


# ---------------------------------------------------------------- for developers: one command


def _exit_on(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through main's finally, which stops the servers


def main(argv: list[str] | None = None) -> int:
    """Start PostgreSQL + pgvector, Redis and Chroma on loopback, print their URLs, stop them on Ctrl-C.

    Every way out stops them: Ctrl-C, SIGINT even when the shell started this in the background (it then ignores
    SIGINT, so a handler is installed explicitly), SIGTERM and SIGHUP (whose default would end Python without its
    ``finally`` or atexit), an error while starting; and SIGKILL through the children's parent-death signal.

    Example:
        >>> # python -m tests.servers --dir ./.servers
    """
    ap = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=None, help="where the servers keep data (default: a temp dir)")
    ap.add_argument("--only", nargs="*", choices=["postgres", "redis", "chroma"], default=None)
    args = ap.parse_args(argv)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on)
    base = (args.dir or Path(tempfile.mkdtemp(prefix="agentmem-srv-"))).resolve()
    base.mkdir(parents=True, exist_ok=True)
    starters = {"postgres": start_postgres, "redis": start_redis, "chroma": start_chroma}
    try:
        for name in args.only or list(starters):
            srv = starters[name](base)
            print(f"{name:9s} {srv.url}   (pid {srv.pid}, data {srv.data_dir})", flush=True)
        print("Ctrl-C stops them" + (f" (data kept in {base})." if args.dir else "."), flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        for srv in list(_RUNNING):
            srv.stop(remove_data=args.dir is None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
