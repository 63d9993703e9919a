"""The same tool call made again: its newer result is what the call returns now.

A tool result is data, never merged or superseded on write (:data:`agentmem.consolidate.local.CONSOLIDATED_KINDS`).
But an agent that asks again (an order's status, an appointment, the weather in one city) stores the same call
with a newer result, and a mount holding both gives the model yesterday's "processing" beside today's "shipped".
So recall's conflict check puts a result behind a newer result of the same tool called with the same arguments
(:func:`agentmem.entries.messages.tool_call_of`): plain recall ranks it after that one, a mount leaves it out
(``MountChoice.contradicted``). No model and no threshold: the call is the same or it is not. Parts of one long
result (``metadata["document"]``) never demote each other.

Example:
    >>> rows = [EntryRecord(id=i, user_id="u", kind="tool", speaker="order_status", text="", memory_text="",
    ...                     created_at=t) for i, t in (("a", 1.0), ("b", 2.0))]
    >>> repeated_calls(rows, ['called with {"id": 7}, returned: processing',
    ...                       'called with {"id": 7}, returned: shipped'])
    {('a', 'b')}
"""

from __future__ import annotations

from collections.abc import Sequence

from agentmem.entries.documents import document_of
from agentmem.entries.messages import tool_call_of
from agentmem.ports.catalog import EntryRecord


def repeated_calls(rows: Sequence[EntryRecord], texts: Sequence[str]) -> set[tuple[str, str]]:
    """(older id, newer id) of tool results (``kind="tool"``, named by their tool) answering the same call, of one
    user; ``texts`` are the rows' plain texts.

    Example:
        >>> rows = [EntryRecord(id=i, user_id="u", kind="tool", speaker="get_weather", text="", memory_text="",
        ...                     created_at=t) for i, t in (("oslo", 1.0), ("rome", 2.0))]
        >>> repeated_calls(rows, ['called with {"city": "Oslo"}, returned: rain',
        ...                       'called with {"city": "Rome"}, returned: sun'])  # another call: both stand
        set()
    """
    calls: dict[tuple[str, str, str], list[int]] = {}
    for i, (row, text) in enumerate(zip(rows, texts)):
        call = tool_call_of(text) if row.kind == "tool" and row.speaker else None
        if call is not None:
            calls.setdefault((row.user_id, row.speaker or "", call), []).append(i)
    out: set[tuple[str, str]] = set()
    for same in calls.values():
        for a in same:
            for b in same:
                if rows[a].created_at < rows[b].created_at and not one_document(rows[a], rows[b]):
                    out.add((rows[a].id, rows[b].id))
    return out


def one_document(a: EntryRecord, b: EntryRecord) -> bool:
    """Whether two rows are parts of one text stored in parts (a document, a long message or tool result): the
    parts of one text never replace each other.

    Example:
        >>> part = lambda i: EntryRecord(id=i, user_id="u", kind="tool", text="", memory_text="", created_at=1.0,
        ...                              metadata_json={"document": {"id": "d", "part": int(i)}})
        >>> one_document(part("1"), part("2"))
        True
    """
    of = document_of(a.metadata_json)
    return of is not None and of == document_of(b.metadata_json)


__all__ = ["one_document", "repeated_calls"]
