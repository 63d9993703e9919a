"""Concurrent requests for the batching tests (test_kv_batch.py, test_kv_packed_prefill.py, test_turn_batch.py):
facts to mount and a different set of them, in count and length, per request, on the tiny test model's engine; and a
record of what each packed step fed."""

from __future__ import annotations

from agentmem.kv import KVEngine, MemoryItem

FACTS = ["Alice moved to Lisbon in 2021.", "Bob keeps bees.", "The blue door is locked on Sundays.",
         "Carol's cat is called Miso and it sleeps all day long.", "Dan bought a red bicycle."]


def request_memories(engine: KVEngine, i: int) -> list[MemoryItem]:
    """A different set (and count, and length) of mounted memories per request."""
    chosen = FACTS[i % len(FACTS):] + FACTS[: i % 2]
    entries = engine.encode_many(chosen)
    return [MemoryItem(f"m{i}-{j}", t, (lambda e=e: e)) for j, (t, e) in enumerate(zip(chosen, entries))]


def record_packed_steps(engine: KVEngine, monkeypatch) -> list[tuple[int, int]]:
    """From now on (for the test), each packed step of ``engine.decoder``'s first lane (the only one of an engine
    made with ``decode_lanes=1``) appends (rows decoding, prompt tokens fed) to the returned list."""
    steps: list[tuple[int, int]] = []
    lane = engine.decoder.lanes[0]
    packed = lane._packed_forward

    def spy(active, prompts):
        before = sum(p.fed for p in prompts)
        out = packed(active, prompts)
        steps.append((len(active), sum(p.fed for p in prompts) - before))
        return out

    monkeypatch.setattr(lane, "_packed_forward", spy)
    return steps
