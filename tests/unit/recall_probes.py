"""A small store of probe memories for recall tests that pin a faster path against the one it replaced: version
chains (written the way another process's consolidation writes them), tags, metadata filters, an expired entry and
another user's memory, with probe queries and the recall variants that reach each of them (not a test module)."""

from __future__ import annotations

import time

from agentmem import AgentMemory
from agentmem.entries.lifecycle import HistoryEvent

NOTES = [
    ("I ate sushi at the market on Monday.", "Ann", ["food"], {"mood": "happy"}),
    ("Pizza from the market stall was cheap.", "Ann", ["food", "cheap"], {"price": 4}),
    ("The market sells fresh ramen noodles.", "Bob", [], {}),
    ("Lately it is only risotto for me.", "Ann", ["food"], {"mood": "bored"}),
    ("My sister moved to Lyon last spring.", "Bob", ["family"], {"city": "Lyon"}),
    ("We booked a trip to Porto for the wedding.", "Ann", ["travel"], {}),
    ("The dentist appointment is on Friday at 9.", "Bob", ["health"], {"when": "friday"}),
    ("Grandma painted the old piano red.", "Ann", [], {"color": "red"}),
    ("Tom fixed the broken heater in January.", "Bob", ["home"], {}),
    ("I lost the concert tickets again.", "Ann", ["music"], {"n": [1, 2]}),
]
PROBES = ["Which food did I eat at the market?", "where did my sister move?", "when is the dentist?",
          "what did grandma paint?", "who fixed the heater?", "concert tickets", "trip to Porto wedding",
          "what does Ann like to eat?", "noodles", "something nobody said"]


def _fill(mem: AgentMemory) -> list[str]:
    ids = []
    for n, (text, speaker, tags, meta) in enumerate(NOTES):
        ids.append(mem.remember(text, user_id="u1", session_id=f"s{n % 3}", speaker=speaker, tags=tags,
                                metadata=meta).id)
    mem.remember("The market closes at noon today.", user_id="u1", ttl=0.05)  # expired by the time we recall
    mem.remember("Sushi for the other user.", user_id="u2")
    # a chain the way another process's consolidation writes it: sushi -> pizza -> risotto
    for old, new in ((ids[0], ids[1]), (ids[1], ids[3])):
        event = HistoryEvent(old, 1, "supersede", "", time.time(), "test", related_id=new)
        assert mem._store.lifecycle.apply_event(event)
    time.sleep(0.06)
    return ids


def _recalls(mem: AgentMemory) -> list[list[object]]:
    out = []
    for query in PROBES:
        for kwargs in ({}, {"k": 3}, {"include_superseded": True}, {"tags": ["food"]},
                       {"filters": {"mood": "bored"}}, {"session_id": "s1"}):
            out.append(mem.recall(query, user_id="u1", **kwargs))
    return out
