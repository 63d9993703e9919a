"""Sessions: each conversation's working KV reused across turns, kept in hot / warm / cold tiers.

>>> chat = mem.session("s1", user_id="u1")                                      # doctest: +SKIP
>>> r = chat.send("Remember that my sister is called Inès.", k=4)             # doctest: +SKIP
>>> r.text, r.reused_tokens, r.mounted, r.timings["ttft"]                      # doctest: +SKIP
>>> mem.sessions.offload("s1", to="disk"); mem.sessions.restore("s1")         # doctest: +SKIP
>>> mem.sessions.stats()["cold"]["restore_latency_s"]                          # doctest: +SKIP

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
