"""``AgentMemRetriever``: a user's memories as a LangChain retriever (``BaseRetriever``), for RAG chains and tools.

``retriever.invoke(query)`` is ``mem.recall(query, user_id=..., k=...)`` as LangChain ``Document``\\ s: the memory's
text as ``page_content``, its entry id as ``Document.id``, and its record in ``metadata`` (``score`` in [0, 1],
``kind``, ``role``, ``speaker``, ``session_id``, ``occurred_at``, ``tags`` and the memory's own metadata). The user
comes from the call (``invoke(query, user_id=...)``), the graph's config when it runs inside a graph
(``configurable["user_id"]``, as the memory node reads it), the run's metadata (``config={"metadata": {"user_id":
...}}``) or the constructor, in that order; ``k`` from the call or the constructor, as LangChain's retrievers take it.

Example:
    >>> retriever = AgentMemRetriever(memory=mem, user_id="u1", k=2, min_score=0.3)   # doctest: +SKIP
    >>> [d.page_content for d in retriever.invoke("Where do I live?")]                 # doctest: +SKIP
    ['I moved to Lyon last May.']
"""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables.config import ensure_config
from pydantic import ConfigDict, Field

from agentmem import Hit
from agentmem_langgraph._context import resolve_scope

__all__ = ["AgentMemRetriever", "hit_document"]


def hit_document(hit: Hit) -> Document:
    """A recalled memory as a LangChain ``Document`` (see the module docstring for its fields).

    Example:
        >>> doc = hit_document(mem.recall("Where do I live?", user_id="u1", k=1)[0])     # doctest: +SKIP
        >>> doc.page_content, doc.metadata["kind"]                                        # doctest: +SKIP
        ('I moved to Lyon last May.', 'turn')
    """
    record = {"score": hit.score, "kind": hit.kind, "role": hit.role, "speaker": hit.speaker,
              "session_id": hit.session_id, "occurred_at": hit.occurred_at, "tags": list(hit.tags)}
    return Document(page_content=hit.text, id=hit.id, metadata={**hit.metadata, **record, "id": hit.id})


class AgentMemRetriever(BaseRetriever):
    """Recall one user's memories for a query (:meth:`agentmem.AgentMemory.recall`), best first.

    Args:
        memory: the :class:`agentmem.AgentMemory` to search.
        user_id: the user when neither the call nor the run's config names one.
        k: how many memories (a call's ``k=`` overrides it).
        min_score: leave out memories scoring below it (``Hit.score``: 0.3 and below reads as unrelated).
        kinds / tags / filters: :meth:`~agentmem.AgentMemory.recall`'s scope filters.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: Any = Field(exclude=True)
    user_id: str | None = None
    k: int = Field(default=4, gt=0)
    min_score: float | None = None
    kinds: list[str] | None = None
    tags: list[str] | None = None
    filters: dict[str, Any] | None = None

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **kwargs: Any) -> list[Document]:
        # inside a graph node, ensure_config() is that node's config; a plain invoke's config reaches the retriever
        # only through the run's metadata (LangChain does not hand its `configurable` on to retrievers)
        conf = dict(ensure_config().get("configurable") or {})
        meta = dict(getattr(run_manager, "metadata", None) or {})
        if kwargs.get("user_id") or (not conf.get("user_id") and meta.get("user_id")):
            conf["user_id"] = kwargs.get("user_id") or meta["user_id"]
        user, _ = resolve_scope({"configurable": conf}, default_user=self.user_id)
        hits = self.memory.recall(query, user_id=user, k=int(kwargs.get("k", self.k)), kinds=self.kinds,
                                  tags=self.tags, filters=self.filters, min_score=self.min_score)
        return [hit_document(h) for h in hits]
