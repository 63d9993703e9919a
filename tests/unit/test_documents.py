"""Long texts (``remember_document``): split into parts that are each recalled and mounted on their own, written
all-or-nothing, erased together by their tag; ``split_document``'s cuts."""

from __future__ import annotations

import pytest

from agentmem import AgentMemory, InvalidInputError
from agentmem.entries.documents import split_document
from agentmem.kv.testing import tiny_causal_lm

SECTIONS = {
    "port": "The Graslei is Ghent's old port, lined with guild houses from the twelfth century onwards.",
    "castle": "The Gravensteen is a castle that the Count of Flanders built in 1180 on an older wooden fort.",
    "trams": "Trams 1 and 4 run from Sint-Pieters station to the Korenmarkt every ten minutes until midnight.",
}
GUIDE = "\n\n".join(" ".join([text] * 8) for text in SECTIONS.values())  # three paragraphs of ~130 words each


def test_a_long_guide_is_recalled_and_mounted_by_its_relevant_part(tmp_path):
    with AgentMemory(tmp_path / "s", model=tiny_causal_lm("llama"), mount_budget_tokens=400,
                     mount_min_score=0.0) as mem:
        whole = mem.remember(GUIDE, user_id="whole", kind="knowledge")
        parts = mem.remember_document(GUIDE, user_id="u1", title="Ghent guide", max_words=60, tags=["ghent"])
        question = "Which trams go from the station to the Korenmarkt?"
        # one memory that long is longer than the mount's room: recalled, then dropped, so nothing is mounted
        alone = mem.generate(question, user_id="whole", k=2, max_new_tokens=2)
        assert alone.mounted == [] and alone.dropped == [whole.id]
        out = mem.generate(question, user_id="u1", k=2, max_new_tokens=2)
    assert len(parts) > 3 and all(p.text.startswith("Ghent guide: ") for p in parts)
    assert [p.metadata["document"]["part"] for p in parts] == list(range(1, len(parts) + 1))
    assert len({p.metadata["document"]["id"] for p in parts}) == 1
    assert out.mounted and "Trams 1 and 4" in next(p.text for p in parts if p.id == out.mounted[0])


def test_parts_are_kept_as_given_and_forgotten_by_their_tag(mem: AgentMemory):
    mem.remember("The Gravensteen is a castle.", user_id="u1")  # a lookalike a consolidating write would merge
    parts = mem.remember_document(GUIDE, user_id="u1", max_words=60, tags=["guide"], metadata={"source": "web"})
    assert {p.event for p in parts} == {"ADD"} and all(p.metadata["source"] == "web" for p in parts)
    assert parts[0].metadata["document"]["title"] is None and parts[0].text.startswith("The Graslei")
    assert mem.forget(user_id="u1", tags=["guide"]) == len(parts)
    assert [r.text for r in mem.list(user_id="u1")] == ["The Gravensteen is a castle."]


@pytest.mark.parametrize("kwargs, match", [
    ({"text": "  "}, "text is empty"), ({"max_words": 0}, "max_words must be a positive integer"),
    ({"title": "two\nlines"}, "title"), ({"metadata": {"x": float("nan")}}, "metadata"),
])
def test_bad_input_stores_nothing(mem: AgentMemory, kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        mem.remember_document(**{"text": GUIDE, "user_id": "u1", **kwargs})
    assert mem.list(user_id="u1") == []


def test_split_document_cuts_between_paragraphs_then_sentences_then_words():
    text = "Short intro.\n\n" + " ".join(f"Sentence {i} ends here." for i in range(30)) + "\n\nA list:\n- one\n- two"
    parts = split_document(text, max_words=20)
    assert all(len(p.split()) <= 20 for p in parts)
    assert " ".join(" ".join(parts).split()) == " ".join(text.split())  # every word, in order, once
    assert all(p.endswith((".", "two")) for p in parts)  # no sentence is cut
    assert parts[-1].endswith("A list:\n- one\n- two")  # a paragraph that fits keeps its line breaks
    assert split_document("w " * 45, max_words=20) == ["w " * 19 + "w"] * 2 + ["w " * 4 + "w"]
