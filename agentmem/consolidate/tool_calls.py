"""The same tool call made again: its newer result is what the call returns now.

A tool result is data, never merged with another memory nor judged by the check of statements (a model of what
people say, :data:`agentmem.consolidate.local.CONSOLIDATED_KINDS`). But an agent that asks again (an order's status,
an appointment, the weather in one city) stores the same call with a newer result, and a mount holding both gives
the model yesterday's "processing" beside today's "shipped". So a tool's result replaces the earlier results of the
same tool called with the same arguments (:func:`agentmem.entries.messages.tool_call_of`): on write, with the local
consolidation, they are superseded (:func:`replaced_results`: ``event="UPDATE"``, their history kept,
``restore`` undoes it), and recall's conflict check puts any that are still active behind the newer
(:func:`repeated_calls`: results stored as given, ``remember_many(consolidate=False)``, or before this rule), so a
mount leaves them out. With ``consolidation="off"`` neither runs: results are stored and recalled as given. No model
and no threshold: the call is the same or it is not. Parts of one long result (``metadata["document"]``) never
replace each other.

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
    out: set[tuple[str, str]] = set()
    for newer, text in zip(rows, texts):
        call = call_of(newer, text)
        if call is not None:
            out.update((older.id, newer.id) for older, said in zip(rows, texts) if _replaces(newer, call, older, said))
    return out


REPLACED = "the same call returned a newer result"


def replaced_results(row: EntryRecord, text: str, earlier: Sequence[tuple[EntryRecord, str]]) -> list[str]:
    """The ids of the ``earlier`` results (active rows of the same user, with their plain texts) that ``row``'s
    result replaces on write: the same tool called with the same arguments, written before it, not a part of the
    same text. A long result's first part stands for it: its other parts replace nothing (the first did).

    Example:
        >>> tool = lambda i, t: EntryRecord(id=i, user_id="u", kind="tool", speaker="order_status", text="",
        ...                                 memory_text="", created_at=t)
        >>> said = 'called with {"id": 7}, returned: '
        >>> replaced_results(tool("new", 3.0), said + "shipped", [(tool("old", 1.0), said + "processing"),
        ...                  (tool("other", 2.0), 'called with {"id": 8}, returned: processing')])
        ['old']
    """
    call = call_of(row, text)
    if call is None or _part_number(row) not in (None, 1):
        return []
    return [older.id for older, said in earlier if _replaces(row, call, older, said)]


def call_of(row: EntryRecord, text: str) -> str | None:
    """The call a tool result named by its tool answered (:func:`~agentmem.entries.messages.tool_call_of` of its
    plain ``text``); None for any other row.

    Example:
        >>> result = EntryRecord(id="r", user_id="u", kind="tool", speaker="get_weather", text="", memory_text="",
        ...                      created_at=1.0)
        >>> call_of(result, 'called with {"city": "Oslo"}, returned: rain')
        '{"city": "Oslo"}'
    """
    return tool_call_of(text) if row.kind == "tool" and row.speaker else None


def _replaces(newer: EntryRecord, call: str, older: EntryRecord, older_text: str) -> bool:
    """Whether ``newer``, a result of ``call``, replaces ``older``: the same user's result of the same tool and call,
    written before it, not a part of the same text."""
    return (older.id != newer.id and older.kind == "tool" and older.speaker == newer.speaker
            and older.user_id == newer.user_id and older.created_at < newer.created_at
            and not one_document(older, newer) and tool_call_of(older_text) == call)


def _part_number(row: EntryRecord) -> object:
    document = (row.metadata_json or {}).get("document")
    return document.get("part") if isinstance(document, dict) and document_of(row.metadata_json) else None


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


__all__ = ["REPLACED", "call_of", "one_document", "replaced_results", "repeated_calls"]
