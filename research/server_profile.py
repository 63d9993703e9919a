"""Where the CPU of a chat request goes in the real server: ``agentmem serve``'s app (uvicorn, FastAPI, the chat
route, recall, mount, batched prefill and decode) runs in this process, 16 ``openai`` clients ask as the load
benchmark's chat phase does (one user's 40 memories, 8 tokens, ``remember: false``, default k), and a sampler reads
every thread's CPU time (``/proc/self/task/<tid>/stat``) every 5 ms and charges what each thread used since the last
sample to the innermost agentmem function on its stack (or the library it was in). Torch runs one thread
(``--torch-threads``), so a forward's CPU is charged to the thread that called it.

    python research/server_profile.py --requests 96 --clients 16

CPU seconds do not depend on the machine being quiet the way wall-clock seconds do (a loaded machine still
stretches them a little: memory bandwidth and caches are shared). Last line: {"cpu_ms_per_request": {...}, ...}
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import torch  # noqa: E402

from server_load import sentence  # noqa: E402  (the load benchmark's own memories and questions)

TICK = os.sysconf("SC_CLK_TCK")
# "decode|" + the innermost agentmem function on the decode worker, else that function (or library) -> the row of
# the table in docs/server.md (the first row that matches)
CATEGORIES = [
    ("decode step: sampling (next_token)", ("decode|kv/runner.py:next_token", "decode|kv/runner.py:nucleus")),
    ("decode step: attention row by row", ("decode|kv/batch.py:<listcomp>", "decode|kv/batch.py:_ragged_attention",
                                           "decode|kv/cache.py")),
    ("decode step: projections, MLP, head", ("decode|",)),
    ("prefill forward (batched)", ("kv/runner.py:prefill", "kv/batch.py:_packed_forward", "kv/batch.py:_ragged_attention")),
    ("HTTP, asyncio, FastAPI", ("uvicorn", "starlette", "fastapi", "anyio", "asyncio", "runners.py", "h11",
                                "httptools", "pydantic", "server/")),
    ("recall (embed, vectors, catalog)", ("recall/", "embed/", "backends/", "consolidate/", "entries/",
                                          "chromadb", "onnxruntime", "sqlalchemy")),
    ("blob load and mount", ("kv/codec.py", "kv/rope", "kv/quant.py", "kv/mount.py", "kv/cache.py", "_fs.py",
                             "kv/engine.py", "bank.py")),
]


def _thread_cpu(tid: int) -> float:
    try:
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def _where(frame) -> str:
    """The innermost agentmem function on the stack, else the library of the innermost frame."""
    leaf = frame.f_code.co_filename
    while frame is not None:
        name = frame.f_code.co_filename
        if "/agentmem/" in name:
            return f"{name.split('/agentmem/')[-1]}:{frame.f_code.co_name}"
        frame = frame.f_back
    return leaf.split("site-packages/")[-1].split("/")[0] if "site-packages" in leaf else os.path.basename(leaf)


class Sampler:
    """CPU seconds per place, over every thread of this process but the clients' (named ``client``)."""

    def __init__(self, every: float = 0.005) -> None:
        self.by_place: collections.Counter[str] = collections.Counter()
        self.clients = 0.0
        self._stop, self._on = threading.Event(), threading.Event()
        self._last: dict[int, float] = {}
        threading.Thread(target=self._run, args=(every,), daemon=True).start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            if not self._on.is_set():
                continue
            frames = sys._current_frames()
            for t in threading.enumerate():
                if t is threading.current_thread() or t.native_id is None or t.ident not in frames:
                    continue
                now = _thread_cpu(t.native_id)
                used, self._last[t.native_id] = now - self._last.get(t.native_id, now), now
                if used > 0 and t.name.startswith("client"):
                    self.clients += used
                elif used > 0:
                    role = "decode|" if t.name == "agentmem-decode" else ""
                    self.by_place[role + _where(frames[t.ident])] += used

    def start(self) -> None:
        self._on.set()

    def stop(self) -> None:
        self._on.clear()
        self._stop.set()


def categorise(by_place: dict[str, float]) -> dict[str, float]:
    out: collections.Counter[str] = collections.Counter()
    for place, cpu in by_place.items():
        row = next((name for name, keys in CATEGORIES if any(k in place for k in keys)), "other")
        out[row] += cpu
    return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--torch-threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.torch_threads)
    import httpx
    import openai
    import uvicorn

    from agentmem import AgentMemory
    from agentmem.server import ServerSettings, create_app
    from agentmem.server.auth import KeyStore

    store = Path(tempfile.mkdtemp()) / "store"
    key = KeyStore(store).add(["chat-u"])
    mem = AgentMemory(store)
    mem.warmup()  # memories written below get their KV on write, not at their first mount
    app = create_app(mem, keys=KeyStore(store),
                     settings=ServerSettings(fidelity_share=0, max_concurrent_per_user=args.clients))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.1)
    url = "http://127.0.0.1:%d" % server.servers[0].sockets[0].getsockname()[1]
    rng = random.Random(0)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300) as c:
        for _ in range(40):
            c.post("/v1/memories", json={"text": sentence(rng, 14), "user_id": "chat-u"}).raise_for_status()
    questions = [sentence(rng, 6) + "?" for _ in range(args.requests)]
    conns = []
    for _ in range(args.clients):
        conns.append(openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=600))
        conns[-1].models.list()
    timings: list[dict] = []

    def ask(i: int) -> None:
        r = conns[i % args.clients].chat.completions.create(
            model="agentmem", user="chat-u", max_tokens=8, messages=[{"role": "user", "content": questions[i]}],
            extra_body={"agentmem": {"remember": False}})
        timings.append(r.model_extra["agentmem"]["timings"])

    ask(0)  # warm up
    timings.clear()
    sampler = Sampler()
    cpu0, t0 = time.process_time(), time.perf_counter()
    sampler.start()
    with ThreadPoolExecutor(args.clients, thread_name_prefix="client") as pool:
        list(pool.map(ask, range(args.requests)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    sampler.stop()
    server.should_exit = True
    n = args.requests
    per_request = {k: round(1000 * v / n, 1) for k, v in sorted(categorise(sampler.by_place).items(),
                                                                 key=lambda kv: -kv[1])}
    print(json.dumps({
        "cpu_ms_per_request": per_request,
        "cpu_ms_per_request_sampled": round(1000 * sum(sampler.by_place.values()) / n, 1),
        "cpu_ms_per_request_clients": round(1000 * sampler.clients / n, 1),
        "cpu_ms_per_request_process": round(1000 * cpu / n, 1),
        "top_places_ms": {k: round(1000 * v / n, 1) for k, v in sampler.by_place.most_common(12)},
        "wall_ms_mean": {k: round(1000 * statistics.mean(t.get(k, 0.0) for t in timings), 1) for k in timings[0]},
        "req_per_s": round(n / wall, 2), "requests": n, "clients": args.clients,
        "torch_threads": args.torch_threads, "load_avg_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
