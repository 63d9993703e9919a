"""Streaming from the decoder's per-token callback: pieces arrive while decoding runs and add up to the answer."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agentmem import AgentMemory
from agentmem.kv.streaming import TextStream
from agentmem.kv.testing import tiny_causal_lm, tiny_tokenizer


def test_text_stream_holds_back_half_characters_and_adds_up():
    tok = tiny_tokenizer()
    ids = tok.encode("héllo wörld", add_special_tokens=False)  # byte-level: é and ö are two tokens each
    pieces: list[str] = []
    stream = TextStream(tok, pieces.append)
    for i in ids:
        stream.push(i)
    stream.flush()
    assert "".join(pieces) == "héllo wörld"
    assert all("\ufffd" not in p for p in pieces) and len(pieces) == len("héllo wörld")


@pytest.fixture(scope="module")
def mem(tmp_path_factory) -> Iterator[AgentMemory]:
    # float32 blobs: the exact-mount fidelity check below needs a lossless codec, whatever the default codec is
    m = AgentMemory(tmp_path_factory.mktemp("store"), model=tiny_causal_lm("llama", seed=0), session_idle_seconds=3600,
                    kv_codec="float32")
    yield m
    m.close()


def _timed(out: list[tuple[float, str]]):
    return lambda piece: out.append((time.perf_counter(), piece))


def test_generate_streams_pieces_before_decoding_ends(mem):
    mem.remember("My dog is called Rex.", user_id="u1")
    pieces: list[tuple[float, str]] = []
    out = mem.generate("What is my dog called?", user_id="u1", k=2, max_new_tokens=24, on_text=_timed(pieces))
    end = time.perf_counter()
    assert out.text and "".join(p for _, p in pieces) == out.text
    assert len(pieces) > 3 and pieces[0][0] < end - out.timings["decode"] / 2  # the first piece came early
    assert len(out.spans) == len(out.mounted) and all(e > s for s, e in out.spans)


def test_session_send_streams_the_reply(mem):
    pieces: list[tuple[float, str]] = []
    r = mem.session("s1", user_id="u1").send("Hello there", k=1, max_new_tokens=16, on_text=_timed(pieces))
    assert r.text and "".join(p for _, p in pieces) == r.text and len(pieces) > 1


def test_text_mode_reports_where_memories_sit(mem):
    out = mem.generate("dog?", user_id="u1", k=2, mode="text", max_new_tokens=2)
    assert len(out.spans) == len(out.mounted) and out.spans[0][0] > 0


def test_fidelity_is_near_zero_for_one_exact_mount(mem):
    # one memory: mounting it is exact, so KV and text agree; several memories differ by design (in text mode
    # each memory also attends to the ones before it)
    out = mem.generate("What is my dog called?", user_id="u1", k=1, max_new_tokens=6)
    report = mem.fidelity("What is my dog called?", user_id="u1", answer=out.text or "Rex", entry_ids=out.mounted)
    assert 0 <= report["kl"] < 1e-4 and report["top1_agree"] == 1.0 and report["tokens"] >= 1
