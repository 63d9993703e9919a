"""Ranking at recall: fusion of the dense and lexical candidates (:mod:`.retrieval`), the re-ranked head
(:mod:`.head`, :mod:`.rerank`, :mod:`.learned_rank`, :mod:`.head_cues`, :mod:`.temporal`, :mod:`.multihop`,
:mod:`.context`) and the calibrated score (:mod:`.calibration`)."""
