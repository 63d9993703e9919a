"""Device, dtype and thread settings; blobs converted across dtypes; a quiet, warm first run; resumable training.

No GPU here: the CUDA paths are exercised on CPU (device="cpu", pinned staging falls back to plain copies); the
typed errors for a missing CUDA/MPS device are tested for real.
"""

from __future__ import annotations

import _thread
import logging
import signal
from pathlib import Path

import pydantic
import pytest
import torch

from agentmem import AgentMemory, InvalidInputError, MemoryConfig
from agentmem.kv.device import (
    apply_threads,
    cpu_has_bf16_matmul,
    default_threads,
    resolve_device,
    resolve_dtype,
    worker_count,
)
from agentmem.kv.model import load_model
from agentmem.kv.testing import tiny_causal_lm
from agentmem.kv.transfer import HostStaging


@pytest.fixture
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_device_and_dtype_settings_are_validated():
    with pytest.raises(pydantic.ValidationError, match="device"):
        MemoryConfig(device="gpu")
    with pytest.raises(pydantic.ValidationError, match="torch_dtype"):
        MemoryConfig(torch_dtype="float64")
    assert MemoryConfig(device="cuda:1").device == "cuda:1"
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("float32", torch.device("cpu")) == torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    if not torch.cuda.is_available():
        assert resolve_device("auto").type in {"cpu", "mps"}
        with pytest.raises(InvalidInputError, match="device: 'cuda:1'"):
            resolve_device("cuda:1")


def _cpuinfo_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads the CPU's flags from Linux's /proc/cpuinfo")
def test_auto_dtype_on_cpu_is_bfloat16_exactly_when_the_cpu_has_amx_bf16():
    # The kernel's own flags, not torch's probe: an AMX CPU gets bfloat16 (its native matmul), any other float32.
    flags = _cpuinfo_flags()
    native = {"amx_bf16", "amx_tile", "avx512_bf16"} <= flags
    assert cpu_has_bf16_matmul() is native
    assert resolve_dtype("auto", torch.device("cpu")) == (torch.bfloat16 if native else torch.float32)
    assert MemoryConfig().torch_dtype == "auto"


def test_thread_policy_leaves_cpus_to_neighbours_and_workers(monkeypatch, keep_threads):
    assert default_threads(cpus=2, workers=1) == 1  # the measured collapse: 2 threads on 2 shared cores
    assert default_threads(cpus=16, workers=1) == 8
    assert default_threads(cpus=16, workers=4) == 2
    assert default_threads(cpus=1, workers=3) == 1
    monkeypatch.setenv("WEB_CONCURRENCY", "3")
    assert worker_count() == 3 and worker_count(2) == 2
    assert apply_threads(1) == 1 and torch.get_num_threads() == 1


def test_the_store_loads_its_model_with_the_configured_dtype_and_threads(tmp_path: Path, keep_threads):
    config = MemoryConfig(device="cpu", torch_dtype="bfloat16", threads=1)
    with AgentMemory(tmp_path / "s", model=tiny_causal_lm("llama"), config=config) as mem:
        mem.load_model()
        engine = mem._bank.engine
        assert engine.dtype == torch.bfloat16 and engine.device.type == "cpu"
        assert torch.get_num_threads() == 1
        assert engine.fingerprint.dtype == "bfloat16"


def test_blobs_made_in_float32_mount_in_bfloat16_without_re_encoding(tmp_path: Path):
    store = tmp_path / "s"
    with AgentMemory(store, model=tiny_causal_lm("llama")) as mem:
        rec = mem.remember("Ann keeps bees on the roof.", user_id="u", encode=True)
        assert mem.generate("Who keeps bees?", user_id="u", entry_ids=[rec.id], max_new_tokens=2).fallbacks == []
    # the same weights, loaded in another precision: the blob is cast on load, not replaced
    with AgentMemory(store, model=tiny_causal_lm("llama"), config=MemoryConfig(torch_dtype="bfloat16")) as mem:
        out = mem.generate("Who keeps bees?", user_id="u", entry_ids=[rec.id], max_new_tokens=2)
        assert out.mounted == [rec.id] and out.fallbacks == []
        assert mem.stats()["kv"] == {"blob_loads": 1}
    # other weights are still refused (and re-encoded, with the reason)
    with AgentMemory(store, model=tiny_causal_lm("llama", seed=5)) as mem:
        out = mem.generate("Who keeps bees?", user_id="u", entry_ids=[rec.id], max_new_tokens=2)
        assert out.fallbacks and "weights_digest" in out.fallbacks[0][1]


def test_a_session_written_in_float32_continues_in_bfloat16_from_its_turns(tmp_path: Path):
    # The upgrade path on an AMX CPU, where "auto" became bfloat16: a session's cold KV from a float32 run is not
    # mounted in another dtype; it is rebuilt once from the stored turns, and the next turn reuses it again.
    store = tmp_path / "s"
    with AgentMemory(store, model=tiny_causal_lm("llama"), config=MemoryConfig(torch_dtype="float32")) as mem:
        mem.session("s1", user_id="u").send("My sister is called Ines.", k=0, max_new_tokens=3)
    config = MemoryConfig(torch_dtype="bfloat16")
    with AgentMemory(store, model=tiny_causal_lm("llama"), config=config) as mem:
        chat = mem.session("s1", user_id="u")
        first = chat.send("What is she called?", k=0, max_new_tokens=3)
        assert first.restored_from == "cold" and first.rebuilt == "model changed" and first.reused_tokens == 0
        second = chat.send("And where does she live?", k=0, max_new_tokens=3)
        assert second.rebuilt is None and second.reused_tokens > 0
        assert [t["content"] for t in chat.history() if t["role"] == "user"] == [
            "My sister is called Ines.", "What is she called?", "And where does she live?"]


def test_staging_uploads_are_plain_copies_off_cuda():
    a, b = torch.randn(2, 3, 4), torch.arange(6.0)
    up = HostStaging().upload([a, b], torch.device("cpu"))
    assert all(torch.equal(x, y) for x, y in zip(up, [a, b]))


def test_loading_is_one_info_line_and_no_progress_bar(tmp_path: Path, caplog, capsys):
    model, tok = tiny_causal_lm("qwen3")
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    capsys.readouterr()  # saving drew its own bars
    with caplog.at_level(logging.INFO):
        loaded, _ = load_model(tmp_path / "m", device="cpu", dtype="auto")
    assert type(loaded).__name__ == "Qwen3ForCausalLM"
    err = capsys.readouterr().err
    assert "Loading weights" not in err and "%|" not in err
    lines = [r for r in caplog.records if r.name.startswith("agentmem")]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO and " in " in lines[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_warmup_then_a_first_generate_logs_no_warning(tmp_path: Path, caplog):
    with AgentMemory(tmp_path / "s", model=tiny_causal_lm("llama")) as mem:
        # written before the model is loaded: lazily encoded at its first mount, the README's first-run path
        rec = mem.remember("Ann keeps bees on the roof.", user_id="u")
        assert rec.kv is None
        times = mem.warmup()
        assert set(times) == {"embedder", "model", "engine"}
        with caplog.at_level(logging.INFO):
            out = mem.generate("Who keeps bees?", user_id="u", max_new_tokens=2)
        assert out.mounted == [rec.id]
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert mem.stats()["kv"]["encoded_on_mount"] == 1


DOC = "Ann: I moved to Oslo in May 2021 and I teach chemistry at the old school by the harbour. " * 6
TINY = dict(samples=2, batch_size=2, question_tokens=4, answer_tokens=4, checkpoint_every=1)


def test_an_interrupted_training_resumes_from_its_default_checkpoint(tmp_path: Path, caplog, monkeypatch, request):
    from agentmem.train import cartridge

    saves = []

    def save_then_ctrl_c_once(*args, **kwargs) -> None:
        # A real Ctrl-C (SIGINT's KeyboardInterrupt in the main thread), sent right after the third checkpoint is on
        # disk (step 20): tied to training progress, not to a timer a loaded machine can outrun.
        cartridge_save(*args, **kwargs)
        saves.append(1)
        if len(saves) == 3:
            _thread.interrupt_main()

    cartridge_save = cartridge.save_state
    monkeypatch.setattr(cartridge, "save_state", save_then_ctrl_c_once)
    # Ctrl-C must raise KeyboardInterrupt even if an earlier test (an in-process uvicorn) left its own SIGINT handler
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    with AgentMemory(tmp_path / "s", model=tiny_causal_lm("llama")) as mem:
        ckpts = tmp_path / "s" / "train"
        with pytest.raises(KeyboardInterrupt):
            mem.train(DOC, user_id="u", tokens=8, steps=400, progress=False, **TINY)
        assert len(list(ckpts.glob("*.ckpt"))) == 1
        with caplog.at_level(logging.INFO, logger="agentmem"):
            entry = mem.train(DOC, user_id="u", tokens=8, steps=400, progress=False, **TINY)
        resumed = [r for r in caplog.records if "resuming trained-entry run at step" in r.getMessage()]
        assert resumed and int(resumed[0].getMessage().split("step ")[1].split()[0]) > 0
        assert entry.metadata["training"]["steps"] == 400
        assert list(ckpts.glob("*.ckpt")) == []  # removed once the entry is stored
