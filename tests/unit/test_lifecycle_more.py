"""Lifecycle, continued: erasure of every version, "llm" consolidation, staged knowledge versions, topic switches."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from agentmem import AgentMemory, InvalidInputError
from agentmem.kv.testing import tiny_causal_lm
from agentmem.security import Cipher
from agentmem.security.erase import scan_tree_for_markers

# the facade on the SQLite file and on the in-process catalog written against the port alone (tests/conftest.py)
pytestmark = pytest.mark.catalogs(None, "memory")


@pytest.fixture(scope="module")
def tiny_pair():
    return tiny_causal_lm("llama", seed=0)


def _marked(n: int) -> list[str]:
    return [f"zq{uuid.uuid4().hex[:10]}mk" for _ in range(n)]


def _versions(mem: AgentMemory, user: str, markers: list[str], **kw) -> str:
    """One entry whose every version (and a merged duplicate) holds a marker."""
    rec = mem.remember(f"the vault code is {markers[0]}", user_id=user, **kw)
    mem.remember(f"the vault code is {markers[0]}", user_id=user, **kw)  # merged: the history keeps it
    for m in markers[1:]:
        mem.update(rec.id, text=f"the vault code is {m}")
    assert len(mem.history(rec.id)) == 1 + 1 + len(markers) - 1
    return rec.id


@pytest.mark.parametrize("how", ["entry", "user", "ttl"])
def test_erasure_removes_every_version_and_the_history(tmp_path: Path, tiny_pair, how: str) -> None:
    store = tmp_path / "s"
    markers = _marked(3)
    with AgentMemory(store, model=tiny_pair, kv_encoding="eager") as mem:
        keep = mem.remember("bystander keeps this", user_id="other")
        entry = _versions(mem, "victim", markers, **({"ttl": 4.0} if how == "ttl" else {}))
        assert scan_tree_for_markers(store, [markers[0].encode()])  # the history really holds the old text
        if how == "entry":
            assert mem.forget(entry) == 1
        elif how == "user":
            assert mem.forget(user_id="victim") == 1
        else:
            time.sleep(max(0.0, mem._store.catalog.get([entry])[0].expires_at - time.time()) + 0.1)
            assert mem.sweep() == 1
        assert mem._store.lifecycle.history(entry) == []
        assert [r.id for r in mem.list(user_id="other")] == [keep.id]
        assert mem.verify()["orphan_blobs"] == 0
    assert scan_tree_for_markers(store, [m.encode() for m in markers]) == {}


def test_history_is_encrypted_at_rest(tmp_path: Path) -> None:
    store, key = tmp_path / "enc", Cipher.format_key(Cipher.generate_key())
    markers = _marked(3)
    with AgentMemory(store, encryption_key=key) as mem:
        entry = _versions(mem, "u", markers)
        assert [v.text for v in mem.history(entry)][-1] == f"the vault code is {markers[-1]}"
    assert scan_tree_for_markers(store, [m.encode() for m in markers]) == {}


class _Gate(FakeListChatModel):
    """A scripted chat model that answers only once the test opens the gate (proves remember() does not wait)."""

    gate: threading.Event = threading.Event()

    def invoke(self, *args, **kwargs):  # type: ignore[override]
        assert self.gate.wait(30)
        return super().invoke(*args, **kwargs)


def test_llm_consolidation_runs_in_the_background_and_applies_update(tmp_path: Path) -> None:
    chat = _Gate(responses=['{"event": "UPDATE", "id": 0, "reason": "the user moved"}'])
    with AgentMemory(tmp_path / "s", consolidation="llm", consolidation_model=chat) as mem:
        lyon = mem.remember("I live in Lyon.", user_id="u1")  # nothing to compare with: no model call
        t0 = time.perf_counter()
        paris = mem.remember("Actually I moved to Paris last month.", user_id="u1")
        assert time.perf_counter() - t0 < 5 and mem.get(lyon.id).status == "active"  # returned before deciding
        chat.gate.set()
        assert mem.wait_consolidation(30)
        old = mem.get(lyon.id)
        assert old.status == "superseded" and old.superseded_by == paris.id
        assert mem.history(lyon.id)[-1].op == "supersede" and "moved" in mem.history(lyon.id)[-1].reason
        assert [h.id for h in mem.recall("where do I live?", user_id="u1", k=3)] == [paris.id]
        assert mem.stats()["lifecycle"]["llm_update"] == 1


@pytest.mark.parametrize("reply,op,status", [
    ('{"event": "DELETE", "id": 0, "reason": "no longer true"}', "delete", "deleted"),
    # a NOOP for a differing text keeps both (issue #37): tests/unit/test_consolidation_events.py
    ('{"event": "NOOP", "id": 0, "reason": "same"}', "add", "active"),
    ('{"event": "ADD", "id": null}', "add", "active"),
    ("I would update memory zero.", "add", "active"),  # not a decision: nothing changes
])
def test_llm_decisions(tmp_path: Path, reply: str, op: str, status: str) -> None:
    with AgentMemory(tmp_path / "s", consolidation="llm",
                     consolidation_model=FakeListChatModel(responses=[reply])) as mem:
        first = mem.remember("I have a dog called Rex.", user_id="u1")
        second = mem.remember("My dog Rex is three years old.", user_id="u1")
        assert mem.wait_consolidation(30)
        assert mem.get(first.id).status == status and mem.history(first.id)[-1].op == op
        ids = [r.id for r in mem.list(user_id="u1")]
        assert second.id in ids  # no decision discards a differing write
    if reply.startswith("I would"):
        assert mem.stats()["lifecycle"]["llm_invalid"] == 1


def test_llm_consolidation_with_the_local_model(tmp_path: Path, tiny_pair) -> None:
    # constrained decoding: even a tiny random model can only write a valid decision, and it is applied
    with AgentMemory(tmp_path / "s", consolidation="llm", model=tiny_pair) as mem:
        a = mem.remember("I live in Lyon.", user_id="u1")
        b = mem.remember("Actually I moved to Paris last month.", user_id="u1")
        assert mem.wait_consolidation(60)
        life = mem.stats()["lifecycle"]
        assert life.get("llm_invalid", 0) == 0 and life.get("llm_errors", 0) == 0
        decided = {k: v for k, v in life.items() if k.startswith("llm_")}
        assert sum(decided.values()) == 2 and life["llm_add"] >= 1  # the first memory: nothing to compare
        statuses = {r.id: r.status for r in mem.list(user_id="u1")}
        if life.get("llm_update"):
            assert statuses == {a.id: "superseded", b.id: "active"} and mem.get(a.id).superseded_by == b.id
        elif life.get("llm_delete"):
            assert statuses[a.id] == "deleted"
        elif life.get("llm_noop"):
            assert b.id not in statuses
        else:
            assert statuses == {a.id: "active", b.id: "active"}


def test_the_choice_processor_only_allows_the_valid_answers() -> None:
    import torch

    from agentmem.consolidate.llm import ChoiceProcessor, choices

    assert choices(2) == ["ADD", "UPDATE 0", "UPDATE 1", "DELETE 0", "DELETE 1", "NOOP 0", "NOOP 1"]
    proc = ChoiceProcessor([[3, 4], [3, 5], [6]], eos_id=0)
    scores = torch.arange(10, dtype=torch.float32)[None, :]  # unconstrained, 9 would win
    allowed = lambda ids: set(torch.nonzero(torch.isfinite(proc(torch.tensor([ids]), scores))[0]).flatten().tolist())
    assert allowed([]) == {3, 6}
    assert allowed([3]) == {4, 5}
    assert allowed([3, 5]) == {0} and allowed([6]) == {0}  # a complete answer can only end


def test_staged_kb_rollout_is_stable_per_session_and_never_mixes(tmp_path: Path, tiny_pair) -> None:
    with AgentMemory(tmp_path / "s", model=tiny_pair) as mem:
        shared = mem.remember("The shop opens at nine.", user_id="shop", kind="knowledge")  # unversioned: for all
        mem.set_kb_version("v1")
        old = mem.remember("Returns are accepted within 30 days of purchase.", user_id="shop", kind="knowledge")
        mem.set_kb_version("v2", rollout=0.2)
        assert mem.kb_version == "v1"
        new = mem.remember("Returns are accepted within 60 days of purchase.", user_id="shop", kind="knowledge")
        sessions = [f"s{i}" for i in range(400)]
        served = {s: mem._kb.version_for(s) for s in sessions}
        assert served == {s: mem._kb.version_for(s) for s in sessions}  # stable per session
        share = sum(v == "v2" for v in served.values()) / len(sessions)
        assert 0.13 < share < 0.27
        for s in sessions[:40]:
            out = mem.generate("how long can I return things?", user_id="shop", session_id=s, k=3, mode="text",
                               max_new_tokens=1)
            want = new.id if served[s] == "v2" else old.id
            assert want in out.mounted and ({old.id, new.id} - {want}).isdisjoint(out.mounted)
        # plain recall serves the stable version
        assert old.id in [h.id for h in mem.recall("returns", user_id="shop", k=3)]
        assert mem.promote() == "v2" and mem.kb_version == "v2"
        for s in sessions[:10]:
            mounted = mem.generate("returns?", user_id="shop", session_id=s, k=3, mode="text", max_new_tokens=1).mounted
            assert new.id in mounted and old.id not in mounted
        mem.set_kb_version("v3", rollout=0.5)
        v3 = mem.remember("Returns are no longer accepted.", user_id="shop", kind="knowledge")
        assert mem.rollback() == "v3"
        assert all(v3.id not in mem.generate("returns?", user_id="shop", session_id=s, k=3, mode="text",
                                             max_new_tokens=1).mounted for s in sessions[:20])
        assert shared.id in [h.id for h in mem.recall("when does the shop open?", user_id="shop", k=3)]
        with pytest.raises(InvalidInputError, match="rollout"):
            mem.set_kb_version("v4", rollout=1.5)
        with pytest.raises(InvalidInputError, match="no staged"):
            mem.promote()


def test_a_rollout_change_rebuilds_session_caches(tmp_path: Path, tiny_pair) -> None:
    with AgentMemory(tmp_path / "s", model=tiny_pair) as mem:
        chat = mem.session("s1", user_id="u")
        chat.send("hello there", k=0, max_new_tokens=2)
        mem.set_kb_version("v2", rollout=0.5)
        assert chat.send("and then?", k=0, max_new_tokens=2).rebuilt == "knowledge-base version changed"
        mem.rollback()
        assert chat.send("again?", k=0, max_new_tokens=2).rebuilt == "knowledge-base version changed"


def test_a_topic_switch_drops_the_old_working_kv(tmp_path: Path, tiny_pair) -> None:
    with AgentMemory(tmp_path / "s", model=tiny_pair, topic_switch_threshold=0.1) as mem:
        chat = mem.session("s1", user_id="u")
        chat.send("I love hiking in the Alps every summer", k=0, max_new_tokens=2)
        chat.send("The mountain trails near Chamonix are beautiful", k=0, max_new_tokens=2)
        r = chat.send("Ok", k=0, max_new_tokens=2)  # too short to carry a topic
        assert r.reused_tokens > 0 and mem.sessions.stats()["topic_switches"] == 0
        r = chat.send("How do I file my quarterly sales tax return?", k=0, max_new_tokens=2)
        assert r.reused_tokens == 0 and mem.sessions.stats()["topic_switches"] == 1
        assert len(chat.history()) == 2  # only the new topic's turn is in the working cache
        # the old topic is still long-term memory
        assert any("Chamonix" in h.text for h in mem.recall("Chamonix trails", user_id="u", k=3))
    with AgentMemory(tmp_path / "off", model=tiny_pair) as mem:  # off by default
        chat = mem.session("s1", user_id="u")
        chat.send("I love hiking in the Alps every summer", k=0, max_new_tokens=2)
        assert chat.send("How do I file my quarterly sales tax return?", k=0, max_new_tokens=2).reused_tokens > 0
        assert mem.sessions.stats()["topic_switches"] == 0


def test_forgetting_the_newer_entry_leaves_no_reference_to_it(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with AgentMemory(store) as mem:
        blue = mem.remember("My favorite color is blue.", user_id="u1")
        mem.remember("The weather was lovely this weekend.", user_id="u1")
        mem.remember("I need to buy more coffee filters.", user_id="u1")
        green = mem.remember("My favorite color is green now.", user_id="u1")
        assert mem.get(blue.id).superseded_by == green.id
        assert mem.forget(green.id) == 1
        assert mem.get(blue.id).superseded_by is None and mem.history(blue.id)[-1].related_id is None
    assert set(scan_tree_for_markers(store, [green.id.encode()])) <= {store / "audit.jsonl"}
