"""Training data for trained entries: recall samples and self-study conversations, with teacher log-probs.

**Recall** (:func:`recall`, the default data): one sample per line of the document, "quote the line that begins
<its first words>" answered with the line itself, teacher-forced under the whole-document teacher. Deterministic,
one forward pass per few lines, and it carries the document's specific content.

**Self-study** (:func:`generate`): following Cartridges (Eyuboglu et al., 2025), the model sees one chunk of the document plus a seed instruction and
samples a question about it; then, with the whole document in context (the *teacher* context), it samples an
answer. The teacher's next-token distributions over the question and answer tokens are recorded on the way
(top-k log-probabilities), so no second teacher pass is needed: the answer pass *is* the teacher pass.

Everything is sampled from an explicit ``torch.Generator`` seeded by the caller, so the same seed, model and
document give the same data.

Example:
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> model, tok = tiny_causal_lm("llama")
    >>> layout = PromptLayout.for_tokenizer(tok)
    >>> data = generate(model, layout, "Ann: I moved to Oslo in May.", layout.preamble_ids(), samples=4, seed=0)
    >>> data.ids.shape[0], data.topk_ids.shape[-1]
    (4, 20)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

from agentmem.train import _kv
from agentmem.train.layout import PromptLayout

__all__ = ["QUESTION_INSTRUCTION", "QUESTION_OPENERS", "RECALL_INSTRUCTION", "SelfStudyData", "chunk_text", "generate",
           "recall", "sample", "segments"]

# How questions are seeded. Cartridges varies seed prompts for diversity; a 135M chat model asked for "a question
# about the text" mostly writes generic ones, so the assistant's reply is started with a question opener instead
# (cycled, so every chunk gets who/what/when/where/why/how questions). Nothing here knows any benchmark's
# question categories: these are just the English interrogatives.
QUESTION_INSTRUCTION = "Write one question about the text above."
QUESTION_OPENERS: tuple[str, ...] = (
    "What did", "When did", "Who", "Why did", "How did", "Where did", "What is", "How does",
)

# Recall samples: the question names a line of the document by its first words, the answer is the line itself.
# The teacher (whole document in context) can copy it, so its distributions carry the document's specific content
# (names, dates, numbers) rather than the diffuse, document-wide effects the self-generated Q/A mostly carry.
RECALL_INSTRUCTION = 'Quote the line of the text above that begins "{key}".'


@dataclass
class SelfStudyData:
    """Padded training samples with the teacher's top-k next-token log-probs.

    ``ids[n, :lengths[n]]`` is one sample (question turn + answer turn); position ``j`` of ``topk_ids/topk_logp``
    is the teacher's distribution over token ``j + 1`` (so ``lengths[n] - 1`` positions are meaningful).
    """

    ids: torch.Tensor        # (N, T) int64, right-padded
    lengths: torch.Tensor    # (N,) int64
    topk_ids: torch.Tensor   # (N, T - 1, k) int64
    topk_logp: torch.Tensor  # (N, T - 1, k) float32

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"data.ids": self.ids, "data.lengths": self.lengths, "data.topk_ids": self.topk_ids,
                "data.topk_logp": self.topk_logp}

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor]) -> SelfStudyData:
        return cls(t["data.ids"], t["data.lengths"], t["data.topk_ids"], t["data.topk_logp"])

    def digest(self) -> str:
        """sha256 of the data tensors: names the data in a run's identity."""
        h = hashlib.sha256()
        for name, t in sorted(self.tensors().items()):
            h.update(name.encode())
            h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def repeat(self, times: int) -> SelfStudyData:
        """Every sample ``times`` times (how a small sample set is weighted against a larger one)."""
        return SelfStudyData(self.ids.repeat(times, 1), self.lengths.repeat(times),
                             self.topk_ids.repeat(times, 1, 1), self.topk_logp.repeat(times, 1, 1))

    @classmethod
    def concat(cls, parts: list[SelfStudyData], pad: int = 0) -> SelfStudyData:
        """One data set from several, right-padded to the widest (padding is never scored)."""
        width = max(p.ids.shape[1] for p in parts)
        ids, tk_ids, tk_logp = [], [], []
        for p in parts:
            n, w = p.ids.shape
            k = p.topk_ids.shape[-1]
            x = torch.full((n, width), pad, dtype=torch.long)
            x[:, :w] = p.ids
            ti = torch.zeros((n, width - 1, k), dtype=torch.long)
            ti[:, :w - 1] = p.topk_ids
            tl = torch.full((n, width - 1, k), -torch.inf, dtype=torch.float32)
            tl[:, :w - 1] = p.topk_logp
            ids.append(x)
            tk_ids.append(ti)
            tk_logp.append(tl)
        return cls(torch.cat(ids), torch.cat([p.lengths for p in parts]), torch.cat(tk_ids), torch.cat(tk_logp))


def _head(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    return model.get_output_embeddings()(hidden).float()


@torch.no_grad()
def sample(model: Any, prefix: tuple[torch.Tensor, torch.Tensor], prompts: list[list[int]], *, max_new: int,
           temperature: float, generator: torch.Generator, stop_ids: set[int], pad_id: int, top_k: int = 0
           ) -> tuple[list[list[int]], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Sample continuations of ``prompts`` (batched) after a shared ``prefix`` KV; optionally record top-k.

    Prompts are left-padded so every row's last prompt token is aligned; an attention mask hides the pads and
    position ids continue from the prefix without counting them, so each row sees exactly the positions it would
    see alone. With ``top_k > 0`` it also returns, per row, the top-k log-probs (temperature 1) at every prompt
    position and every generated token except the last, i.e. the teacher distribution for tokens
    ``prompt[1:] + generated``.
    """
    batch, plen, width = len(prompts), prefix[0].shape[2], max(len(p) for p in prompts)
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    mask = torch.zeros((batch, plen + width), dtype=torch.long)
    mask[:, :plen] = 1
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, plen + width - len(p):] = 1
    pos = (plen + mask[:, plen:].cumsum(-1) - 1).clamp(min=plen)
    cache = _kv.buffered_cache(*prefix, batch=batch, capacity=plen + width + max_new) if plen else None
    hidden, cache = _kv.forward_hidden(model, ids, cache, attention_mask=mask, position_ids=pos)
    logits = _head(model, hidden)
    records: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(batch)]
    if top_k:
        logp = torch.log_softmax(logits, -1).topk(top_k, -1)
        for r, p in enumerate(prompts):
            records[r].append((logp.indices[r, width - len(p):], logp.values[r, width - len(p):]))
    out: list[list[int]] = [[] for _ in range(batch)]
    done = torch.zeros(batch, dtype=torch.bool)
    last, next_pos = logits[:, -1], pos[:, -1] + 1
    for step in range(max_new):
        probs = torch.softmax(last / max(temperature, 1e-6), -1)
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(1) if temperature > 0 else last.argmax(-1)
        for r in range(batch):
            if not done[r]:
                out[r].append(int(tok[r]))
                done[r] = int(tok[r]) in stop_ids
        if bool(done.all()) or step == max_new - 1:
            break
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], 1)
        hidden, cache = _kv.forward_hidden(model, tok.view(-1, 1), cache, attention_mask=mask,
                                           position_ids=next_pos.view(-1, 1))
        last, next_pos = _head(model, hidden)[:, -1], next_pos + 1
        if top_k:
            # Rows that already stopped get records too; they are cut off below (simpler than skipping rows).
            logp = torch.log_softmax(last, -1).topk(top_k, -1)
            for r in range(batch):
                records[r].append((logp.indices[r:r + 1], logp.values[r:r + 1]))
    recs = []
    if top_k:
        for r in range(batch):
            idx = torch.cat([i for i, _ in records[r]])
            val = torch.cat([v for _, v in records[r]])
            n = len(prompts[r]) + len(out[r]) - 1  # predictions for tokens 1 .. end
            recs.append((idx[:n], val[:n]))
    return out, recs


def chunk_text(document: str, count: Callable[[str], int], chunk_tokens: int) -> list[str]:
    """Group whole lines into chunks of about ``chunk_tokens`` tokens (``count`` measures a string).

    Lines keep facts intact (a conversation turn, a manual paragraph); chunks are balanced so the last one is
    not a stub. A single line longer than a chunk becomes its own chunk.
    """
    lines = [ln for ln in document.split("\n") if ln.strip()]
    if not lines:
        return [document]
    sizes = [count(ln) + 1 for ln in lines]
    n = max(1, round(sum(sizes) / max(1, chunk_tokens)))
    target = sum(sizes) / n
    chunks, cur, used = [], [], 0
    for ln, size in zip(lines, sizes):
        if cur and used + size / 2 > target and len(chunks) < n - 1:
            chunks.append("\n".join(cur))
            cur, used = [], 0
        cur.append(ln)
        used += size
    chunks.append("\n".join(cur))
    return chunks


def _clean_question(text: str) -> str:
    # Small models often keep talking after the question; keep the first line, up to the first '?'.
    line = text.strip().split("\n")[0].strip()
    if "?" in line:
        line = line[: line.index("?") + 1]
    return line


def generate(model: Any, layout: PromptLayout, document: str, preamble_ids: list[int], *, samples: int,
             seed: int, chunk_tokens: int = 256, question_tokens: int = 24, answer_tokens: int = 40,
             temperature: float = 0.7, top_k: int = 20, teacher_max_tokens: int = 4096, rows: int = 32,
             on_progress: Callable[[int], None] | None = None) -> SelfStudyData:
    """Generate ``samples`` question/answer conversations about ``document`` with teacher top-k log-probs.

    Questions are spread evenly over chunks of about ``chunk_tokens`` (whole lines; so the whole document is asked
    about, not just its start) and over :data:`QUESTION_OPENERS`; a chunk is shown as a memory entry after the
    preamble, the model is asked for a question and its reply is started with the opener. The teacher context is
    the whole document after the preamble when it is at most ``teacher_max_tokens`` long (the exact context the
    trained entry replaces), else the question's own chunk. ``rows`` bounds the batch of one sampling call (memory).
    """
    gen = torch.Generator().manual_seed(seed)
    pad = layout.tokenizer.pad_token_id if layout.tokenizer.pad_token_id is not None else 0
    stops = layout.stop_ids()
    pre = torch.tensor(preamble_ids, dtype=torch.long)
    pre_kv = _kv.encode(model, pre) if preamble_ids else _kv.empty(model)
    doc_ids = layout.document_ids(document)
    doc = torch.tensor(doc_ids, dtype=torch.long)
    whole_doc = len(doc_ids) <= teacher_max_tokens
    doc_kv = _cat(pre_kv, _kv.encode(model, doc, pre_kv)) if whole_doc else None
    ask = layout.question_ids(QUESTION_INSTRUCTION)
    chunks = chunk_text(document, lambda t: len(layout.answer_ids(t, end=False)), chunk_tokens)
    per_chunk = [samples // len(chunks) + (1 if i < samples % len(chunks) else 0) for i in range(len(chunks))]
    sample_ids: list[list[int]] = []
    teacher: list[tuple[torch.Tensor, torch.Tensor]] = []
    q_no = 0
    for chunk, n in zip(chunks, per_chunk):
        if n == 0:
            continue
        chunk_kv = _cat(pre_kv, _kv.encode(model, torch.tensor(layout.document_ids(chunk)), pre_kv))
        teacher_kv = doc_kv if whole_doc else chunk_kv
        for lo in range(0, n, rows):
            m = min(rows, n - lo)
            openers = [QUESTION_OPENERS[(q_no + j) % len(QUESTION_OPENERS)] for j in range(m)]
            q_no += m
            prompts = [ask + layout.answer_ids(o, end=False) for o in openers]
            q_out, _ = sample(model, chunk_kv, prompts, max_new=question_tokens, temperature=temperature,
                              generator=gen, stop_ids=stops, pad_id=pad)
            questions = [_clean_question(o + layout.tokenizer.decode(q, skip_special_tokens=True))
                         for o, q in zip(openers, q_out)]
            q_ids = [layout.question_ids(q) for q in questions]
            a_out, recs = sample(model, teacher_kv, q_ids, max_new=answer_tokens, temperature=temperature,
                                 generator=gen, stop_ids=stops, pad_id=pad, top_k=top_k)
            for qi, a, rec in zip(q_ids, a_out, recs):
                sample_ids.append(qi + a)
                teacher.append(rec)
            if on_progress is not None:
                on_progress(m)
    return _pad(sample_ids, teacher, pad, top_k)


def segments(document: str, count: Callable[[str], int], max_tokens: int) -> list[str]:
    """The document's non-empty lines, long ones cut at word boundaries into pieces of at most ``max_tokens``."""
    out = []
    for line in (ln.strip() for ln in document.split("\n")):
        if not line:
            continue
        piece: list[str] = []
        for word in line.split():
            if piece and count(" ".join(piece + [word])) > max_tokens:
                out.append(" ".join(piece))
                piece = []
            piece.append(word)
        if piece:
            out.append(" ".join(piece))
    return out


@torch.no_grad()
def recall(model: Any, layout: PromptLayout, document: str, preamble_ids: list[int], *, key_words: int = 6,
           max_tokens: int = 64, top_k: int = 20, chunk_tokens: int = 256, teacher_max_tokens: int = 4096,
           rows: int = 8, on_progress: Callable[[int], None] | None = None) -> SelfStudyData:
    """One recall sample per line (piece) of ``document``, with the teacher's top-k log-probs.

    Sample = :data:`RECALL_INSTRUCTION` keyed by the piece's first ``key_words`` words as the question turn, the
    piece (+ end of turn) as the answer. Nothing is sampled: the teacher (the whole document after the preamble,
    or the piece's chunk when the document is longer than ``teacher_max_tokens``) is run teacher-forced over the
    sample, so this costs one forward pass per ``rows`` pieces and is deterministic.
    """
    pad = layout.tokenizer.pad_token_id if layout.tokenizer.pad_token_id is not None else 0
    count = lambda t: len(layout.answer_ids(t, end=False))  # noqa: E731
    pre_kv = _kv.encode(model, torch.tensor(preamble_ids, dtype=torch.long)) if preamble_ids else _kv.empty(model)
    doc_ids = layout.document_ids(document)
    if len(doc_ids) <= teacher_max_tokens:
        groups = [(document, segments(document, count, max_tokens))]
    else:
        groups = [(c, segments(c, count, max_tokens)) for c in chunk_text(document, count, chunk_tokens)]
    sample_ids: list[list[int]] = []
    teacher: list[tuple[torch.Tensor, torch.Tensor]] = []
    for context, pieces in groups:
        ctx = _cat(pre_kv, _kv.encode(model, torch.tensor(layout.document_ids(context)), pre_kv))
        for lo in range(0, len(pieces), rows):
            batch = [layout.question_ids(RECALL_INSTRUCTION.format(key=" ".join(p.split()[:key_words])))
                     + layout.answer_ids(p) for p in pieces[lo:lo + rows]]
            width = max(len(b) for b in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            for r, b in enumerate(batch):
                ids[r, :len(b)] = torch.tensor(b)  # right padding: causal attention never sees it
            hidden, _ = _kv.forward_hidden(model, ids, _kv.cache_from(*ctx, batch=len(batch)))
            logp = torch.log_softmax(_head(model, hidden[:, :-1]), -1).topk(top_k, -1)
            for r, b in enumerate(batch):
                sample_ids.append(b)
                teacher.append((logp.indices[r, :len(b) - 1], logp.values[r, :len(b) - 1]))
            if on_progress is not None:
                on_progress(len(batch))
    return _pad(sample_ids, teacher, pad, top_k)


def _cat(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]
         ) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([a[0], b[0]], 2), torch.cat([a[1], b[1]], 2)


def _pad(sample_ids: list[list[int]], teacher: list[tuple[torch.Tensor, torch.Tensor]], pad: int, k: int
         ) -> SelfStudyData:
    n, width = len(sample_ids), max(len(s) for s in sample_ids)
    ids = torch.full((n, width), pad, dtype=torch.long)
    topk_ids = torch.zeros((n, width - 1, k), dtype=torch.long)
    topk_logp = torch.full((n, width - 1, k), -torch.inf, dtype=torch.float32)
    for r, (s, (ti, tv)) in enumerate(zip(sample_ids, teacher)):
        ids[r, : len(s)] = torch.tensor(s)
        topk_ids[r, : ti.shape[0]] = ti
        topk_logp[r, : tv.shape[0]] = tv.float()
    lengths = torch.tensor([len(s) for s in sample_ids], dtype=torch.long)
    return SelfStudyData(ids, lengths, topk_ids, topk_logp)
