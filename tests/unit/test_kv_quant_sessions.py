"""Integer codecs for session KV in the cold tier: smaller files, restored within the codec's error, opt-in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentmem.backends.file_sessions import FileSessionStore
from agentmem.config import MemoryConfig
from agentmem.kv import KVEngine
from agentmem.kv.testing import tiny_causal_lm
from agentmem.sessions import SessionManager
from agentmem.sessions.state import SessionKV, Transcript, dump_session, load_session


@pytest.fixture(scope="module")
def engine() -> KVEngine:
    return KVEngine(*tiny_causal_lm("llama", seed=0))


def _kv(tokens: int = 40) -> SessionKV:
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(2, 1, 2, tokens + 8, 16, generator=g)  # spare capacity past ``length``
    values = torch.randn(2, 1, 2, tokens + 8, 16, generator=g)
    return SessionKV(keys, values, tokens)


def _transcript() -> Transcript:
    return Transcript(session_id="s", user_id="u", ids=list(range(40)))


@pytest.mark.parametrize("codec", [None, "float32", "int8", "int4", "k4v3hs", "k4v3hsl"])
def test_session_files_round_trip_in_every_codec(codec):
    kv = _kv()
    blob = dump_session(_transcript(), kv, codec=codec)
    transcript, back = load_session(blob)
    assert transcript.ids == list(range(40)) and back.length == 40 and back.keys.dtype == torch.float32
    want_k, want_v = kv.keys[..., :40, :], kv.values[..., :40, :]
    if codec in (None, "float32"):
        assert torch.equal(back.keys, want_k) and torch.equal(back.values, want_v)
        return
    tol = {"int8": 0.03, "int4": 0.5, "k4v3hs": 1.0, "k4v3hsl": 1.0}[codec]  # (clipped ranges: a larger worst case)
    assert (back.keys - want_k).abs().max() < tol and (back.values - want_v).abs().max() < tol
    assert len(blob) < len(dump_session(_transcript(), kv)) / (2.5 if codec == "int8" else 3.5)  # tiny heads: scales weigh more


def test_a_damaged_quantized_session_file_is_refused():
    from agentmem.errors import BlobCorruptedError

    blob = dump_session(_transcript(), _kv(), codec="int4")
    with pytest.raises(BlobCorruptedError):
        load_session(blob[: len(blob) // 2])


def _manager(engine: KVEngine, root: Path, **cfg) -> SessionManager:
    config = MemoryConfig(**{"session_hot_bytes": 1 << 30, "session_warm_bytes": 1 << 30, **cfg})
    return SessionManager(
        engine=lambda: engine, retrieve=lambda *a, **k: [], remember_turn=lambda *a, **k: [], scan=lambda t: t,
        kb_version=lambda: None, root=root, config=config, cipher=None, start_worker=False, sweep_interval=None,
        cold_store=FileSessionStore(root),
    )


def test_the_cold_tier_writes_the_configured_codec_and_restores_from_it(engine, tmp_path):
    sizes = {}
    for codec in (None, "int8"):
        mgr = _manager(engine, tmp_path / str(codec), session_kv_codec=codec)
        chat = mgr.open("s1", user_id="u1")
        chat.send("Hello there, I moved to Lisbon last spring.", k=0, max_new_tokens=4)
        assert mgr.offload("s1", to="disk") == "cold"
        files = [p for p in (tmp_path / str(codec)).rglob("*") if p.is_file() and "_agentmem" not in p.parts]
        sizes[codec] = sum(p.stat().st_size for p in files)
        reply = chat.send("Where did I move?", k=0, max_new_tokens=4)
        assert reply.restored_from == "cold" and reply.rebuilt is None and reply.reused_tokens > 0
        mgr.close()
    assert sizes["int8"] < sizes[None] / 2


@pytest.mark.parametrize("codec", ["int8", "int4", "k4v3h", "k4v3hs", "k4v3hsl"])
def test_a_packed_warm_copy_holds_fewer_bytes_and_restores_within_the_codec_error(codec):
    from agentmem.sessions.state import PackedSessionKV

    kv = _kv()
    warm = PackedSessionKV.pack(kv, codec)
    float_bytes = kv.moved("cpu").nbytes  # compacted, as the warm tier would hold it in the model's dtype
    assert warm.length == warm.capacity == 40 and warm.float_bytes_per_token == float_bytes // 40
    assert warm.nbytes < float_bytes / (2.5 if codec == "int8" else 3.5)
    hot = warm.moved("cpu", capacity=56)
    assert isinstance(hot, SessionKV) and hot.capacity == 56 and hot.length == 40 and hot.keys.dtype == torch.float32
    tol = {"int8": 0.03, "int4": 0.5, "k4v3h": 0.7, "k4v3hs": 1.0, "k4v3hsl": 1.0}[codec]  # (clipped: larger worst case)
    assert (hot.keys[..., :40, :] - kv.keys[..., :40, :]).abs().max() < tol
    assert (hot.values[..., :40, :] - kv.values[..., :40, :]).abs().max() < tol
    # To disk in the same codec: the warm codes are written as they are (the same bytes as quantizing the floats
    # once); in another codec (or the model's dtype) via the dequantized floats.
    state = _transcript()
    assert dump_session(state, warm, codec=codec) == dump_session(state, kv, codec=codec)
    _, back = load_session(dump_session(state, warm))
    assert torch.equal(back.keys, hot.keys[..., :40, :]) and torch.equal(back.values, hot.values[..., :40, :])


def test_the_warm_tier_holds_the_configured_codec_and_restores_from_it(engine, tmp_path):
    from agentmem.sessions.state import PackedSessionKV

    warm_bytes = {}
    for codec in (None, "int8"):
        mgr = _manager(engine, tmp_path / str(codec), session_warm_kv_codec=codec)
        chat = mgr.open("s1", user_id="u1")
        first = chat.send("Hello there, I moved to Lisbon last spring.", k=0, max_new_tokens=4)
        assert mgr.offload("s1", to="warm") == "warm"
        (key,) = mgr.warm.backend.keys()
        assert isinstance(mgr.warm.backend.get(key), PackedSessionKV) == (codec is not None)
        warm_bytes[codec] = mgr.warm.bytes()
        reply = chat.send("Where did I move?", k=0, max_new_tokens=4)
        assert reply.restored_from == "warm" and reply.rebuilt is None and reply.reused_tokens > 0
        assert first.text and reply.text
        assert mgr.hot.backend.get(key).keys.dtype == torch.float32  # hot: the model's dtype, whatever warm held
        mgr.close()
    assert 0 < warm_bytes["int8"] < warm_bytes[None] / 3


def test_the_same_warm_budget_holds_more_sessions_in_a_codec(engine, tmp_path):
    def fill(codec: str | None, budget: int) -> SessionManager:
        mgr = _manager(engine, tmp_path / f"{codec}-{budget}", session_warm_bytes=budget, session_warm_kv_codec=codec)
        for i in range(4):
            mgr.open(f"s{i}", user_id="u1").send("Hello there, I moved to Lisbon last spring.", k=0, max_new_tokens=4)
            mgr.offload(f"s{i}", to="warm")
        assert mgr.warm.bytes() <= budget
        return mgr

    probe = fill(None, 1 << 30)
    one = probe.warm.bytes() // 4  # one session's float KV, compacted
    probe.close()
    budget = one + one // 2  # room for one float session
    for codec, held in ((None, 1), ("int8", 4)):  # int8: ~0.3x the bytes, all four fit (the float run sent 3 to disk)
        mgr = fill(codec, budget)
        assert len(mgr.warm.backend.keys()) == held
        mgr.close()
