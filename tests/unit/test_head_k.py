"""recall() asks the store for a few hits more than it returns (the conflict check's look-ahead); the head it
re-ranks is sized for the k it returns, so its top k is ``search(k)``'s, the order the learned head was fitted on."""

from __future__ import annotations

import itertools
from pathlib import Path

from agentmem import AgentMemory
from agentmem.consolidate.local import demotion_pool
from agentmem.consolidate.store_parts import ConflictDemotion, local_consolidator
from agentmem.entries.store import Scope
from agentmem.recall.pipeline import Recaller

PEOPLE = ["Caroline", "Melanie", "John", "Maria", "Dave", "Gina"]
THINGS = ["went hiking by the lake", "painted a sunset", "adopted a puppy", "ran a charity race", "baked bread",
          "started a pottery class", "visited her parents", "read a book about counseling", "fixed an old car",
          "planted tomatoes", "played guitar at a cafe", "joined a support group", "took a photo of the stars"]
WHEN = ["last week", "yesterday", "in May", "two years ago"]
QUERIES = ["What did Caroline do last week?", "Who adopted a puppy?", "When did Melanie run a charity race?",
           "What activities does John enjoy?", "Would Maria like outdoor activities?", "What did Dave fix?"]


def test_recall_ranks_its_head_for_the_k_it_returns(tmp_path: Path) -> None:
    texts = [f"{p}: I {t} {w}." for p, t, w in itertools.islice(itertools.product(PEOPLE, THINGS, WHEN), 0, None, 3)]
    with AgentMemory(tmp_path / "store", kv_encoding="off", consolidation="off") as mem:
        for n, text in enumerate(texts):
            mem.remember(text, user_id="u", session_id=f"s{n // 8}", kind="turn")
        store, scope, deeper = mem._store, Scope("u"), 0
        for k in (10, 12):
            want = demotion_pool(k)
            for q in QUERIES:
                asked = [h.row.id for h in store.search(q, scope, k=k)]
                assert [h.row.id for h in store.search(q, scope, k=want, head_k=k)][:k] == asked
                deeper += [h.row.id for h in store.search(q, scope, k=want)][:k] != asked
        assert deeper > 0  # a head sized for the look-ahead orders some top k otherwise: the test can tell


def test_recall_with_its_conflict_check_asks_for_the_look_ahead_with_the_head_of_k(tmp_path: Path) -> None:
    # the recall pipeline of a store with consolidation, its store's search spied on
    with AgentMemory(tmp_path / "store", kv_encoding="off", consolidation="local") as mem:
        mem.remember("Caroline: I went hiking by the lake.", user_id="u")
        calls: list[dict] = []
        store = mem._store

        def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(kwargs)
            return store.search(*args, **kwargs)

        demotion = ConflictDemotion(local_consolidator(store, mem.config, bundled_pairs=True), store)
        recaller = Recaller(config=mem.config, search=spy, recall_state=lambda session: (None, 0),
                            hit_of=lambda s: s.row.id, demotion=demotion)
        assert recaller.recall("Where did Caroline go?", Scope("u"), k=5)
        assert calls[-1]["k"] == demotion_pool(5) > 5 and calls[-1]["head_k"] == 5
        calls.clear()
        off = Recaller(config=mem.config.model_copy(update={"recall_conflict_demotion": False}), search=spy,
                       recall_state=lambda session: (None, 0), hit_of=lambda s: s.row.id, demotion=demotion)
        off.recall("Where did Caroline go?", Scope("u"), k=5)
        assert calls[-1]["k"] == 5  # no conflict check: no look-ahead
