"""The MCP server through the official SDK's own client: over stdio (``agentmem mcp``) and streamable HTTP (/mcp)."""

from __future__ import annotations

import json

import anyio
import httpx
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from server_helpers import agentmem_exe, cli_env


def _data(result) -> dict:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


async def _exercise(client: Client, user: str | None) -> None:
    names = {t.name for t in (await client.list_tools()).tools}
    assert {"remember", "recall", "forget"} <= names
    args = {"user_id": user} if user else {}
    rec = _data(await client.call_tool("remember", {"text": "The boiler code is 4417.", **args}))
    hits = _data(await client.call_tool("recall", {"query": "what is the boiler code?", "k": 3, **args}))["hits"]
    assert hits[0]["id"] == rec["id"] and "4417" in hits[0]["text"]
    assert _data(await client.call_tool("forget", {"entry_id": rec["id"]}))["deleted"] == 1
    hits = _data(await client.call_tool("recall", {"query": "boiler code", "k": 3, **args}))["hits"]
    assert rec["id"] not in [h["id"] for h in hits]


def test_mcp_over_stdio(tmp_path):
    params = StdioServerParameters(command=agentmem_exe(), args=["mcp", "--path", str(tmp_path / "store"),
                                                                 "--user", "u1"], env=cli_env())

    async def main() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            await _exercise(client, None)  # the process's only user is the default
            denied = await client.call_tool("recall", {"query": "x", "user_id": "u2"})
            assert denied.is_error

    anyio.run(main)


def test_mcp_over_streamable_http_with_keys(server):
    url = f"{server.url}/mcp/"

    async def main() -> None:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {server.key_u2}"})
        async with Client(streamable_http_client(url, http_client=http), read_timeout_seconds=120) as client:
            await _exercise(client, "u2")
            denied = await client.call_tool("recall", {"query": "x", "user_id": "u1"})  # another tenant
            assert denied.is_error

    anyio.run(main)
    assert httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=120).status_code == 401
