"""The fused mount kernels load from numba's on-disk cache in a new process instead of compiling again.

Closures built inside a function defeated the cache: every process recompiled all three kernels (~6 s) on its
first mount of a quantized blob.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json
from agentmem.kv import rope_kernel
kernels = [rope_kernel._kernel(i) for i in range(3)]
print(json.dumps({"ok": all(k is not None for k in kernels),
                  "hits": sum(sum(k.stats.cache_hits.values()) for k in kernels)}))
"""


def _probe(env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_kernels_from_the_cache():
    _probe()  # compiles and writes the cache if nothing had yet
    second = _probe()
    assert second["ok"]
    assert second["hits"] >= 3  # each of the three kernels came from the cache, none was compiled


def test_without_a_cache_the_kernels_compile_in_memory():
    env = {**os.environ, "AGENTMEM_NUMBA_CACHE": "0"}
    result = _probe(env)
    assert result["ok"] and result["hits"] == 0
