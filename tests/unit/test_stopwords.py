"""BM25's query, the consolidation's word overlap and the head's question words drop the same function words
(agentmem.text.STOPWORDS) and keep the same content words."""

from __future__ import annotations

from agentmem.backends.sqlite.catalog import fts_query
from agentmem.text import content_words
from agentmem.recall.head_cues import question_words
from agentmem.text import STOPWORDS


def test_every_stopword_is_dropped_by_all_three() -> None:
    assert len(STOPWORDS) > 100
    for w in STOPWORDS:
        assert fts_query(w) is None and content_words(w) == set() and question_words(w, []) == [], w


def test_content_words_are_kept_by_all_three() -> None:
    text = "where did the dog go with my sister"
    assert content_words(text) == {"dog", "go", "sister"}
    assert fts_query(text) == '"dog" OR "go" OR "sister"'
    assert len(question_words(text, [])) == 3
