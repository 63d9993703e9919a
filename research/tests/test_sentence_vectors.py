"""research/sentence_vectors.py: how a turn is split into sentences, which turns get sentence vectors (and as what
text), and which mix the cross-dataset choice picks and scores."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import _locomo_cache  # noqa: E402
import learned_ablation as la  # noqa: E402
import sentence_vectors as sv  # noqa: E402


def test_sentences_split_after_end_marks_and_keep_short_fragments_with_a_neighbour() -> None:
    assert sv.sentences("I moved to Lyon. The flat is small but bright!") == ["I moved to Lyon.",
                                                                              "The flat is small but bright!"]
    assert sv.sentences("Haha. Yes. We finally went to the lake on Sunday.") == [
        "Haha. Yes. We finally went to the lake on Sunday."]
    assert sv.sentences("one sentence without an end mark") == ["one sentence without an end mark"]


def test_only_turns_of_several_sentences_get_sentence_vectors_embedded_with_their_speaker() -> None:
    rows = {"a": _locomo_cache.Row("s1", "Ana", "[1 May] Ana: Hi there friend.", "Hi there friend."),
            "b": _locomo_cache.Row("s1", "Ben", "[1 May] Ben: I moved to Lyon. My dog is called Rex!",
                                   "I moved to Lyon. My dog is called Rex!")}
    turns = {"c1": [{"id": "a"}, {"id": "b"}]}
    vecs = {"c1": np.eye(2, 384, dtype=np.float32)}
    data = la.Data(questions=[], rows=rows, places={}, turns=turns, vecs=vecs, ctx=vecs, qvecs=np.zeros((0, 384)))
    embedded: list[str] = []

    def embed(texts: list[str]) -> np.ndarray:
        embedded.extend(texts)
        return np.ones((len(texts), 384), np.float32)

    owners, vectors = sv.sentence_max(data, embed, la.unique_turns(data))["c1"]
    assert embedded == ["Ben: I moved to Lyon.", "Ben: My dog is called Rex!"]
    assert owners.tolist() == [1, 1] and vectors.shape == (2, 384)


def test_the_mix_chosen_on_one_dataset_is_scored_on_the_other() -> None:
    flat = {m: [0.5, 0.6] for m in map(str, sv.MIXES)}
    cells = {"L0": flat | {"1.0": [0.6, 0.7]}, "R0": flat | {"0.25": [0.55, 0.65], "1.0": [0.4, 0.5]}}
    result = sv.cross_dataset(cells)
    assert result["fit_L"]["mix"] == 1.0 and result["fit_L"]["R0"] == {"chosen": [0.4, 0.5], "a=0": [0.5, 0.6]}
    assert result["fit_R"]["mix"] == 0.25 and result["fit_R"]["L0"] == {"chosen": [0.5, 0.6], "a=0": [0.5, 0.6]}
