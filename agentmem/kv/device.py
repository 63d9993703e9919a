"""Where the local LLM runs and with how many CPU threads: device and dtype resolution, the thread policy.

``MemoryConfig(device=..., torch_dtype=..., threads=...)`` is resolved here, once, when the model loads.

Thread policy. torch's default intra-op thread count is every core; under contention that collapses, because each
op ends at an OpenMP barrier that waits for the slowest thread, and a descheduled thread costs a scheduler tick
per op. Measured through the public API at ~2,000 memory tokens on a 2-core VM with one busy neighbour process:
kv TTFT 0.88 s with 2 threads vs 0.30 s with 1 (text mode 16.3 s vs 9.7 s). The default therefore leaves half of
the CPUs this process may use (affinity and cgroup quota) to the neighbours, split across the workers of one host:
``max(1, cpus // (2 * workers))``. On a dedicated machine more threads help text-mode prefill; set ``threads=``.

Dtype policy. ``"auto"`` picks bfloat16 wherever the hardware multiplies it natively: a GPU that supports it, and a
CPU with Intel AMX (its bf16 tile unit). On the 2-core AMX VM this project runs on, SmolLM2-135M's linear layers
take 29 ms in bf16 vs 75 ms in fp32 for a 16-row decode step and 90 vs 477 ms for a 256-token prefill chunk
(one thread); through the server, chat throughput at 16 clients went from 5.59 / 5.99 to 7.49 / 7.59 req/s
(two pairs, ``docs/server_load_round3.json`` ``s8_*``). A CPU without AMX keeps float32, as before (bf16 was
not measured on one). Answers move little: text mode in bf16 is within KL 0.0013 of fp32
(``docs/dtype_round3.jsonl``).

Example:
    >>> from agentmem.kv.device import resolve_device, resolve_dtype, default_threads
    >>> resolve_device("cpu"), resolve_dtype("float32", torch.device("cpu"))
    (device(type='cpu'), torch.float32)
    >>> resolve_dtype("auto", torch.device("cpu")) == (torch.bfloat16 if cpu_has_bf16_matmul() else torch.float32)
    True
    >>> default_threads(cpus=2, workers=1)
    1
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from agentmem.errors import InvalidInputError

__all__ = [
    "apply_threads",
    "cpu_has_bf16_matmul",
    "default_threads",
    "resolve_device",
    "resolve_dtype",
    "usable_cpus",
    "worker_count",
]

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(spec: str | torch.device | None) -> torch.device:
    """``"auto"`` → CUDA if available, else MPS, else CPU; an explicit device must exist (typed error if not).

    Example:
        >>> resolve_device("auto").type in {"cpu", "cuda", "mps"}
        True
    """
    if isinstance(spec, torch.device):
        spec = str(spec)
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise InvalidInputError(f"device: {spec!r} is not a device (use auto, cpu, cuda, cuda:N or mps)") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidInputError(f"device: {spec!r} asked for, but this torch build sees no CUDA GPU")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InvalidInputError(f"device: {spec!r} does not exist ({torch.cuda.device_count()} GPUs visible)")
    elif device.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise InvalidInputError("device: 'mps' asked for, but Apple MPS is not available here")
    elif device.type != "cpu":
        raise InvalidInputError(f"device: {spec!r} is not supported (use auto, cpu, cuda, cuda:N or mps)")
    return device


def cpu_has_bf16_matmul() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (Intel AMX tiles with AVX512-BF16), as torch sees it.

    Example:
        >>> isinstance(cpu_has_bf16_matmul(), bool)
        True
    """
    try:
        return bool(torch.cpu._is_amx_tile_supported() and torch.cpu._is_avx512_bf16_supported())
    except AttributeError:  # a torch without these probes (they are private): keep the float32 default
        return False


def resolve_dtype(spec: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``"auto"`` → bfloat16 where the hardware multiplies it (a CUDA GPU that supports it, a CPU with AMX: see the
    module doc), float16 on other GPUs, float32 on other CPUs.

    Example:
        >>> resolve_dtype("bfloat16", torch.device("cpu"))
        torch.bfloat16
    """
    if isinstance(spec, torch.dtype):
        return spec
    spec = spec or "auto"
    if spec == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "mps":
            return torch.float16
        return torch.bfloat16 if cpu_has_bf16_matmul() else torch.float32
    if spec not in _DTYPES:
        raise InvalidInputError(f"torch_dtype: {spec!r} is not one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[spec]


def _cgroup_cpus() -> float | None:
    """CPUs granted by a cgroup v2 quota (``cpu.max``: "quota period"), None when unlimited or unknown."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a container's cgroup quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpus()
    if quota is not None:
        cpus = min(cpus, max(1, int(quota)))
    return max(1, cpus)


def worker_count(workers: int | None = None) -> int:
    """Processes sharing this host's CPUs: ``workers``, else ``$AGENTMEM_WORKERS`` / ``$WEB_CONCURRENCY``, else 1."""
    if workers:
        return int(workers)
    for name in ("AGENTMEM_WORKERS", "WEB_CONCURRENCY"):  # WEB_CONCURRENCY: gunicorn's / uvicorn's convention
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def default_threads(*, cpus: int | None = None, workers: int | None = None) -> int:
    """The default intra-op thread count: half the usable CPUs per worker, at least one (see the module doc).

    Example:
        >>> default_threads(cpus=16, workers=2)
        4
    """
    cpus = usable_cpus() if cpus is None else cpus
    return max(1, cpus // (2 * worker_count(workers)))


def apply_threads(threads: int | None = None, *, workers: int | None = None) -> int:
    """Set torch's intra-op threads to ``threads`` (or the default policy) and return the count in use.

    Process-wide, like ``torch.set_num_threads`` itself; a CUDA/MPS model still uses a few CPU threads for
    tokenisation and small ops, so the policy applies there too.
    """
    n = int(threads) if threads else default_threads(workers=workers)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
        log.debug("torch intra-op threads set to %d", n)
    return n
