"""Recall's conflict check compares the recalled memories' text vectors; every write path stores them with the
entry, so a recall embeds its query and nothing it finds. Entries written with ``consolidate=False`` (LangGraph's
AgentMemStore writes that way) used to carry none and were re-embedded on every recall that looked at them
(2,000 such entries: recall p50 262 ms instead of 23 ms)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from agentmem import AgentMemory
from tests.unit.test_erasure_caches import WordsEmbedder

STATEMENTS = ["My favorite food is sushi.", "My favorite food is risotto now.", "The dog chewed my favorite shoes.",
              "I moved to Lyon in spring.", "I moved to Porto last month.", "Tom fixed the broken heater."]


class CountingEmbedder(WordsEmbedder):
    """The bag-of-words embedder, remembering every text it was asked to embed."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def encode(self, texts: Any, *, batch_size: int = 64) -> np.ndarray:
        self.seen.extend(texts)
        return super().encode(texts, batch_size=batch_size)


def _recall_embeds(tmp_path: Path, consolidate: bool) -> tuple[list[str], list[list[str]]]:
    """The stored texts embedded while recalling, and the recalled texts, over entries written either way."""
    embedder = CountingEmbedder()
    with AgentMemory(tmp_path / f"s{consolidate}", embedder=embedder, sweep_interval=None) as mem:
        mem.remember_many([{"text": t, "user_id": "u1", "speaker": "Ann" if i % 2 else None}
                           for i, t in enumerate(STATEMENTS)], consolidate=consolidate)
        embedder.seen.clear()
        hits = [[h.text for h in mem.recall(q, user_id="u1", k=4)]
                for q in ("What is my favorite food?", "Where did I move?", "Who fixed the heater?")]
    return [t for t in embedder.seen if t in STATEMENTS], hits


def test_recall_embeds_no_stored_text_whatever_the_write_path(tmp_path: Path) -> None:
    re_embedded, hits = _recall_embeds(tmp_path, consolidate=False)
    assert hits[0] and all(hits), "the recalls found nothing: the conflict check was not exercised"
    assert re_embedded == [], f"recall re-embedded stored texts written with consolidate=False: {re_embedded}"
    assert _recall_embeds(tmp_path, consolidate=True)[0] == []
