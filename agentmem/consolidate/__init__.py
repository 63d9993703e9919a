"""Consolidation: the local rule (:mod:`.local`) with its pairwise supersession model (:mod:`.pairs`, weights in
``weights/``), the LLM consolidator (:mod:`.llm`), and what recall does with versions (:mod:`.versions`,
:mod:`.chain_ends`)."""
