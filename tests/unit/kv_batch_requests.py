"""Concurrent requests for the batching tests (test_kv_batch.py, test_kv_packed_prefill.py): facts to mount and a
different set of them, in count and length, per request, on the tiny test model's engine."""

from __future__ import annotations

from agentmem.kv import KVEngine, MemoryItem

FACTS = ["Alice moved to Lisbon in 2021.", "Bob keeps bees.", "The blue door is locked on Sundays.",
         "Carol's cat is called Miso and it sleeps all day long.", "Dan bought a red bicycle."]


def request_memories(engine: KVEngine, i: int) -> list[MemoryItem]:
    """A different set (and count, and length) of mounted memories per request."""
    chosen = FACTS[i % len(FACTS):] + FACTS[: i % 2]
    entries = engine.encode_many(chosen)
    return [MemoryItem(f"m{i}-{j}", t, (lambda e=e: e)) for j, (t, e) in enumerate(zip(chosen, entries))]
