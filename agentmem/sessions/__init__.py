"""Sessions: each conversation's working KV reused across turns, kept in hot / warm / cold tiers.

>>> chat = mem.session("s9", user_id="u1")          # mem: an AgentMemory holding "My dog is called Rex."
>>> r = chat.send("What is my dog called?", k=4, max_new_tokens=2)
>>> r.mounted == [dog.id], r.reused_tokens
(True, 0)
>>> chat.send("And my cat?", max_new_tokens=2).reused_tokens > 0     # the first turn's KV reused
True
>>> mem.sessions.offload("s9", to="disk", user_id="u1"), mem.sessions.restore("s9", user_id="u1")["from"]
('cold', 'cold')
>>> mem.sessions.stats()["cold"]["restores"]
1

See ``docs/sessions.md`` for the turn layout, the tiers and measured numbers.
"""

from agentmem.sessions.layout import ChatLayout
from agentmem.sessions.manager import SessionManager
from agentmem.sessions.session import Session, TurnResult
from agentmem.sessions.slot import SessionSlot
from agentmem.ports.sessions import SessionTierStore
from agentmem.sessions.tiers import LRUPolicy, MemoryBackend, Tier, TierBackend

__all__ = [
    "ChatLayout",
    "LRUPolicy",
    "MemoryBackend",
    "Session",
    "SessionManager",
    "SessionSlot",
    "SessionTierStore",
    "Tier",
    "TierBackend",
    "TurnResult",
]
