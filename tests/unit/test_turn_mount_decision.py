"""One place decides "mount the stored KV, or re-encode the text": a one-shot prompt and a session turn agree.

Both ``KVEngine.generate`` and ``Session.send`` (through the engine's turn operation) ask
``KVEngine.mount_entry``; for a blob made by another model, a corrupt blob, a missing blob and stored KV whose ids
do not match the text, they take the same decision and report the same reason, and with ``strict`` both raise
the same error. Real blobs (``to_bytes`` / ``from_bytes``) on a tiny model; no mocks.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agentmem.backends.file_sessions import FileSessionStore
from agentmem.config import MemoryConfig
from agentmem.errors import BlobCorruptedError, FingerprintMismatchError
from agentmem.kv import KVEngine, MemoryItem
from agentmem.kv.testing import tiny_causal_lm
from agentmem.sessions import SessionManager

TEXT = "The user's dog is called Rex."
QUESTION = "What is my dog called?"


@pytest.fixture(scope="module")
def engine() -> KVEngine:
    return KVEngine(*tiny_causal_lm("llama", seed=0))


@pytest.fixture(scope="module")
def other() -> KVEngine:
    """Another model (other weights, so another fingerprint) that wrote some blobs."""
    return KVEngine(*tiny_causal_lm("llama", seed=1))


def _memories(engine: KVEngine, other: KVEngine) -> dict[str, MemoryItem]:
    good = engine.to_bytes(engine.encode(TEXT))
    foreign = other.to_bytes(other.encode(TEXT))
    corrupt = bytearray(good)
    corrupt[len(corrupt) // 2 :] = b"\x00" * (len(corrupt) - len(corrupt) // 2)
    wrong_ids = engine.encode("Something else entirely.")  # stored KV of another text
    return {
        "stored": MemoryItem("stored", TEXT, lambda: engine.from_bytes(good)),
        "foreign": MemoryItem("foreign", TEXT, lambda: engine.from_bytes(foreign)),
        "corrupt": MemoryItem("corrupt", TEXT, lambda: engine.from_bytes(bytes(corrupt))),
        "missing": MemoryItem("missing", TEXT, None),
        "wrong_ids": MemoryItem("wrong_ids", TEXT, lambda: wrong_ids),
    }


def _session(engine: KVEngine, root, memory: MemoryItem, *, strict: bool = False):
    config = MemoryConfig(session_hot_bytes=1 << 30, session_warm_bytes=1 << 30, strict_fingerprint=strict)
    mgr = SessionManager(
        engine=lambda: engine, retrieve=lambda query, user_id, k, **kw: [memory][:k],
        remember_turn=lambda *a: [SimpleNamespace(id="r")], scan=lambda t: t, kb_version=lambda: None,
        root=root, config=config, start_worker=False, cold_store=FileSessionStore(root),
    )
    return mgr, mgr.open("s", user_id="u")


@pytest.mark.parametrize("case", ["stored", "foreign", "corrupt", "missing", "wrong_ids"])
def test_session_turn_and_one_shot_make_the_same_decision(engine, other, tmp_path, case):
    memory = _memories(engine, other)[case]
    decisions: list[tuple[str, bool, str | None]] = []
    decide = engine.mount_entry

    def recording(m, ids, strict, **kw):  # a record of the real decision, which still runs
        choice = decide(m, ids, strict, **kw)
        decisions.append((m.id, choice.entry is not None, choice.reason))
        return choice

    engine.mount_entry = recording
    try:
        one_shot = engine.generate(QUESTION, [memory], max_new_tokens=2)
        mgr, chat = _session(engine, tmp_path, memory)
        turn = chat.send(QUESTION, k=1, max_new_tokens=2, remember=False)
        mgr.close()
    finally:
        del engine.mount_entry
    assert len(decisions) == 2 and decisions[0] == decisions[1]  # both asked the one function, same answer
    assert one_shot.mounted == turn.mounted == [memory.id]
    assert one_shot.fallbacks == turn.fallbacks
    if case == "stored":
        assert turn.fallbacks == []
    else:
        assert turn.fallbacks and turn.fallbacks[0][0] == memory.id
    reason = turn.fallbacks[0][1] if turn.fallbacks else ""
    assert {"foreign": "FingerprintMismatchError", "corrupt": "BlobCorruptedError", "missing": "no stored KV",
            "wrong_ids": "token ids do not match"}.get(case, "") in reason


@pytest.mark.parametrize("case, error", [("foreign", FingerprintMismatchError), ("corrupt", BlobCorruptedError),
                                         ("wrong_ids", FingerprintMismatchError)])
def test_strict_raises_the_same_error_in_both(engine, other, tmp_path, case, error):
    memory = _memories(engine, other)[case]
    with pytest.raises(error):
        engine.generate(QUESTION, [memory], max_new_tokens=2, strict=True)
    mgr, chat = _session(engine, tmp_path, memory, strict=True)
    with pytest.raises(error):
        chat.send(QUESTION, k=1, max_new_tokens=2, remember=False)
    mgr.close()
