"""Self-study data: seeded, and its teacher log-probs are the model's own with the document in context."""

from __future__ import annotations

import pytest
import torch

from agentmem.kv.testing import tiny_causal_lm
from agentmem.train import PromptLayout, distill_loss, selfstudy

DOC = "[3 June 2023] Ann: We hiked Trolltunga on Saturday.\n[3 June 2023] Bob: I painted a sunset.\n"

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matmuls: see tests/conftest.py


def test_teacher_logprobs_match_a_direct_forward_and_are_seeded():
    model, tok = tiny_causal_lm("llama", seed=0)
    layout = PromptLayout.for_tokenizer(tok)
    doc = layout.preamble_ids() + layout.document_ids(DOC)
    kw = dict(samples=3, seed=5, chunk_tokens=24, question_tokens=5, answer_tokens=6)
    data = selfstudy.generate(model, layout, DOC, layout.preamble_ids(), **kw)
    assert len(data) == 3 and data.topk_ids.shape[-1] == 20
    for r in range(len(data)):
        n = int(data.lengths[r])
        ids = torch.tensor(doc + data.ids[r, :n].tolist())
        with torch.no_grad():
            logp = torch.log_softmax(model(ids[None]).logits[0].float(), -1)[len(doc):len(doc) + n - 1]
        got = logp.gather(-1, data.topk_ids[r, : n - 1])
        torch.testing.assert_close(got, data.topk_logp[r, : n - 1], atol=1e-4, rtol=0)
        # the recorded ids are the teacher's top-k, best first
        assert torch.equal(logp.argmax(-1), data.topk_ids[r, : n - 1, 0])
    again = selfstudy.generate(model, layout, DOC, layout.preamble_ids(), **kw)
    assert torch.equal(again.ids, data.ids) and torch.equal(again.topk_logp, data.topk_logp)


def test_distill_loss_is_zero_only_at_the_teacher():
    torch.manual_seed(0)
    teacher = torch.randn(5, 50)
    lp = torch.log_softmax(teacher, -1).topk(8, -1)
    assert float(distill_loss(teacher, lp.indices, lp.values)) < 1e-6
    assert float(distill_loss(torch.randn(5, 50), lp.indices, lp.values)) > 0.05


def test_chunks_are_whole_lines_covering_the_document():
    lines = [f"[{i} May] Ann: line number {i} says something." for i in range(40)]
    chunks = selfstudy.chunk_text("\n".join(lines), len, 400)
    assert "\n".join(chunks).split("\n") == lines
    assert len(chunks) == round(sum(len(x) + 1 for x in lines) / 400)
    sizes = [len(c) for c in chunks]
    assert max(sizes) < 1.5 * min(sizes)


def test_answer_scoring_matches_a_direct_forward():
    from agentmem.train.evaluate import answer_logprobs, answer_nll, context_kv, kl

    model, tok = tiny_causal_lm("llama", seed=0)
    layout = PromptLayout.for_tokenizer(tok)
    ctx_ids = layout.preamble_ids() + layout.document_ids(DOC)
    qa = [("When did Ann hike?", "Saturday"), ("What did Bob paint?", "A sunset over the fjord")]
    ctx = context_kv(model, layout.preamble_ids(), layout.document_ids(DOC))
    got = answer_nll(model, layout, ctx, qa, batch_size=2)
    for (q, a), (total, n) in zip(qa, got):
        qi, ai = layout.question_ids(q), layout.answer_ids(a, end=False)
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ctx_ids + qi + ai])).logits[0].float(), -1)
        start = len(ctx_ids) + len(qi)
        want = -logp[start - 1:start + len(ai) - 1].gather(-1, torch.tensor(ai)[:, None]).sum()
        assert n == len(ai) and abs(total - float(want)) < 1e-3
    lps = answer_logprobs(model, layout, ctx, qa)
    assert kl(lps[0][0], lps[0][0]) < 1e-6


def test_recall_samples_quote_each_line_under_the_whole_document_teacher():
    model, tok = tiny_causal_lm("llama", seed=0)
    layout = PromptLayout.for_tokenizer(tok)
    ctx = layout.preamble_ids() + layout.document_ids(DOC)
    data = selfstudy.recall(model, layout, DOC, layout.preamble_ids(), key_words=3, rows=1)
    lines = [ln for ln in DOC.split("\n") if ln.strip()]
    assert len(data) == len(lines)
    for r, line in enumerate(lines):
        n = int(data.lengths[r])
        key = " ".join(line.split()[:3])
        want = layout.question_ids(selfstudy.RECALL_INSTRUCTION.format(key=key)) + layout.answer_ids(line)
        assert data.ids[r, :n].tolist() == want
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ctx + want])).logits[0].float(), -1)[len(ctx):len(ctx) + n - 1]
        torch.testing.assert_close(logp.gather(-1, data.topk_ids[r, :n - 1]), data.topk_logp[r, :n - 1],
                                   atol=1e-4, rtol=0)
    batched = selfstudy.recall(model, layout, DOC, layout.preamble_ids(), key_words=3, rows=8)
    assert torch.equal(batched.ids, data.ids)
    torch.testing.assert_close(batched.topk_logp, data.topk_logp, atol=1e-4, rtol=0)


def test_segments_cut_long_lines_at_words_and_keep_every_word():
    doc = "short line\n\n" + " ".join(f"w{i}" for i in range(25))
    pieces = selfstudy.segments(doc, lambda t: len(t.split()), 10)
    assert pieces[0] == "short line" and all(len(p.split()) <= 10 for p in pieces)
    assert " ".join(pieces[1:]).split() == [f"w{i}" for i in range(25)]


def test_concat_and_repeat_keep_samples_and_teacher_rows():
    model, tok = tiny_causal_lm("llama", seed=0)
    layout = PromptLayout.for_tokenizer(tok)
    a = selfstudy.recall(model, layout, DOC, layout.preamble_ids())
    b = selfstudy.recall(model, layout, "Cy: ok", layout.preamble_ids())
    both = selfstudy.SelfStudyData.concat([a, b.repeat(2)])
    assert len(both) == len(a) + 2 * len(b)
    assert torch.equal(both.lengths[len(a):], b.lengths.repeat(2))
    n = int(b.lengths[0])
    assert torch.equal(both.ids[-1, :n], b.ids[0, :n])
    assert torch.equal(both.topk_logp[-1, :n - 1], b.topk_logp[0, :n - 1])


def test_make_data_mixes_self_study_and_repeated_recall_and_refuses_no_data():
    from agentmem.errors import InvalidInputError
    from agentmem.train import TrainOptions, make_data, make_recall_data

    model, tok = tiny_causal_lm("llama", seed=0)
    layout = PromptLayout.for_tokenizer(tok)
    opts = TrainOptions(samples=2, recall_repeat=2, question_tokens=4, answer_tokens=4, chunk_tokens=24)
    data = make_data(model, layout, DOC, seed=0, options=opts, progress=False)
    recall = make_recall_data(model, layout, DOC, options=opts)
    assert len(data) == 2 + 2 * len(recall)
    with pytest.raises(InvalidInputError):
        make_data(model, layout, DOC, options=TrainOptions(samples=0, recall_repeat=0), progress=False)
