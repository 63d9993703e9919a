"""AsyncAgentMemory: the event loop keeps running while the model works; one model thread; streaming; sessions."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import torch

from agentmem import AsyncAgentMemory, InvalidInputError
from agentmem.kv.testing import tiny_causal_lm


class SlowSteps:
    """A logits processor that makes each decoding step take ~10 ms (a bigger model) and records its thread."""

    def __init__(self) -> None:
        self.threads: set[str] = set()
        self.steps = 0

    def __call__(self, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.threads.add(threading.current_thread().name)
        self.steps += 1
        time.sleep(0.01)
        return scores


def test_generate_does_not_block_the_event_loop(tmp_path: Path):
    slow = SlowSteps()

    async def main() -> tuple[int, object, list]:
        async with AsyncAgentMemory(tmp_path / "s", model=tiny_causal_lm("llama")) as mem:
            await mem.remember("Ann keeps bees on the roof.", user_id="u", session_id="s1")
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.005)
                    ticks += 1

            tick = asyncio.create_task(ticker())
            gen = asyncio.create_task(mem.generate("Who keeps bees?", user_id="u", max_new_tokens=40,
                                                   logits_processor=slow))
            # a recall on the I/O lane finishes while the model lane is still decoding
            hits = await mem.recall("bees", user_id="u", k=1)
            assert not gen.done()
            out = await gen
            tick.cancel()
            return ticks, out, hits

    ticks, out, hits = asyncio.run(main())
    assert len(out.token_ids) > 10 and slow.steps > 10
    assert ticks >= slow.steps // 2  # the loop ran throughout (~0.4 s of decoding, a tick every ~5 ms)
    # the prefill runs on the model lane's thread, later steps on the batched-decode worker (kv/batch.py);
    # never on the event loop's thread
    assert slow.threads and slow.threads <= {"agentmem-model_0", "agentmem-decode"}
    assert hits and hits[0].text == "Ann keeps bees on the roof."


class LettersOnly:
    """A logits processor that lets the random model pick only ASCII letters: its free choice is often a lone
    UTF-8 byte, which the text stream rightly holds back until the character completes (one piece at the end)."""

    def __init__(self, tokenizer) -> None:
        vocab = len(tokenizer)
        self.allowed = torch.tensor([i for i in range(vocab) if (s := tokenizer.decode([i])).isascii()
                                     and s.strip().isalpha()])

    def __call__(self, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        masked = torch.full_like(scores, float("-inf"))
        masked[..., self.allowed] = scores[..., self.allowed]
        return masked


def test_stream_and_sessions_are_async_too(tmp_path: Path):
    model, tokenizer = tiny_causal_lm("llama")
    letters = LettersOnly(tokenizer)

    async def main() -> tuple[list[str], object, list[str], object]:
        async with AsyncAgentMemory(tmp_path / "s", model=(model, tokenizer)) as mem:
            await mem.remember("Ann keeps bees on the roof.", user_id="u")
            pieces = [p async for p in mem.stream("Who keeps bees?", user_id="u", max_new_tokens=8,
                                                  logits_processor=letters)]
            whole = await mem.generate("Who keeps bees?", user_id="u", max_new_tokens=8, logits_processor=letters)
            chat = await mem.session("s2", user_id="u")
            streamed = [p async for p in chat.stream("Tell me about the bees.", k=1, max_new_tokens=6)]
            turn = await chat.send("And the roof?", k=1, max_new_tokens=6)
            return pieces, whole, streamed, turn

    pieces, whole, streamed, turn = asyncio.run(main())
    assert "".join(pieces) == whole.text and len(pieces) > 1
    assert streamed and turn.reused_tokens > 0  # the second turn reused the first turn's KV


def test_a_path_or_a_memory_is_required(tmp_path: Path):
    try:
        AsyncAgentMemory()
    except InvalidInputError as exc:
        assert "path or memory" in str(exc)
    else:
        raise AssertionError("expected InvalidInputError")
