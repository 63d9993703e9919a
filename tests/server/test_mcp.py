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
    assert names >= {"remember", "remember_document", "recall", "list", "get", "update", "history", "forget"}
    args = {"user_id": user} if user else {}
    rec = _data(await client.call_tool("remember", {"text": "The boiler code is 4417.", **args}))
    assert rec["event"] == "ADD" and rec["superseded_ids"] == [] and rec["matched_id"] is None
    again = _data(await client.call_tool("remember", {"text": "the boiler code is 4417", **args}))
    assert (again["event"], again["matched_id"], again["id"]) == ("NOOP", rec["id"], rec["id"])
    hits = _data(await client.call_tool("recall", {"query": "what is the boiler code?", "k": 3, **args}))["hits"]
    assert hits[0]["id"] == rec["id"] and "4417" in hits[0]["text"]
    listed = _data(await client.call_tool("list", {**args}))["memories"]
    assert rec["id"] in [m["id"] for m in listed]
    assert _data(await client.call_tool("get", {"entry_id": rec["id"]}))["text"] == "The boiler code is 4417."
    changed = _data(await client.call_tool("update", {"entry_id": rec["id"], "text": "The boiler code is 9902.",
                                                      "reason": "new code"}))
    assert changed["version"] == 2 and changed["text"] == "The boiler code is 9902."
    versions = _data(await client.call_tool("history", {"entry_id": rec["id"]}))["versions"]
    assert [(v["op"], v["text"]) for v in versions] == [("add", "The boiler code is 4417."),
                                                         ("merge", "the boiler code is 4417"),
                                                         ("update", "The boiler code is 9902.")]
    assert versions[2]["reason"] == "new code"
    assert _data(await client.call_tool("forget", {"entry_id": rec["id"]}))["deleted"] == 1
    hits = _data(await client.call_tool("recall", {"query": "boiler code", "k": 3, **args}))["hits"]
    assert rec["id"] not in [h["id"] for h in hits]
    doc = _data(await client.call_tool("remember_document", {
        "text": "The boiler is serviced every May.\n\nIts pressure must stay between 1 and 1.5 bar.",
        "title": "Boiler manual", "max_words": 10, **args}))
    assert len(doc["ids"]) == 2 and doc["document_id"]
    hits = _data(await client.call_tool("recall", {"query": "what pressure should the boiler have?", "k": 1,
                                                   **args}))["hits"]
    assert hits[0]["id"] == doc["ids"][1] and hits[0]["text"].startswith("Boiler manual: Its pressure")
    diet = _data(await client.call_tool("remember", {"text": "I am vegetarian.", "kind": "profile", **args}))
    got = _data(await client.call_tool("get", {"entry_id": diet["id"]}))
    assert got["kind"] == "profile"
    await _refusals(client, args, rec["id"])


async def _refusals(client: Client, args: dict, gone_id: str) -> None:
    """Refused calls are tool errors carrying the typed error's name and message, not a bare "Error executing"."""
    missing = await client.call_tool("get", {"entry_id": gone_id})
    assert missing.is_error and f"NotFoundError: no memory entry with id {gone_id!r}" in missing.content[0].text
    empty = await client.call_tool("remember", {"text": "   ", **args})
    assert empty.is_error and "InvalidInputError" in empty.content[0].text and "text" in empty.content[0].text
    bad_k = await client.call_tool("recall", {"query": "boiler", "k": 0, **args})
    assert bad_k.is_error and "InvalidInputError" in bad_k.content[0].text and "k" in bad_k.content[0].text


def test_mcp_over_stdio(tmp_path):
    params = StdioServerParameters(command=agentmem_exe(), args=["mcp", "--path", str(tmp_path / "store"),
                                                                 "--user", "u1"], env=cli_env())

    async def main() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            await _exercise(client, None)  # the process's only user is the default
            denied = await client.call_tool("recall", {"query": "x", "user_id": "u2"})
            assert denied.is_error and "may not access user 'u2'" in denied.content[0].text

    anyio.run(main)


def test_mcp_over_streamable_http_with_keys(server):
    url = f"{server.url}/mcp/"
    u1_entry = httpx.post(f"{server.url}/v1/memories", headers={"Authorization": f"Bearer {server.key_u1}"},
                          json={"text": "u1's private note", "user_id": "u1"}, timeout=120).json()["id"]

    async def main() -> None:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {server.key_u2}"})
        async with Client(streamable_http_client(url, http_client=http), read_timeout_seconds=120) as client:
            await _exercise(client, "u2")
            denied = await client.call_tool("recall", {"query": "x", "user_id": "u1"})  # another tenant
            assert denied.is_error and "may not access user 'u1'" in denied.content[0].text
            mine = _data(await client.call_tool("remember", {"text": "u2's own note", "user_id": "u2"}))
            for tool, extra in (("get", {}), ("history", {}), ("update", {"text": "hijacked"})):
                other = await client.call_tool(tool, {"entry_id": u1_entry, **extra})  # u1's entry
                assert other.is_error and "NotFoundError" in other.content[0].text, tool
            assert _data(await client.call_tool("forget", {"entry_id": u1_entry}))["deleted"] == 0
            assert _data(await client.call_tool("forget", {"entry_id": mine["id"]}))["deleted"] == 1

    anyio.run(main)
    assert httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=120).status_code == 401
