"""Train a short KV prefix that stands for a long document (a "cartridge"), with the model frozen.

Recipe (Cartridges, Eyuboglu et al. 2025, context distillation, with the training data changed):

1. Initialise the prefix from the real KV of the document's first ``p`` tokens, encoded after the shared
   preamble at the offset mounted entries use.
2. Training samples, each with the *teacher's* top-k next-token log-probs (the model with the whole document in
   context; :mod:`agentmem.train.selfstudy`):

   * **recall** (default): one per document line, "Quote the line of the text above that begins "<first words>"."
     answered with the line itself, teacher-forced. Cheap (no sampling) and it carries the document's specific
     content. On SmolLM2-135M it is what makes trained entries beat their initialisation on held-out questions.
   * **self-study** (Cartridges; ``options.samples > 0``): the model writes its own questions about chunks and
     answers them with the document in context. With a 135M model these are mostly ungrounded, and training on
     them alone made gold-answer NLL *worse* than the untrained prefix (see docs/trained-entries.md).
3. Train only the prefix tensors so the *student* (the model with the prefix in place of the document) matches
   the teacher over the question and answer tokens: KL divergence on the top-k tokens plus one "everything else"
   bucket, which is the exact KL of the coarsened distribution.

Positions match mounting: preamble ``[0, offset)``, prefix ``[offset, offset + p)``, then the question turn.
Batch order is a pure function of ``(seed, step)`` and the synthetic data is stored in the checkpoint, so a
resumed run continues exactly where an uninterrupted one would be.

Example:
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> model, tok = tiny_causal_lm("llama")
    >>> tp = train_prefix(model, tok, "Ann: I moved to Oslo in May 2021. " * 8, tokens=16, steps=2,
    ...                   options=TrainOptions(batch_size=2), progress=False)
    >>> tp.tokens, tp.record["steps"]
    (16, 2)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import torch

from agentmem.errors import InvalidInputError
from agentmem.train import _kv, selfstudy
from agentmem.train.checkpoint import load_state, save_state
from agentmem.train.layout import PromptLayout
from agentmem.train.prefix import TrainedPrefix, document_digest

__all__ = ["TrainOptions", "distill_loss", "make_data", "make_recall_data", "train_prefix"]

log = logging.getLogger(__name__)

RECORD_FORMAT = "agentmem.trained-record/1"


@dataclass(frozen=True)
class TrainOptions:
    """Self-study and optimiser settings beyond the headline ``tokens/steps/seed/lr``.

    Defaults follow Cartridges where it applies (top-20 teacher log-probs, Adam, constant lr). The data default is
    recall samples only (``recall_repeat=1``, ``samples=0``): on the development conversation it beat self-study
    and a 6:1 recall/self-study mix on gold-answer NLL, and it costs seconds instead of minutes to make.
    ``samples`` self-generated Q/A conversations can be added (``question_tokens``/``answer_tokens``/
    ``temperature`` apply to them); ``recall_repeat`` weighs recall samples against them. ``time_budget_s`` stops
    training (not data generation) once the run's wall time exceeds it.
    """

    samples: int = 0
    batch_size: int = 8
    chunk_tokens: int = 256
    question_tokens: int = 24
    answer_tokens: int = 40
    temperature: float = 0.7
    top_k: int = 20
    teacher_max_tokens: int = 4096
    recall_repeat: int = 1  # recall samples (one per document line, see selfstudy.recall), each this many times
    recall_key_words: int = 6
    recall_tokens: int = 64
    checkpoint_every: int = 10
    time_budget_s: float | None = None
    freeze_first: bool | None = None  # None: freeze slot 0 only when there is no preamble to act as the sink


def distill_loss(student_logits: torch.Tensor, topk_ids: torch.Tensor, topk_logp: torch.Tensor) -> torch.Tensor:
    """Mean KL(teacher ‖ student) over rows, on the teacher's top-k tokens plus a "rest of vocabulary" bucket.

    ``student_logits``: ``(M, V)``; ``topk_ids``/``topk_logp``: ``(M, k)`` teacher token ids and log-probs.
    Merging the tail into one bucket keeps the KL exact for the coarsened distribution, so the loss is 0 only
    when the student matches the teacher on the top-k and on the leftover mass.

    Example:
        >>> logits = torch.tensor([[2.0, 1.0, 0.0]])
        >>> lp = torch.log_softmax(logits, -1)
        >>> float(distill_loss(logits, torch.tensor([[0, 1]]), lp[:, :2])) < 1e-6
        True
    """
    student = torch.log_softmax(student_logits.float(), -1)
    s_k = student.gather(-1, topk_ids)
    p_k = topk_logp.exp()
    kl = (p_k * (topk_logp - s_k)).sum(-1)
    p_rest = (1.0 - p_k.sum(-1)).clamp_min(1e-8)
    s_rest = (1.0 - s_k.exp().sum(-1)).clamp_min(1e-8)
    kl = kl + p_rest * (p_rest.log() - s_rest.log())
    return kl.mean()


def _batch_indices(n: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
    # Pure function of (seed, step): resuming needs no sampler state, and the order is the same on any machine.
    per_epoch = max(1, n // batch_size)
    epoch, i = divmod(step, per_epoch)
    g = torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (2**63))
    perm = torch.randperm(n, generator=g)
    return perm[i * batch_size:(i + 1) * batch_size]


def _student_loss(model: Any, head_kv: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor, v: torch.Tensor,
                  data: selfstudy.SelfStudyData, idx: torch.Tensor) -> torch.Tensor:
    lens = data.lengths[idx]
    width = int(lens.max())
    ids = data.ids[idx, :width]
    # Position j predicts token j + 1; padding sits after each sample, and causal attention keeps it invisible.
    valid = torch.arange(width - 1).unsqueeze(0) < (lens - 1).unsqueeze(1)
    keys = torch.cat([head_kv[0], k], 2)
    values = torch.cat([head_kv[1], v], 2)
    hidden, _ = _kv.forward_hidden(model, ids, _kv.cache_from(keys, values, batch=len(idx)))
    logits = model.get_output_embeddings()(hidden[:, :-1][valid])
    return distill_loss(logits, data.topk_ids[idx, :width - 1][valid], data.topk_logp[idx, :width - 1][valid])


def _run_identity(**parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


@contextmanager
def _frozen_weights(model: Any) -> Iterator[None]:
    was_training = model.training
    flags = [p.requires_grad for p in model.parameters()]
    model.eval()
    model.requires_grad_(False)  # only the prefix learns; weights stay bit-identical
    try:
        yield
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
        model.train(was_training)


@dataclass
class _PrefixRun:
    """The state one run mutates, shared by the optimisation loop, the checkpoints and the final record."""

    k_init: torch.Tensor
    v_init: torch.Tensor
    head_kv: tuple[torch.Tensor, torch.Tensor]  # preamble KV plus the frozen prefix slot, if any
    k: torch.Tensor
    v: torch.Tensor
    n_frozen: int
    opt: torch.optim.Optimizer
    data: selfstudy.SelfStudyData
    step: int
    losses: list[float]
    prior_wall: float  # wall seconds spent before this process resumed the run
    started: float
    identity: str
    checkpoint_path: str | os.PathLike[str] | None

    def wall_seconds(self) -> float:
        return self.prior_wall + time.monotonic() - self.started

    def snapshot(self) -> None:
        if self.checkpoint_path:
            wall = self.wall_seconds()
            save_state(self.checkpoint_path,
                       _checkpoint_tensors(self.head_kv, self.k, self.v, self.n_frozen, self.data, self.opt),
                       {"identity": self.identity, "step": self.step, "losses": self.losses, "wall_seconds": wall})

    def optimiser_step(self, model: Any, seed: int, batch_size: int) -> None:
        idx = _batch_indices(len(self.data), batch_size, seed, self.step)
        loss = _student_loss(model, self.head_kv, self.k, self.v, self.data, idx)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.step += 1
        self.losses.append(round(loss.item(), 6))

    def trained_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.cat([self.k_init[:, :, :self.n_frozen], self.k.detach()], 2),
                torch.cat([self.v_init[:, :, :self.n_frozen], self.v.detach()], 2))


def train_prefix(
    model: Any,
    tokenizer: Any,
    document: str,
    *,
    tokens: int = 128,
    steps: int = 300,
    seed: int = 0,
    lr: float = 5e-3,
    preamble_ids: list[int] | None = None,
    layout: PromptLayout | None = None,
    options: TrainOptions | None = None,
    progress: bool = True,
    checkpoint_path: str | os.PathLike[str] | None = None,
    resume: bool = True,
    callback: Callable[[int, float], bool | None] | None = None,
    fingerprint: str | None = None,
    data: selfstudy.SelfStudyData | None = None,
) -> TrainedPrefix:
    """Train a ``tokens``-long KV prefix standing for ``document``; the model's weights are never changed.

    ``lr`` defaults to 5e-3, not Cartridges' 2e-2 (set for 3B-8B models): on SmolLM2-135M, 2e-2 overshot on the one
    development conversation (the model's predictions on held-out questions moved *away* from the document-in-
    context teacher), 5e-3 moved them towards it. Training changes only the prefix tensors; the model's weights
    are bit-identical afterwards.

    ``preamble_ids`` is the shared preamble the engine mounts before every entry (default: the chat template's
    system turn, from ``layout``); the prefix is trained at ``offset = len(preamble_ids)``. ``fingerprint`` is
    the model fingerprint digest to bind the entry to (default: computed from the weights). With
    ``checkpoint_path``, the state (prefix, Adam moments, step, losses, synthetic data) is saved atomically every
    ``options.checkpoint_every`` steps, on Ctrl-C and at the end; ``resume=True`` continues from it when it
    belongs to the same run (document, model, p, seed, lr, options). ``callback(step, loss)`` is called after
    each step; returning ``False`` stops training early (the partial prefix is returned and checkpointed).
    ``data`` reuses self-study data made by :func:`make_data` for this document, model and layout (it does not
    depend on ``tokens``, so prefixes of several sizes can share it); by default it is generated here.

    Example:
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> model, tok = tiny_causal_lm("llama")
        >>> before = [p.clone() for p in model.parameters()]
        >>> tp = train_prefix(model, tok, "Hold the power button for ten seconds to reset it. " * 4, tokens=8, steps=2,
        ...                   seed=0, options=TrainOptions(batch_size=2), progress=False)
        >>> unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        >>> tp.keys.shape[2], len(tp.record["losses"]), unchanged
        (8, 2, True)
    """
    opts = options or TrainOptions()
    _check_request(model, document, tokens, steps)
    layout = layout or PromptLayout.for_tokenizer(tokenizer)
    preamble = list(layout.preamble_ids() if preamble_ids is None else preamble_ids)
    doc_ids = _document_ids(layout, document, tokens)
    started = time.monotonic()
    fingerprint = fingerprint or _kv.model_fingerprint(model, tokenizer)
    freeze_first = (not preamble) if opts.freeze_first is None else opts.freeze_first
    identity = _run_identity(doc=document_digest(document), model=fingerprint, tokens=tokens, seed=seed, lr=lr,
                             data=None if data is None else data.digest(),
                             preamble=preamble, layout=layout.identity(),
                             options={k: v for k, v in asdict(opts).items()
                                      if k not in ("checkpoint_every", "time_budget_s")})
    with _frozen_weights(model):
        run = _start_run(model, layout, document, doc_ids[:tokens], preamble, seed=seed, lr=lr, opts=opts,
                         progress=progress, freeze_first=freeze_first, identity=identity, started=started,
                         checkpoint_path=checkpoint_path, resume=resume, data=data)
        stopped = _optimise(run, model, steps=steps, seed=seed, opts=opts, progress=progress, callback=callback)
        run.snapshot()
        keys, values = run.trained_kv()
        record = _training_record(run, document=document, fingerprint=fingerprint, preamble=preamble,
                                  tokens=tokens, document_tokens=len(doc_ids), seed=seed, lr=lr, steps=steps,
                                  stopped=stopped, freeze_first=freeze_first, opts=opts)
        return TrainedPrefix(keys, values, doc_ids[:tokens], len(preamble), record)


def _check_request(model: Any, document: str, tokens: int, steps: int) -> None:
    if tokens <= 0 or steps < 0:
        raise InvalidInputError("tokens must be > 0 and steps >= 0")
    if not document or not document.strip():
        raise InvalidInputError("cannot train an entry on an empty document")
    _kv.check_rope_model(model)


def _document_ids(layout: PromptLayout, document: str, tokens: int) -> list[int]:
    doc_ids = layout.document_ids(document)
    if len(doc_ids) <= tokens:
        raise InvalidInputError(
            f"document is {len(doc_ids)} tokens, not longer than the {tokens}-token prefix; store it as text/KV")
    return doc_ids


def _start_run(model: Any, layout: PromptLayout, document: str, prefix_ids: list[int], preamble: list[int], *,
               seed: int, lr: float, opts: TrainOptions, progress: bool, freeze_first: bool, identity: str,
               started: float, checkpoint_path: str | os.PathLike[str] | None, resume: bool,
               data: selfstudy.SelfStudyData | None) -> _PrefixRun:
    pre = torch.tensor(preamble, dtype=torch.long)
    pre_kv = _kv.encode(model, pre) if preamble else _kv.empty(model)
    state = _load_checkpoint(checkpoint_path, identity) if (checkpoint_path and resume) else None
    if state is not None:
        k_init, v_init, data, step, losses, prior_wall, adam = state
        log.info("resuming trained-entry run at step %d from %s", step, checkpoint_path)
    else:
        k_init, v_init = _kv.encode(model, torch.tensor(prefix_ids), pre_kv)
        if data is None:
            data = make_data(model, layout, document, preamble_ids=preamble, seed=seed, options=opts,
                             progress=progress)
        step, losses, prior_wall, adam = 0, [], 0.0, None
    n_frozen = 1 if freeze_first else 0
    head_kv = (torch.cat([pre_kv[0], k_init[:, :, :n_frozen]], 2),
               torch.cat([pre_kv[1], v_init[:, :, :n_frozen]], 2))
    k = k_init[:, :, n_frozen:].clone().requires_grad_(True)
    v = v_init[:, :, n_frozen:].clone().requires_grad_(True)
    opt = torch.optim.Adam([k, v], lr=lr)
    if adam is not None:
        _restore_adam(opt, adam)
    run = _PrefixRun(k_init=k_init, v_init=v_init, head_kv=head_kv, k=k, v=v, n_frozen=n_frozen, opt=opt, data=data,
                     step=step, losses=losses, prior_wall=prior_wall, started=started, identity=identity,
                     checkpoint_path=checkpoint_path)
    if state is None:
        run.snapshot()  # the synthetic data is the expensive part of an early interruption
    return run


def _optimise(run: _PrefixRun, model: Any, *, steps: int, seed: int, opts: TrainOptions, progress: bool,
              callback: Callable[[int, float], bool | None] | None) -> str | None:
    """Train until ``steps``; returns why it stopped early (``"time_budget"``, ``"callback"``) or None."""
    bar = _progress(total=steps, initial=min(run.step, steps), enabled=progress, desc="training prefix")
    try:
        while run.step < steps:
            if opts.time_budget_s is not None and run.wall_seconds() > opts.time_budget_s:
                return "time_budget"
            run.optimiser_step(model, seed, opts.batch_size)
            bar.update(1)
            bar.set_postfix(loss=f"{run.losses[-1]:.4f}")
            if run.checkpoint_path and run.step % max(1, opts.checkpoint_every) == 0:
                run.snapshot()
            if callback is not None and callback(run.step, run.losses[-1]) is False:
                return "callback"
        return None
    except KeyboardInterrupt:
        run.snapshot()
        raise
    finally:
        bar.close()


def _training_record(run: _PrefixRun, *, document: str, fingerprint: str, preamble: list[int], tokens: int,
                     document_tokens: int, seed: int, lr: float, steps: int, stopped: str | None,
                     freeze_first: bool, opts: TrainOptions) -> dict[str, Any]:
    return {
        "format": RECORD_FORMAT,
        "document_sha256": document_digest(document),
        "model_fingerprint": fingerprint,
        "preamble_digest": hashlib.sha256(",".join(map(str, preamble)).encode()).hexdigest(),
        "tokens": tokens,
        "document_tokens": document_tokens,
        "offset": len(preamble),
        "seed": seed,
        "lr": lr,
        "steps": run.step,
        "steps_requested": steps,
        "stopped_early": stopped,
        "losses": run.losses,
        "init": "first_tokens",
        "frozen_first_token": bool(freeze_first),
        "samples": len(run.data),
        "options": asdict(opts),
        "wall_seconds": round(run.wall_seconds(), 3),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
    }


def make_data(model: Any, layout: PromptLayout, document: str, *, preamble_ids: list[int] | None = None,
              seed: int = 0, options: TrainOptions | None = None, progress: bool = True) -> selfstudy.SelfStudyData:
    """Self-study conversations about ``document`` with teacher top-k log-probs (see :mod:`.selfstudy`).

    Example:
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> model, tok = tiny_causal_lm("llama")
        >>> manual, options = "Hold the power button for ten seconds to reset it. " * 4, TrainOptions(batch_size=2)
        >>> data = make_data(model, PromptLayout.for_tokenizer(tok), manual, seed=0, options=options, progress=False)
        >>> [train_prefix(model, tok, manual, tokens=p, steps=1, data=data, options=options, progress=False).tokens
        ...  for p in (4, 8)]                    # prefixes of two sizes from the same data
        [4, 8]
    """
    opts = options or TrainOptions()
    preamble = list(layout.preamble_ids() if preamble_ids is None else preamble_ids)
    if opts.samples <= 0 and opts.recall_repeat <= 0:
        raise InvalidInputError("no training data: set options.samples or options.recall_repeat above 0")
    parts = []
    if opts.samples > 0:
        bar = _progress(total=opts.samples, initial=0, enabled=progress, desc="self-study data")
        try:
            parts.append(selfstudy.generate(
                model, layout, document, preamble, samples=opts.samples, seed=seed, chunk_tokens=opts.chunk_tokens,
                question_tokens=opts.question_tokens, answer_tokens=opts.answer_tokens,
                temperature=opts.temperature, top_k=opts.top_k, teacher_max_tokens=opts.teacher_max_tokens,
                on_progress=bar.update))
        finally:
            bar.close()
    if opts.recall_repeat > 0:
        parts.append(make_recall_data(model, layout, document, preamble_ids=preamble, options=opts)
                     .repeat(opts.recall_repeat))
    pad = layout.tokenizer.pad_token_id if layout.tokenizer.pad_token_id is not None else 0
    return parts[0] if len(parts) == 1 else selfstudy.SelfStudyData.concat(parts, pad)


def make_recall_data(model: Any, layout: PromptLayout, document: str, *, preamble_ids: list[int] | None = None,
                     options: TrainOptions | None = None) -> selfstudy.SelfStudyData:
    """Recall samples for ``document`` (one per line, not repeated; see :func:`selfstudy.recall`)."""
    opts = options or TrainOptions()
    preamble = list(layout.preamble_ids() if preamble_ids is None else preamble_ids)
    return selfstudy.recall(model, layout, document, preamble, key_words=opts.recall_key_words,
                            max_tokens=opts.recall_tokens, top_k=opts.top_k, chunk_tokens=opts.chunk_tokens,
                            teacher_max_tokens=opts.teacher_max_tokens)


def _progress(*, total: int, initial: int, enabled: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, desc=desc, dynamic_ncols=True)


def _checkpoint_tensors(head_kv: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor, v: torch.Tensor, n_frozen: int,
                        data: selfstudy.SelfStudyData, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    pre_len = head_kv[0].shape[2] - n_frozen
    t = {"k_init_frozen": head_kv[0][:, :, pre_len:], "v_init_frozen": head_kv[1][:, :, pre_len:],
         "k": k.detach(), "v": v.detach(), **data.tensors()}
    for i, name in enumerate(("k", "v")):
        st = opt.state.get(opt.param_groups[0]["params"][i], {})
        for key in ("exp_avg", "exp_avg_sq", "step"):
            if key in st:
                t[f"adam.{name}.{key}"] = st[key].detach().reshape(st[key].shape)
    return t


def _restore_adam(opt: torch.optim.Optimizer, adam: dict[str, torch.Tensor]) -> None:
    params = opt.param_groups[0]["params"]
    for i, name in enumerate(("k", "v")):
        if f"adam.{name}.exp_avg" in adam:
            opt.state[params[i]] = {key: adam[f"adam.{name}.{key}"].clone()
                                    for key in ("step", "exp_avg", "exp_avg_sq")}


def _load_checkpoint(path: str | os.PathLike[str], identity: str):
    if not os.path.exists(path):
        return None
    tensors, meta = load_state(path)
    if meta.get("identity") != identity:
        log.warning("checkpoint %s belongs to a different run (document/model/settings); starting fresh", path)
        return None
    k_init = torch.cat([tensors["k_init_frozen"], tensors["k"]], 2)
    v_init = torch.cat([tensors["v_init_frozen"], tensors["v"]], 2)
    data = selfstudy.SelfStudyData.from_tensors(tensors)
    adam = {key: val for key, val in tensors.items() if key.startswith("adam.")}
    return k_init, v_init, data, int(meta["step"]), list(meta["losses"]), float(meta["wall_seconds"]), adam
