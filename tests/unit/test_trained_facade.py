"""Trained entries through the facade: train, store, mount beside ordinary entries, refuse when stale."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmem import AgentMemory, StaleEntryError
from agentmem.kv.testing import tiny_causal_lm

DOC = "Ann: I moved to Oslo in May 2021 and I teach chemistry at the old school by the harbour. " * 6
TINY = dict(samples=2, batch_size=2, question_tokens=4, answer_tokens=4)


def test_train_store_mount_and_staleness(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with AgentMemory(store, model=tiny_causal_lm("llama", seed=0)) as mem:
        entry = mem.train(DOC, user_id="u", tags=["manual"], tokens=8, steps=2, seed=0, progress=False, **TINY)
        assert entry.kind == "trained" and entry.kv is not None and entry.kv.tokens == 8
        assert entry.text == DOC  # the document is kept for text mode and inspection
        assert entry.metadata["training"]["steps"] == 2
        mem.remember("Ann likes sailing on weekends.", user_id="u", tags=["manual"])
        out = mem.generate("Where does Ann teach?", user_id="u", tags=["manual"], k=2, max_new_tokens=2)
        assert set(out.mounted) >= {entry.id} and out.fallbacks == []
        fixed = mem.generate("Where does Ann teach?", user_id="u", tags=["manual"], k=2, max_new_tokens=2,
                             mode="kv+fix")
        assert entry.id in fixed.mounted
    # another model: the trained prefix no longer means the document, so it is never mounted
    with AgentMemory(store, model=tiny_causal_lm("llama", seed=1)) as mem:
        out = mem.generate("Where does Ann teach?", user_id="u", tags=["manual"], k=2, max_new_tokens=2)
        assert entry.id not in out.mounted
        assert any(i == entry.id and "model changed" in reason for i, reason in out.fallbacks)
        assert mem.stats()["kv"]["stale_trained"] == 1
        with pytest.raises(StaleEntryError):
            mem.generate("Where does Ann teach?", user_id="u", tags=["manual"], k=2, max_new_tokens=2, strict=True)
