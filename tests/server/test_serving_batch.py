"""Many chat requests worked on at once: more streamed answers than the machine has cores (and than asyncio's
default executor has threads) all get their first token while every one of them is still decoding. Against the
real server (``agentmem serve``) with the real openai client."""

from __future__ import annotations

import threading
import time

import openai

from agentmem.kv.testing import tiny_tokenizer

from server_helpers import run_cli, start_server, stop_server

CLIENTS = 10  # over asyncio's default executor (min(32, CPUs + 4) threads: 6 on a 2-core machine)
# long enough that no answer ends while the others' first tokens arrive (they arrive within ~0.1 s). Every answer
# runs to this length: the model reads 4,096 positions and its end-of-sequence token is banned with logit_bias. (On
# the 512-position model the answers were cut by its context after ~400 tokens, ~2 s, and under CI load one ended
# before the last first token came.)
MAX_TOKENS = 1000


def test_more_streamed_answers_than_worker_threads_all_start_before_any_ends(tmp_path, wide_model_dir):
    path = tmp_path / "store"
    key = run_cli("keys", "add", "--path", str(path), "--user", "u").stdout.strip()
    proc, url = start_server(path, wide_model_dir, "--set", f"max_concurrent_per_user={CLIENTS}",
                             "--set", f"max_tokens_in_flight_per_user={CLIENTS * MAX_TOKENS}", "--fidelity-share", "0")
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=300)
        client.chat.completions.create(model="x", user="u", max_tokens=1, messages=[
            {"role": "user", "content": "warm up"}], extra_body={"agentmem": {"remember": False}})
        first: list[float] = []
        ends: list[float] = []
        tokens: list[int] = []
        errors: list[BaseException] = []

        no_end = {str(tiny_tokenizer().eos_token_id): -100}

        def ask(i: int) -> None:
            try:
                started = False
                for chunk in client.chat.completions.create(
                        model="x", user="u", max_tokens=MAX_TOKENS, stream=True,
                        messages=[{"role": "user", "content": f"Tell me a long story, number {i}."}],
                        logit_bias=no_end, stream_options={"include_usage": True},
                        extra_body={"agentmem": {"remember": False}}):
                    if chunk.choices and chunk.choices[0].delta.content and not started:
                        started = True
                        first.append(time.monotonic())
                    if chunk.usage is not None:
                        tokens.append(chunk.usage.completion_tokens)
                ends.append(time.monotonic())
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors
        assert len(first) == CLIENTS
        assert tokens == [MAX_TOKENS] * CLIENTS  # every answer decodes to the end: none frees its thread early
        assert max(first) < min(ends), "some requests got their first token only after another answer had ended"
    finally:
        stop_server(proc)
