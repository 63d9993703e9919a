"""The KV engine: memories as precomputed KV caches of a local causal LM, mounted in front of the prompt.

Public names only; see ``docs/kv-engine.md`` for the design and measured numbers.
"""

from agentmem.kv.cache import (
    BufferedCache,
    cache_from_layers,
    cache_from_stacked,
    cache_layers,
    cache_length,
    crop_cache,
    empty_cache,
    remove_cache_span,
    rerotate_cache,
    stacked_from_cache,
)
from agentmem.kv.codec import decode_entry, encode_entry, read_metadata
from agentmem.kv.engine import KVEngine, PreparedPrompt
from agentmem.kv.fingerprint import ModelFingerprint, model_fingerprint
from agentmem.kv.fix import FixConfig, apply_fix, recompute_positions
from agentmem.kv.model import load_model
from agentmem.kv.mount import Mount, MountPlan, Workspace, assemble, plan_mount
from agentmem.kv.packed_linear import prepack_linear_layers
from agentmem.kv.prompt import DEFAULT_SYSTEM_PROMPT, PromptLayout
from agentmem.kv.rope import kv_support, require_kv_support, rerotate_keys, rotary_inv_freq
from agentmem.kv.runner import Sampling, decode, next_token, prefill
from agentmem.kv.types import EncodedEntry, GenerationResult, MemoryItem, Mode, MountMemory

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "BufferedCache",
    "EncodedEntry",
    "FixConfig",
    "GenerationResult",
    "KVEngine",
    "MemoryItem",
    "Mode",
    "ModelFingerprint",
    "Mount",
    "MountMemory",
    "MountPlan",
    "PreparedPrompt",
    "PromptLayout",
    "Sampling",
    "Workspace",
    "apply_fix",
    "assemble",
    "cache_from_layers",
    "cache_from_stacked",
    "cache_layers",
    "cache_length",
    "crop_cache",
    "decode",
    "decode_entry",
    "empty_cache",
    "encode_entry",
    "kv_support",
    "load_model",
    "model_fingerprint",
    "next_token",
    "plan_mount",
    "prefill",
    "prepack_linear_layers",
    "read_metadata",
    "recompute_positions",
    "remove_cache_span",
    "rerotate_cache",
    "require_kv_support",
    "rerotate_keys",
    "rotary_inv_freq",
    "stacked_from_cache",
]
