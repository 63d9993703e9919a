"""The public-API state machine (tests/property/api_machine.py) on a CI budget (well under two minutes here);
``benchmarks/fuzz.py --minutes 10`` runs the same machine for longer."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from agentmem.kv.testing import tiny_causal_lm
from api_machine import ApiMachine

ApiMachine.model_pair = tiny_causal_lm("llama", seed=0)  # a tiny model, so encoded blobs reach the disk

TestApiStateMachine = ApiMachine.TestCase
TestApiStateMachine.settings = settings(
    max_examples=int(os.environ.get("AGENTMEM_FUZZ_EXAMPLES", "4")),
    stateful_step_count=int(os.environ.get("AGENTMEM_FUZZ_STEPS", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)
