"""Linear layers whose bfloat16 weights are packed once for the CPU's matrix unit, not on every call.

Why. On a CPU with AMX, torch multiplies a bfloat16 ``nn.Linear`` through oneDNN, which first reorders the weight
into its blocked layout, on every call: for a one-token decode step that reorder costs about as much as the
multiply. Packing each weight once (the same oneDNN ops torch's inductor uses when it freezes a model) and calling
the packed multiply gives the same numbers, bit for bit, faster. Measured on the project's 2-core AMX VM, one
thread, SmolLM2-135M in bfloat16 with 800 cached positions (medians of 7): a one-token step 65.0 → 52.8 ms, a
33-token prefill 101.7 → 84.5 ms, an 834-token prompt 510 → 491 ms, logits identical
(``research/packed_linear_forward.py``, research/notes/packed_linear.md).
intel-extension-for-pytorch's ``ipex.optimize`` does the same, as a large dependency pinned to torch versions.

What. :func:`prepack_linear_layers` turns each ``nn.Linear`` of a model into a :class:`PrepackedLinear`: the same
module (parameters, tied weights, hooks), whose forward takes the packed path only when nothing needs gradients and
the input and weight are bfloat16 on the CPU; anything else (training, another device or dtype) is ``nn.Linear``'s
own forward. The packed copy is made at first use and again whenever the weight is replaced or changed in place,
and holds one more copy of the weights in memory (270 MB for SmolLM2-135M).

Example:
    >>> import torch
    >>> layer = torch.nn.Linear(64, 32, dtype=torch.bfloat16)
    >>> model = torch.nn.Sequential(layer)
    >>> packed = prepack_linear_layers(model)
    >>> packed in (0, 1)  # 1 where this CPU multiplies bfloat16 natively, else 0 (nothing changed)
    True
    >>> x = torch.randn(3, 64, dtype=torch.bfloat16)
    >>> with torch.inference_mode():
    ...     torch.equal(model(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
    True
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn

from agentmem.kv.device import cpu_has_bf16_matmul

__all__ = ["PrepackedLinear", "packed_linear_available", "prepack_linear_layers"]

log = logging.getLogger(__name__)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@functools.cache
def packed_linear_available() -> bool:
    """Whether this CPU multiplies bfloat16 natively and this torch has oneDNN's packed linear ops.

    Answered once per process, by packing a small layer and checking it against ``nn.Linear``.

    Example:
        >>> isinstance(packed_linear_available(), bool)
        True
    """
    if not (cpu_has_bf16_matmul() and torch.backends.mkldnn.is_available()):
        return False
    try:
        with torch.inference_mode():
            weight = torch.randn(16, 32, dtype=torch.bfloat16)
            x = torch.randn(2, 32, dtype=torch.bfloat16)
            return torch.equal(_packed_linear(x, _pack(weight), None), nn.functional.linear(x, weight))
    except (AttributeError, RuntimeError, NotImplementedError) as exc:  # private ops: absent in some builds
        log.debug("packed bfloat16 linear unavailable: %s", exc)
        return False


class PrepackedLinear(nn.Linear):
    """``nn.Linear`` that multiplies with a oneDNN-packed copy of its bfloat16 weight on the CPU at inference.

    Made by :func:`prepack_linear_layers` from an existing layer; see the module doc for when the packed path runs.
    """

    _packed: torch.Tensor | None = None  # made at first use: see forward
    _packed_key: tuple[int, int] | None = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - nn.Linear's own argument name
        weight = self.weight
        if (torch.is_grad_enabled() or input.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16
                or input.device.type != "cpu" or weight.device.type != "cpu"):
            return super().forward(input)
        key = (weight.data_ptr(), weight._version)  # a new tensor, or the same one written in place
        if self._packed is None or self._packed_key != key:
            self._packed, self._packed_key = _pack(weight), key
        return _packed_linear(input, self._packed, self.bias)

    def __getstate__(self) -> dict:
        # The packed copy is an opaque oneDNN tensor that neither copy.deepcopy nor torch.save can read: a copy or
        # a pickle of the model leaves it out, and the copy packs its own at first use.
        state = super().__getstate__()
        return {**state, "_packed": None, "_packed_key": None}


def prepack_linear_layers(model: nn.Module) -> int:
    """Make every ``nn.Linear`` of ``model`` a :class:`PrepackedLinear`, in place; return how many.

    Returns 0 and changes nothing where :func:`packed_linear_available` is False. Outputs stay bit-identical, so it
    is safe on any model; it pays only where the model runs in bfloat16 on the CPU.

    Example:
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> model, _ = tiny_causal_lm("llama")
        >>> prepack_linear_layers(model) in (0, sum(isinstance(m, torch.nn.Linear) for m in model.modules()))
        True
    """
    if not packed_linear_available():
        return 0
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            # Swapping the class keeps the module itself: its parameters (a tied lm_head stays tied), its hooks
            # and every reference the model holds to it. PrepackedLinear adds no parameters, only a cache.
            module.__class__ = PrepackedLinear
            count += 1
    return count
