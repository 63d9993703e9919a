"""Trained KV entries: a short KV prefix learned to stand for a long document, with the model frozen.

The facade's ``mem.train(document, ...)`` calls :func:`train_prefix`, stores ``TrainedPrefix.to_bytes()`` as the
entry's KV blob and ``TrainedPrefix.record`` in its metadata, and before mounting checks :func:`check_fresh`
(raises :class:`~agentmem.errors.StaleEntryError`) against the current document text and model fingerprint.

Example:
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> from agentmem.train import TrainOptions, TrainedPrefix, train_prefix, is_stale
    >>> model, tok = tiny_causal_lm("llama")
    >>> doc = "Ann: I moved to Oslo in May 2021. " * 8
    >>> tp = train_prefix(model, tok, doc, tokens=16, steps=1, progress=False,
    ...                   options=TrainOptions(samples=2, batch_size=2, question_tokens=4, answer_tokens=4))
    >>> back = TrainedPrefix.from_bytes(tp.to_bytes())
    >>> is_stale(back.record, doc, tp.record["model_fingerprint"]) is None
    True
"""

from agentmem.train.cartridge import TrainOptions, distill_loss, make_data, make_recall_data, train_prefix
from agentmem.train.layout import PromptLayout
from agentmem.train.prefix import TrainedPrefix, check_fresh, document_digest, is_stale

__all__ = [
    "PromptLayout",
    "TrainOptions",
    "TrainedPrefix",
    "check_fresh",
    "distill_loss",
    "document_digest",
    "is_stale",
    "make_data",
    "make_recall_data",
    "train_prefix",
]
