"""The public-API state machine with the server in front (tests/property/served_machine.py over api_machine.py: the
erase-visibility invariant, hostile ids with invisible and bidi characters) on a CI budget (under two minutes on 2
busy cores); ``benchmarks/fuzz.py --minutes 10`` runs the same machine for longer."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from agentmem.kv.testing import tiny_causal_lm
from served_machine import ServedApiMachine

ServedApiMachine.model_pair = tiny_causal_lm("llama", seed=0)  # a tiny model, so encoded blobs reach the disk

TestApiStateMachine = ServedApiMachine.TestCase
TestApiStateMachine.settings = settings(
    max_examples=int(os.environ.get("AGENTMEM_FUZZ_EXAMPLES", "3")),
    stateful_step_count=int(os.environ.get("AGENTMEM_FUZZ_STEPS", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)
