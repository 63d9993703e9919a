"""Questions whose answer is a list ("What activities does Melanie partake in?", "Which cities has Jon
visited?", "How many times …"): their evidence is spread over several sessions, so the session boost, which lifts
the other turns of the best-matching session, crowds the top 10 with one session. For these questions the boost
is weaker (``RetrievalParams.list_session_weight``).

Measured on LoCoMo (``research/multihop_ablation.py --signals listq``; the weight chosen on 4 conversations,
scored on the 5th): every fold chose 0.25 of {0, 0.1, 0.25, 0.5}; held-out recall@5 / @10 0.7213 / 0.8018 →
0.7220 / 0.8039, multi-hop (cat. 1) recall@10 0.499 → 0.510 (research/notes/retrieval-lab-notes.md, with the losers: clause
decomposition, a per-session cap, adjacent-turn expansion, a keyword-only query). The detection is the question's
form only (:func:`agentmem.recall.query.list_question`, parsed once into ``QueryInfo.is_list``), no topic word list.

Example:
    >>> list_question("What activities does Melanie partake in?"), list_question("What is Jon's job?")
    (True, False)
    >>> for_query(RetrievalParams(), "Which cities has Jon visited?").session_weight
    0.25
"""

from __future__ import annotations

from dataclasses import replace

from agentmem.recall.query import QueryInfo, as_query, list_question
from agentmem.recall.retrieval import RetrievalParams


def for_query(params: RetrievalParams, query: str | QueryInfo) -> RetrievalParams:
    """``params`` for this query: a list question gets ``list_session_weight`` as its session weight.

    Example:
        >>> for_query(RetrievalParams(), "What did Caroline research?").session_weight
        0.5
    """
    if params.list_session_weight == params.session_weight or not as_query(query).is_list:
        return params
    return replace(params, session_weight=params.list_session_weight)


__all__ = ["for_query", "list_question"]
