"""Remembered superseded_by chain ends (agentmem/entries/chain_ends.py) stay true when ANOTHER process cuts a chain in
its middle: a ``forget`` of a mid-chain entry, or an ``update`` of one (current again), run in a subprocess on the
same SQLite store. Each test fails without the catalog's chain-cut stamp: the recalling process then still lets
the old chain's end stand for the entries before the cut."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentmem import AgentMemory
from agentmem.entries.lifecycle import HistoryEvent

ROOT = Path(__file__).resolve().parents[2]
QUERY = "Which food did I eat at the market?"
NOTES = ["I ate sushi at the market on Monday.", "Pizza from the market stall was cheap.",
         "The market sells fresh ramen noodles.", "Lately it is only risotto for me.", "Gnocchi, every single day."]
DISTRACTORS = ("The market was busy on Saturday.", "I walked past the market twice.")
OPTIONS = dict(kv_encoding="off", recall_conflict_demotion=False)


@dataclass
class Shared:
    root: Path
    options: dict  # AgentMemory's options: every process opens the store with these
    mem: AgentMemory  # the process that recalls (and remembers chains)
    ids: list[str]  # NOTES' entries, one chain: sushi -> pizza -> ramen -> risotto -> gnocchi

    def in_other_process(self, code: str) -> None:
        """Run ``code`` with ``mem`` open on the same store in a separate Python process."""
        script = (f"from agentmem import AgentMemory\nwith AgentMemory({str(self.root)!r}, **{self.options!r}) as mem:\n"
                  + "".join(f"    {line}\n" for line in code.splitlines()))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]

    def fresh(self) -> list[str]:
        """What a process with nothing remembered recalls (the answer a remembering recall must match)."""
        with AgentMemory(self.root, **self.options) as other:
            return [h.id for h in other.recall(QUERY, user_id="u1", k=3)]


@pytest.fixture(params=["embedded", "postgres+pgvector"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Shared]:
    options = dict(OPTIONS)
    if request.param != "embedded":  # the stamp's upsert on PostgreSQL too
        options.update(catalog_url=request.getfixturevalue("fresh_postgres_url"), vector_url="pgvector")
    with AgentMemory(tmp_path / "m", **options) as mem:
        ids = [mem.remember(text, user_id="u1", session_id=f"s{n}").id for n, text in enumerate(NOTES)]
        for text in DISTRACTORS:
            mem.remember(text, user_id="u1")
        for old, new in zip(ids, ids[1:]):
            event = HistoryEvent(old, 1, "supersede", "", time.time(), "test", related_id=new)
            assert mem._store.lifecycle.apply_event(event)
        yield Shared(tmp_path / "m", options, mem, ids)


def test_a_chain_cut_by_a_forget_in_another_process_is_seen(shared: Shared) -> None:
    mem, ids = shared.mem, shared.ids
    assert mem.recall(QUERY, user_id="u1", k=1)[0].id == ids[-1]  # every chain remembered: all end at gnocchi
    shared.in_other_process(f"assert mem.forget({ids[2]!r}) == 1")  # ramen: sushi and pizza now stand for nothing
    hits = [h.id for h in mem.recall(QUERY, user_id="u1", k=3)]
    assert hits == shared.fresh()
    assert ids[2] not in hits and not {ids[0], ids[1]} & set(hits)


def test_a_mid_chain_entry_updated_in_another_process_ends_the_chains_through_it(shared: Shared) -> None:
    mem, ids = shared.mem, shared.ids
    assert mem.recall(QUERY, user_id="u1", k=1)[0].id == ids[-1]
    # pizza is current again (update re-activates it and drops its superseded_by): sushi stands for pizza now
    shared.in_other_process(f"mem.update({ids[1]!r}, text='Pizza from the market stall, every week now.')")
    assert mem._store.chains.of_user("u1")([ids[0]]) == {ids[0]: ids[1]}
    hits = [h.id for h in mem.recall(QUERY, user_id="u1", k=3)]
    assert hits == shared.fresh() and ids[1] in hits


def test_new_memories_keep_the_remembered_chains(shared: Shared) -> None:
    mem = shared.mem
    mem.recall(QUERY, user_id="u1", k=3)
    looked_up = mem._store.chains.lookups
    shared.in_other_process("mem.remember('The bakery near the market opened.', user_id='u1')")
    mem.remember("I bought bread at the market.", user_id="u1")
    mem.recall(QUERY, user_id="u1", k=3)
    assert mem._store.chains.lookups == looked_up  # no cut: nothing looked up again
