"""research/packed_linear_forward.py: both models answer alike, every forward is timed, the last line is its JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/

import packed_linear_forward as plf  # noqa: E402

from agentmem.kv.packed_linear import packed_linear_available  # noqa: E402
from agentmem.kv.testing import tiny_causal_lm  # noqa: E402


def test_runs_on_a_small_model_and_reports_identical_logits(tmp_path: Path, capsys) -> None:
    tiny, tokenizer = tiny_causal_lm("llama")
    tiny.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    result = plf.main(["--model", str(tmp_path), "--cached", "16", "--new", "1", "4", "--repeats", "2"])
    assert [(r["cached"], r["new_tokens"]) for r in result["rows"]] == [(16, 1), (16, 4), (0, 50)]
    assert all(r["identical_logits"] and r["plain_ms"] > 0 and r["packed_ms"] > 0 for r in result["rows"])
    assert (result["packed_layers"] > 0) == packed_linear_available()
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
