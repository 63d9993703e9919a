"""The memory store through the public API: real SQLite, real Chroma, bundled MiniLM."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from agentmem.ports.catalog import CatalogScope
from agentmem import AgentMemory, InvalidInputError, NotFoundError

# the facade on the SQLite file and on the in-process catalog written against the port alone (tests/conftest.py)
pytestmark = pytest.mark.catalogs(None, "memory")


def _facts(mem: AgentMemory) -> dict[str, str]:
    ids = {}
    ids["lyon"] = mem.remember("I moved to Lyon last May.", user_id="u1", session_id="s1", role="user",
                               tags=["profile"], metadata={"source": "chat", "n": 3}).id
    ids["dog"] = mem.remember("My dog is called Rex and loves the park.", user_id="u1", session_id="s1",
                              role="user", metadata={"source": "chat", "n": 1}).id
    ids["job"] = mem.remember("I work as a nurse at the city hospital.", user_id="u1", session_id="s2",
                              role="user", tags=["profile", "work"], metadata={"source": "import", "n": 7}).id
    ids["other"] = mem.remember("I moved to Berlin and live there now.", user_id="u2", session_id="s9", role="user").id
    return ids


def test_remember_recall_get_list(mem: AgentMemory) -> None:
    ids = _facts(mem)
    hits = mem.recall("Which city did I move to last May?", user_id="u1", k=2)
    assert hits[0].id == ids["lyon"]
    assert hits[0].text == "I moved to Lyon last May."
    assert "User:" in hits[0].memory_text  # who said it travels with the text
    assert hits[0].metadata == {"source": "chat", "n": 3}
    assert hits[0].session_id == "s1" and hits[0].created_at.tzinfo is not None
    assert hits[0].score >= hits[-1].score
    assert mem.get(ids["dog"]).text.startswith("My dog")
    assert [r.id for r in mem.list(user_id="u1")] == [ids["lyon"], ids["dog"], ids["job"]]
    assert [r.id for r in mem.list(user_id="u1", session_id="s2")] == [ids["job"]]
    with pytest.raises(NotFoundError):
        mem.get("no-such-id")


def test_recall_never_crosses_users(mem: AgentMemory) -> None:
    ids = _facts(mem)
    for hit in mem.recall("Berlin", user_id="u1", k=10):
        assert hit.user_id == "u1" and hit.id != ids["other"]
    assert [h.id for h in mem.recall("Berlin", user_id="u2", k=10)] == [ids["other"]]


def test_by_id_calls_given_a_user_never_reach_another_users_entry(mem: AgentMemory) -> None:
    # get / update / history / restore / forget by id take the caller's user_id, as a multi-user app passes it:
    # another user's entry is not found, and nothing of it changes
    ids = _facts(mem)
    for call in (lambda: mem.get(ids["other"], user_id="u1"),
                 lambda: mem.update(ids["other"], text="I moved to Rome.", user_id="u1"),
                 lambda: mem.history(ids["other"], user_id="u1"),
                 lambda: mem.restore(ids["other"], user_id="u1")):
        with pytest.raises(NotFoundError):
            call()
    assert mem.forget(ids["other"], user_id="u1") == 0
    assert mem.get(ids["other"]).text == "I moved to Berlin and live there now."
    assert [v.op for v in mem.history(ids["other"], user_id="u2")] == ["add"]
    assert mem.update(ids["lyon"], text="I moved to Lyon in May 2025.", user_id="u1").version == 2
    assert [v.text for v in mem.history(ids["lyon"], user_id="u1")][0] == "I moved to Lyon last May."


def test_filters_tags_kinds_session(mem: AgentMemory) -> None:
    ids = _facts(mem)
    tool = mem.remember("weather(Lyon) = 21C sunny", user_id="u1", session_id="s1", kind="tool", speaker="weather")
    assert {h.id for h in mem.recall("city", user_id="u1", k=10, tags=["profile"])} == {ids["lyon"], ids["job"]}
    assert {h.id for h in mem.recall("city", user_id="u1", k=10, tags=["profile", "work"])} == {ids["job"]}
    assert {h.id for h in mem.recall("city", user_id="u1", k=10, session_id="s2")} == {ids["job"]}
    assert {h.id for h in mem.recall("weather", user_id="u1", k=10, kinds=["tool"])} == {tool.id}
    got = mem.recall("city", user_id="u1", k=10, filters={"source": {"$eq": "chat"}})
    assert {h.id for h in got} == {ids["lyon"], ids["dog"]}
    got = mem.recall("city", user_id="u1", k=10, filters={"$or": [{"n": {"$gt": 5}}, {"n": {"$lt": 2}}]})
    assert {h.id for h in got} == {ids["dog"], ids["job"]}
    got = mem.recall("city", user_id="u1", k=10, filters={"source": {"$in": ["import"]}, "n": {"$gte": 7}})
    assert {h.id for h in got} == {ids["job"]}
    got = mem.recall("city", user_id="u1", k=10, filters={"source": {"$nin": ["chat"]}, "n": {"$lte": 100}})
    assert {h.id for h in got} == {ids["job"]}
    got = mem.recall("city", user_id="u1", k=10, filters={"source": {"$contains": "imp"}, "n": {"$ne": 3}})
    assert {h.id for h in got} == {ids["job"]}


def test_restrictive_filter_finds_entries_outside_the_candidate_pool(mem_path: Path, catalog_url: str | None) -> None:
    with AgentMemory(mem_path, candidate_pool=5, catalog_url=catalog_url) as mem:
        mem.remember_many([dict(text=f"note {i} about gardening and tomatoes", user_id="u") for i in range(30)])
        rare = mem.remember("the car needs new tyres", user_id="u", tags=["car"])
        hits = mem.recall("gardening tomatoes", user_id="u", k=3, tags=["car"])
        assert [h.id for h in hits] == [rare.id]


def test_remember_messages_batches_and_tool_kind(mem: AgentMemory) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    recs = mem.remember_messages(
        [SystemMessage("be nice"), HumanMessage("My sister is called Inès."), AIMessage("Nice name!"),
         ToolMessage("Paris: 18C", tool_call_id="c1", name="weather"),
         {"role": "user", "content": "and my brother is Tom"}],
        user_id="u1", session_id="s1",
    )
    assert [r.kind for r in recs] == ["turn", "turn", "tool", "turn"]
    assert [r.role for r in recs] == ["user", "assistant", "tool", "user"]
    assert recs[2].memory_text.endswith("Tool weather: returned: Paris: 18C")
    assert mem.recall("sister's name", user_id="u1", k=1)[0].id == recs[0].id


def test_remember_messages_takes_an_openai_agent_transcript(mem: AgentMemory) -> None:
    """An assistant message that only calls a tool (``content: null``) is not a memory of its own: its call's name
    and arguments are kept with the tool's result, which is what answers a later question."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    recs = mem.remember_messages([
        {"role": "system", "content": "You are a travel assistant."},
        {"role": "developer", "content": "Answer in one sentence."},
        {"role": "user", "content": [{"type": "text", "text": "What's the weather in Oslo?"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain, 9 C"},
        {"role": "assistant", "content": "It is raining in Oslo, 9 C."},
    ], user_id="u1", session_id="trip")
    assert [(r.role, r.kind) for r in recs] == [("user", "turn"), ("tool", "tool"), ("assistant", "turn")]
    assert recs[0].text == "What's the weather in Oslo?"
    assert recs[1].speaker == "get_weather"
    assert recs[1].memory_text.endswith('Tool get_weather: called with {"city": "Oslo"}, returned: rain, 9 C')
    assert recs[1].id in [h.id for h in mem.recall("what did the weather tool say about Oslo?", user_id="u1", k=2)]


def test_remember_messages_takes_a_langchain_tool_calling_transcript(mem: AgentMemory) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    recs = mem.remember_messages([
        HumanMessage("Book the cheapest flight to Rome."),
        AIMessage("", tool_calls=[{"name": "search_flights", "args": {"to": "Rome"}, "id": "c7"}]),
        ToolMessage("FR123 at 49 EUR", tool_call_id="c7"),
    ], user_id="u1")
    assert [r.role for r in recs] == ["user", "tool"]
    assert (recs[1].speaker, recs[1].text) == ("search_flights", 'called with {"to": "Rome"}, returned: FR123 at 49 EUR')


@pytest.mark.parametrize("messages, match", [
    ([{"role": "user", "content": "fine"}, {"role": "user", "content": None}], r"messages\[1\] \(user\) has no text"),
    ([{"role": "assistant", "content": ""}], r"messages\[0\] \(assistant\) has no text"),
    ([{"role": "user", "content": 5}], r"messages\[0\].content must be a string or a list of parts, got int"),
    ([{"role": "user", "content": "x"}, {"role": "robot", "content": "x"}], r"messages\[1\].role must be"),
])
def test_remember_messages_names_the_message_it_refuses_and_stores_nothing(mem: AgentMemory, messages, match) -> None:
    with pytest.raises(InvalidInputError, match=match):
        mem.remember_messages(messages, user_id="u1")
    assert mem.list(user_id="u1") == []


@pytest.mark.needs_disk("checks that the KV blob's file is gone from the store's directory")
@pytest.mark.parametrize("mem", [{"consolidation": "off"}], indirect=True)  # two near-identical facts on purpose
def test_ttl_hides_then_sweep_erases_everywhere(mem: AgentMemory) -> None:
    keep = mem.remember("permanent fact about tea", user_id="u1")
    short = mem.remember("ephemeral fact about tea", user_id="u1", ttl=timedelta(seconds=0.5))
    store = mem._store
    assert store.attach_blob(short.id, b"kv-bytes")  # a KV blob, as the KV bank attaches it
    blob = store.blob_path(short.id)
    assert blob.exists()
    time.sleep(0.6)
    assert [h.id for h in mem.recall("tea", user_id="u1", k=5)] == [keep.id]  # hidden before any sweep
    with pytest.raises(NotFoundError):
        mem.get(short.id)
    assert mem.sweep() == 1
    assert store.catalog.get([short.id]) == []
    assert short.id not in store.vectors.all_ids()
    assert not blob.exists()
    assert mem.sweep() == 0


def test_background_sweeper(mem_path: Path, catalog_url: str | None) -> None:
    with AgentMemory(mem_path, sweep_interval=0.2, catalog_url=catalog_url) as mem:
        rec = mem.remember("soon gone", user_id="u", ttl=0.1)
        deadline = time.time() + 5
        while mem._store.catalog.get([rec.id]) and time.time() < deadline:
            time.sleep(0.1)
        assert mem._store.catalog.get([rec.id]) == []


def test_forget_cascade_and_counts(mem: AgentMemory) -> None:
    ids = _facts(mem)
    assert mem._store.attach_blob(ids["dog"], b"kv")
    assert mem.forget(ids["lyon"]) == 1
    assert mem.forget(ids["lyon"]) == 0
    assert mem.forget(tags=["work"]) == 1
    assert mem.forget(session_id="s1") == 1
    assert not mem._store.blob_path(ids["dog"]).exists()
    assert mem.list(user_id="u1") == []
    assert [r.id for r in mem.list(user_id="u2")] == [ids["other"]]
    assert set(mem._store.vectors.all_ids()) == {ids["other"]}
    assert mem.forget(user_id="u2") == 1
    events = mem._audit.read()
    assert [e["action"] for e in events] == ["forget", "forget", "forget_tags", "forget_session", "forget_user"]
    assert all("text" not in e for e in events)


def test_forget_pages_past_any_cap(mem: AgentMemory) -> None:
    mem.remember_many([dict(text=f"memory number {i}", user_id="bulk") for i in range(1234)])
    assert mem.forget(user_id="bulk") == 1234
    assert mem.list(user_id="bulk") == []
    assert mem._store.vectors.count() == 0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda m: m.remember("", user_id="u"), "empty"),
        (lambda m: m.remember("   ", user_id="u"), "empty"),
        (lambda m: m.remember(42, user_id="u"), "string"),
        (lambda m: m.remember("x", user_id="u", kind="diary"), "unknown kind"),
        (lambda m: m.remember("x", user_id="u", ttl=-5), "positive"),
        (lambda m: m.remember("x", user_id="u", ttl=timedelta(seconds=0)), "positive"),
        (lambda m: m.remember("x", user_id="u", metadata={"when": object()}), "JSON"),
        (lambda m: m.remember("x", user_id="u", metadata={"x": float("nan")}), "JSON"),
        (lambda m: m.remember("x", user_id=""), "user_id"),
        (lambda m: m.remember("x", user_id=None), "user_id"),
        (lambda m: m.remember("x", user_id="u", tags="profile"), "list"),
        (lambda m: m.recall("q", user_id="u", k=0), "k must"),
        (lambda m: m.recall("q", user_id="u", k=-1), "k must"),
        (lambda m: m.recall("q", user_id="u", filters={"a": {"$regex": "x"}}), "unknown filter operator"),
        (lambda m: m.recall("q", user_id="u", filters={"$not": {}}), "unknown filter operator"),
        (lambda m: m.recall("q", user_id="u", filters={"a": {"$in": "x"}}), "needs a list"),
        (lambda m: m.recall("", user_id="u"), "query is empty$"),
        (lambda m: m.recall("  ", user_id="u"), "query is empty \\(nothing but whitespace\\)"),
        (lambda m: m.update("id", text="x", user_id=""), "user_id"),
        (lambda m: m.recall("q", user_id=None), "user_id"),
        (lambda m: m.forget(), "refusing"),
        (lambda m: m.forget("id", user_id="u", session_id="s"), "not both"),
        (lambda m: m.list(), "user_id or session_id"),
        (lambda m: m.remember_messages([{"role": "robot", "content": "x"}], user_id="u"), "role"),
        (lambda m: m.remember_many([{"text": "x", "user_id": "u", "colour": "red"}]), "unknown fields"),
    ],
)
def test_bad_input_gets_typed_error(mem: AgentMemory, call, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        call(mem)
    assert mem._store.catalog.list_entries(CatalogScope()) == []


def test_batch_is_all_or_nothing(mem: AgentMemory) -> None:
    with pytest.raises(InvalidInputError):
        mem.remember_many([dict(text="fine", user_id="u"), dict(text="", user_id="u")])
    assert mem.list(user_id="u") == []
    assert mem._store.vectors.count() == 0


@pytest.mark.needs_disk("the store is reopened from its files")
def test_persists_across_reopen(mem_path: Path, catalog_url: str | None) -> None:
    with AgentMemory(mem_path, catalog_url=catalog_url) as mem:
        rec = mem.remember("the wifi password hint is the cat's name", user_id="u")
    with AgentMemory(mem_path, catalog_url=catalog_url) as mem:
        assert mem.recall("wifi", user_id="u", k=1)[0].id == rec.id


@pytest.mark.parametrize("mem", [{"consolidation": "off"}], indirect=True)  # 48 near-duplicates: all must land
def test_eight_threads_remember_and_recall(mem: AgentMemory) -> None:
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(6):
                mem.remember(f"thread {n} fact {i} about rivers", user_id=f"u{n % 2}", session_id=f"s{n}")
                mem.recall("rivers", user_id=f"u{n % 2}", k=3)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(mem.list(user_id="u0")) + len(mem.list(user_id="u1")) == 48


def test_relative_store_paths_are_fixed_when_opened(tmp_path: Path, monkeypatch) -> None:
    # Chroma caches its clients by the path string: two stores opened as "./memdata" from different working
    # directories must still write to their own directories.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    first = AgentMemory("./memdata")
    first.remember("kept in the first store", user_id="u")
    monkeypatch.chdir(tmp_path / "b")
    with AgentMemory("./memdata") as second:
        second.remember("kept in the second store", user_id="u")
        report = second.verify()
        assert report["orphan_vectors"] == 0 and report["rows_missing_vector"] == 0
        assert [h.text for h in second.recall("kept in the store", user_id="u", k=5)] == ["kept in the second store"]
    assert first.path == tmp_path / "a" / "memdata"
    assert first.verify()["orphan_vectors"] == 0
    first.close()
