"""The API state machine with the HTTP server in front of the same store: chat requests through
``/v1/chat/completions`` (their question a memory of the user, so the inspector's request log holds memory text),
hostile ids over REST, and the erase-visibility invariant.

Erase visibility: after every step, no endpoint returns the text of an erased entry: not the REST list or recall,
not the inspector (overview, user page, every request page seen), not MCP's recall tool, not ``/v1/stats`` or
``/metrics``. The server runs in-process (FastAPI's TestClient over the real app) without auth, so one client
may read every user.

Example:
    >>> from hypothesis.stateful import run_state_machine_as_test                  # doctest: +SKIP
    >>> run_state_machine_as_test(ServedApiMachine)                                # doctest: +SKIP
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from agentmem.server import ServerSettings, create_app
from api_machine import HOSTILE_STR_IDS, STATS, USERS, WORDS, ApiMachine

JSON_IDS = tuple(i for i in HOSTILE_STR_IDS if not any(0xD800 <= ord(c) <= 0xDFFF for c in i))  # UTF-8-encodable
_MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


class ServedApiMachine(ApiMachine):
    """:class:`ApiMachine` plus a server over the same :class:`AgentMemory` (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.request_ids: list[str] = []
        self.client = self._serve()

    def _serve(self) -> TestClient:
        settings = ServerSettings(auth=False, max_tokens=2, fidelity_share=0.5, fidelity_tokens=2)
        # a loopback Host: the MCP transport refuses unknown hosts (DNS rebinding protection)
        client = TestClient(create_app(self.mem, keys=None, settings=settings), base_url="http://127.0.0.1:8765",
                            raise_server_exceptions=False)
        client.__enter__()  # runs the lifespan: MCP's session manager, and the fidelity monitor's shutdown after
        return client

    def _stop_serving(self) -> None:
        self.client.__exit__(None, None, None)

    # --- rules ---------------------------------------------------------------------------------------------
    @rule(data=st.data(), user=st.sampled_from(USERS))
    def chat(self, data: Any, user: str) -> None:
        """A chat turn whose question is also a memory of the user: the request log holds that memory's text.

        The question is remembered through the facade and the chat itself remembers nothing (``remember: false``):
        whether a noise answer of the tiny model is stored would make the number of entries, and so hypothesis'
        draws, differ between replays. The chat recalls the stored question (same text: the best hit), so the
        request record names it and must go when it is erased.
        """
        tag, marker = self._marker()
        question = " ".join([*data.draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3)), tag])
        ok, rec = self._call(self.mem.remember, question, user_id=user)
        assert ok, f"a valid remember() was refused: {rec!r}"
        self._adopt(rec, marker)
        STATS["steps"] += 1
        r = self.client.post("/v1/chat/completions", json={
            "model": "agentmem", "user": user, "agentmem": {"remember": False, "k": 20},
            "messages": [{"role": "user", "content": question}]})
        assert r.status_code == 200, r.text
        self.request_ids.append(r.json()["agentmem"]["request_id"])

    @rule(bad=st.sampled_from(JSON_IDS), field=st.sampled_from(("user_id", "session_id")))
    def rest_hostile_id(self, bad: str, field: str) -> None:
        """Over REST, a hostile id is a 400 before anything is written (the base invariants check the store)."""
        STATS["steps"] += 1
        tag, marker = self._marker()
        body = {"text": f"orchard {tag}", "user_id": "alice", field: bad}
        r = self.client.post("/v1/memories", json=body)
        assert r.status_code == 400, (field, bad, r.status_code, r.text)
        self.erased.append(marker)
        r = self.client.post("/v1/memories/forget", json={"user_id": bad})
        assert r.status_code == 400, ("forget", bad, r.status_code, r.text)

    def reopen(self) -> None:
        self._stop_serving()
        super().reopen()
        self.request_ids = []  # the old app's request log went with it
        self.client = self._serve()

    # --- the erase-visibility invariant --------------------------------------------------------------------
    def _pages(self) -> dict[str, str]:
        get = self.client.get
        pages = {"overview": get("/inspector").text, "stats": get("/v1/stats").text, "metrics": get("/metrics").text}
        for user in USERS:
            pages[f"list {user}"] = get("/v1/memories", params={"user_id": user, "limit": 10_000}).text
            pages[f"inspector {user}"] = get(f"/inspector/users/{user}").text
            pages[f"recall {user}"] = self.client.post("/v1/memories/recall", json={
                "query": " ".join(WORDS), "user_id": user, "k": 50}).text
            pages[f"mcp recall {user}"] = self.client.post("/mcp/", headers=_MCP_HEADERS, json={
                "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "recall", "arguments": {"query": " ".join(WORDS), "user_id": user, "k": 50}}}).text
        for rid in self.request_ids:
            pages[f"request {rid}"] = get(f"/inspector/requests/{rid}").text
        return pages

    @invariant()
    def erased_text_is_served_nowhere(self) -> None:
        markers = [m.decode() for m in self.erased if m.startswith(b"zq")]  # texts; vectors are checked on disk
        if not markers:
            return
        pages = self._pages()
        leaks = {name: [m for m in markers if m in text] for name, text in pages.items()}
        leaks = {name: found for name, found in leaks.items() if found}
        assert not leaks, f"erased text still served: {json.dumps(leaks)[:2000]}"

    def teardown(self) -> None:
        try:
            self._stop_serving()
        finally:
            super().teardown()


__all__ = ["ServedApiMachine"]
