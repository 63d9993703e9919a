"""Batched decoding across requests and the prompt prefix cache on the real embedded SmolLM2 (slow): answers decoded
together, each with its own mounted memories, equal their unbatched greedy answers token for token; text mode from
the cached preamble answers as text mode prefilling it."""

from __future__ import annotations

import threading

import pytest

from agentmem.kv import KVEngine, MemoryItem, load_model
from agentmem.kv.model import EMBEDDED_GGUF_FILE, embedded_model_dir
from tests.integration.test_kv_smollm2 import MEMORIES as KV_MEMORIES

pytestmark = pytest.mark.slow

# the memories of test_kv_smollm2, and one more so that mounted sets differ in length
MEMORIES = [*KV_MEMORIES, "[3 August 2023] Caroline: My grandmother gave me a necklace from Sweden."]
QUESTIONS = ["What is Caroline researching?", "What did Melanie run?", "Where did Melanie go camping?",
             "Where is Caroline's necklace from?", "Tell me about Caroline.", "What did Melanie do in May?"]


@pytest.fixture(scope="module")
def engine():
    if not (embedded_model_dir() / EMBEDDED_GGUF_FILE).exists():
        pytest.skip("embedded SmolLM2 not installed")
    return KVEngine(*load_model())


def test_batched_greedy_answers_equal_unbatched_ones(engine):
    entries = engine.encode_many(MEMORIES)
    items = [MemoryItem(f"m{i}", t, (lambda e=e: e)) for i, (t, e) in enumerate(zip(MEMORIES, entries))]
    per_request = [items[i % 5:] + items[: i % 3] for i in range(len(QUESTIONS))]  # different mounts and lengths
    modes = ["kv", "text"] * 3
    alone = [engine.generate(q, m, mode=mode, max_new_tokens=24).token_ids
             for q, m, mode in zip(QUESTIONS, per_request, modes)]
    together: list = [None] * len(QUESTIONS)
    barrier = threading.Barrier(len(QUESTIONS))

    def run(i: int) -> None:
        barrier.wait()
        together[i] = engine.generate(QUESTIONS[i], per_request[i], mode=modes[i], max_new_tokens=24).token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(QUESTIONS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert engine.decoder.max_batch_seen >= 3
    assert together == alone


def test_text_mode_prefix_cache_answers_as_without_it(engine):
    plain = KVEngine(engine.model, engine.tokenizer, prefix_cache=False)
    items = [MemoryItem(f"m{i}", t) for i, t in enumerate(MEMORIES)]
    for q in QUESTIONS[:3]:
        assert engine.generate(q, items, mode="text", max_new_tokens=24).token_ids == \
            plain.generate(q, items, mode="text", max_new_tokens=24).token_ids
