"""Self-study data: seeded, and its teacher log-probs are the model's own with the document in context."""

from __future__ import annotations

import pytest
import torch

from agentmem.kv.testing import tiny_causal_lm
from agentmem.train import PromptLayout, distill_loss, selfstudy

DOC = "[3 June 2023] Ann: We hiked Trolltunga on Saturday.\n[3 June 2023] Bob: I painted a sunset.\n"

@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny matmuls gain nothing from a second thread, and on a shared 2-core box an OpenMP team waiting for a
    # descheduled thread makes them ~40x slower.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)



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
