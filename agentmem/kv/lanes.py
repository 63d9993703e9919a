"""Decode lanes: more than one batch worker over the same model, so a CPU with idle cores runs two forwards at once.

One :class:`~agentmem.kv.batch.DecodeBatch` runs all its steps on one worker thread. With one intra-op thread per
forward (agentmem's default on a small CPU: :func:`agentmem.kv.device.default_threads`, which avoids OpenMP barrier
stalls when the server's own threads compete for the cores) a second core sits idle while that worker steps.
:class:`DecodeLanes` keeps ``lanes`` batches over the one model, each with its own worker, and sends every prompt
and every answer to one of them:

- **a prompt** goes to the lane with the least work (prompt tokens in flight plus answers decoding), so prompts that
  arrive together are prefilled on two cores at once, and a prompt arriving while one lane decodes a full batch is
  prefilled beside it rather than in its steps;
- **an answer** joins the lane where most answers decode already (the first lane on a tie), so decoding rows keep
  sharing one pass over the weights: two half-full decode steps side by side cost about what one full step costs
  (both read every weight, and Python's share of each step is serialised by the GIL).

Lane 0 shares the engine's lock, exactly as a lone batch does (other model work, an encode or a session turn's
mount, runs between two of its steps, in arrival order); every further lane has a lock of its own, which is what
lets its forwards run beside the others. A forward only reads the model, and each sequence has its own cache, so
forwards on two threads are independent; a sequence's tokens do not depend on the lane or on the sequences sharing
its steps (tests/unit/test_kv_lanes.py).

Example:
    >>> from agentmem.kv.batch import FairRLock
    >>> from agentmem.kv.cache import cache_from_stacked
    >>> from agentmem.kv.testing import tiny_causal_lm
    >>> model, _ = tiny_causal_lm("llama")
    >>> lanes = DecodeLanes(model, FairRLock(), lanes=2)
    >>> cache = cache_from_stacked(torch.zeros(2, 1, 2, 0, 16), torch.zeros(2, 1, 2, 0, 16), capacity=64)
    >>> first = int(lanes.prefill(cache, [5, 6, 7]).argmax())
    >>> ids = lanes.decode(cache, first, max_new_tokens=4)
    >>> len(ids), lanes.steps >= 3
    (4, True)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from agentmem.kv.batch import DecodeBatch, FairRLock
from agentmem.kv.device import usable_cpus

__all__ = ["DecodeLanes", "default_lanes"]

T = TypeVar("T")


def default_lanes(device: torch.device | str = "cpu", *, cpus: int | None = None) -> int:
    """Lanes when none are configured: two on a CPU with at least two usable cores, else one (a GPU already runs a
    forward's work in parallel; a second lane there only interleaves kernels).

    Example:
        >>> default_lanes("cpu", cpus=2), default_lanes("cpu", cpus=1), default_lanes("cuda", cpus=16)
        (2, 1, 1)
    """
    if torch.device(device).type != "cpu":
        return 1
    return 2 if (usable_cpus() if cpus is None else cpus) >= 2 else 1


class DecodeLanes:
    """``lanes`` :class:`~agentmem.kv.batch.DecodeBatch` workers over one model (see the module doc for how work is
    sent to them); the same ``prefill`` / ``decode`` calls as one batch, and its counters summed over the lanes."""

    def __init__(self, model, lock: FairRLock, *, lanes: int = 1, step_tokens: int = 256) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, got {lanes}")
        self.lock = lock  # lane 0's: the engine's own
        self.lanes = [DecodeBatch(model, lock if i == 0 else FairRLock(), step_tokens=step_tokens)
                      for i in range(lanes)]
        self._guard = threading.Lock()
        self._decoding = [0] * lanes  # answers decoding per lane
        self._prompt_tokens = [0] * lanes  # prompt tokens in flight per lane

    # -- the batch's calls, sent to a lane -------------------------------------------------------------------
    def prefill(self, cache, ids: Sequence[int]) -> torch.Tensor:
        """:meth:`DecodeBatch.prefill` on the lane with the least work now."""
        with self._guard:
            lane = min(range(len(self.lanes)), key=lambda i: self._prompt_tokens[i] + self._decoding[i])
            self._prompt_tokens[lane] += len(ids)
        return self._on(lane, lambda batch: batch.prefill(cache, ids), self._prompt_tokens, len(ids))

    def decode(self, cache, first_token: int, **kwargs) -> list[int]:
        """:meth:`DecodeBatch.decode` on the lane where most answers decode now."""
        with self._guard:
            lane = max(range(len(self.lanes)), key=lambda i: (self._decoding[i], -i))
            self._decoding[lane] += 1
        return self._on(lane, lambda batch: batch.decode(cache, first_token, **kwargs), self._decoding, 1)

    def _on(self, lane: int, call: Callable[[DecodeBatch], T], counter: list[int], amount: int) -> T:
        try:
            return call(self.lanes[lane])
        finally:
            with self._guard:
                counter[lane] -= amount

    # -- one batch's settings and counters, over every lane ------------------------------------------------------
    @property
    def model(self):
        return self.lanes[0].model

    @property
    def packs_prompts(self) -> bool:
        return self.lanes[0].packs_prompts

    @property
    def step_tokens(self) -> int:
        return self.lanes[0].step_tokens

    @step_tokens.setter
    def step_tokens(self, value: int) -> None:
        for batch in self.lanes:
            batch.step_tokens = value

    @property
    def active(self) -> bool:
        """Whether any lane has an answer decoding or a prompt in flight."""
        with self._guard:
            return any(self._decoding) or any(self._prompt_tokens)

    @property
    def pending(self) -> int:
        """Prompts submitted whose logits are not back yet, over every lane."""
        return sum(batch.pending for batch in self.lanes)

    @property
    def steps(self) -> int:
        """Model steps run, over every lane."""
        return sum(batch.steps for batch in self.lanes)

    @property
    def max_batch_seen(self) -> int:
        """The most answers one step decoded, on any lane."""
        return max(batch.max_batch_seen for batch in self.lanes)

    @property
    def max_prompts_seen(self) -> int:
        """The most prompts one step fed, on any lane (settable: a test resets it)."""
        return max(batch.max_prompts_seen for batch in self.lanes)

    @max_prompts_seen.setter
    def max_prompts_seen(self, value: int) -> None:
        for batch in self.lanes:
            batch.max_prompts_seen = value
