"""One typed, strict configuration object; every default lives here.

Example:
    >>> from agentmem.config import MemoryConfig
    >>> MemoryConfig(secret_policy="reject").secret_policy
    'reject'
    >>> MemoryConfig(unknown=1)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    pydantic.ValidationError: ...
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

KvDtype = Literal["float32", "float16", "bfloat16"]
TorchDtype = Literal["auto", "float32", "float16", "bfloat16"]
# "auto" picks CUDA, then Apple MPS, then CPU; "cuda:N" names one GPU.
DEVICE_PATTERN = r"^(auto|cpu|mps|cuda(:[0-9]+)?)$"
# Stored KV codecs (agentmem/kv/quant.py): float dtypes, or integer codes per channel (keys) / per token (values).
KvCodec = Literal[
    "float32", "float16", "bfloat16", "int8", "int4", "k4v2", "int2", "int4h", "k4v3h", "k3v3h", "k4v2h", "k4v3hs",
    "k4v3hsf", "k4v3hsl", "k4v3hsl2",
]


def default_cache_dir() -> Path:
    """Where derived artefacts (converted LLM weights, the exported query embedder) are cached:
    ``$AGENTMEM_CACHE_DIR`` if set, else ``~/.cache/agentmem``."""
    env = os.environ.get("AGENTMEM_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "agentmem"


class MemoryConfig(BaseModel):
    """Settings of one :class:`~agentmem.AgentMemory` store.

    Unknown keys are an error (``extra="forbid"``), so a typo never silently falls back to a default.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # --- text and retrieval -------------------------------------------------------------------
    embedding_model: str | None = Field(
        default=None, description="Path of a sentence-transformers model; None = bundled all-MiniLM-L6-v2."
    )
    query_tower: str | None = Field(
        default="auto",
        description="Search queries through a tuned query tower (agentmem.embed.query_tower): 'auto' = the bundled "
        "tower with the bundled model and none with another embedding_model; a path = that tower file; None = off. "
        "Stored vectors never depend on it.",
    )
    embedding_batch_size: int = Field(default=64, gt=0)
    keep_text_in_index: bool = Field(
        default=False,
        description="Also store entry text as Chroma documents. Off by default: text lives in SQLite only, where it "
        "can be encrypted and is provably erased; Chroma keeps vectors and scoping fields.",
    )
    candidate_pool: int = Field(
        default=100, gt=0, description="How many dense and lexical candidates each retriever contributes before fusion."
    )
    ranking: str = Field(
        default="bundled", min_length=1,
        description="The ranking's fitted constants (fusion, head re-ranking, learned head order, score calibration): "
        "'bundled' = the shipped agentmem/recall/weights/ranking.json; a path = a weights file of that shape whose "
        "groups and values overlay the bundled ones (docs/recall.md). A missing or malformed file is an "
        "InvalidInputError naming it when the store opens.",
    )

    message_max_words: int | None = Field(
        default=150, gt=0,
        description="A chat message (remember_messages, session turns, the chat endpoint and proxy) longer than this "
        "many words, e.g. a pasted document or a fetched page, is stored as consecutive parts of at most this many, "
        "numbered in metadata['document'] as remember_document's: a single memory that long is embedded only by "
        "its first ~256 word pieces and takes a mount's whole budget. None stores every message whole.",
    )

    # --- security -------------------------------------------------------------------------------
    secret_policy: Literal["redact", "reject", "off"] = "redact"

    # --- KV bank ---------------------------------------------------------------------------------
    kv_encoding: Literal["lazy", "eager", "background", "off"] = Field(
        default="lazy",
        description="When an entry's KV is encoded: 'eager' on every write (loads the LLM), 'lazy' on writes once the "
        "LLM is loaded and otherwise at first mount, 'background' as 'lazy' while the model is idle and, while it is "
        "busy (answering, or encoding another write), by a worker thread once it is idle, after the write returned "
        "(concurrent writes do not queue for the model; docs/server.md), 'off' never (text mode only).",
    )
    kv_codec: KvCodec = Field(
        default="k4v3hsl",
        description="How memory KV blobs are stored: a float dtype, or integer codes (keys per channel, values per "
        "token, KIVI's layout) dequantized while mounting. k4v3hsl (4-bit clipped keys, 3-bit Hadamard-rotated "
        "values, layer 1's values 4-bit): chosen by benchmarks/kv_compression.py, 8.1x fewer bytes than float32, "
        "KL 1.08x float32's, gold NLL +0.9%, TTFT equal (docs/kv-compression.md); encoding costs ~0.15 s per "
        "60-token turn on one CPU core. int8: 3.6x fewer bytes at float32's fidelity. Blobs of every codec stay "
        "readable whatever this is set to.",
    )
    kv_dtype: KvDtype = Field(
        default="float32", description="Deprecated alias: setting it (without kv_codec) sets kv_codec to it."
    )
    mount_budget_tokens: int = Field(default=2048, gt=0)
    prefix_cache: bool = Field(
        default=True, description="Start text-mode prompts from the cached KV of the shared preamble (the kv modes "
        "always do); exact, since no preamble token attends to what follows. False prefills it every time."
    )
    strict_fingerprint: bool = Field(
        default=False, description="Raise on a foreign-model blob instead of falling back to text."
    )
    cache_dir: Path | None = Field(
        default=None, description="Where converted model weights and the exported query embedder are cached "
        "(default: $AGENTMEM_CACHE_DIR or ~/.cache/agentmem).")

    # --- where and how the LLM runs ---------------------------------------------------------------------
    device: str = Field(
        default="auto", pattern=DEVICE_PATTERN,
        description="Device of the local LLM: 'auto' (CUDA if available, else MPS, else CPU), 'cpu', 'cuda', "
        "'cuda:N' or 'mps'. Ignored for an already-loaded (model, tokenizer) pair unless set explicitly.",
    )
    torch_dtype: TorchDtype = Field(
        default="auto",
        description="Weights dtype of the local LLM: 'auto' = bfloat16 where the hardware multiplies it (a GPU that "
        "supports it, a CPU with Intel AMX), float16 on other GPUs, float32 on other CPUs. Stored KV made in another "
        "dtype is converted on load when the blob allows it.",
    )
    threads: int | None = Field(
        default=None, gt=0,
        description="torch intra-op CPU threads; None = agentmem.kv.device.default_threads() (half the CPUs this "
        "process may use per worker, at least 1), which does not collapse when other processes compete for CPUs.",
    )
    workers: int | None = Field(
        default=None, gt=0,
        description="Processes serving this store on one host (for the thread default); None = $WEB_CONCURRENCY "
        "or $AGENTMEM_WORKERS, else 1.",
    )
    decode_lanes: int | None = Field(
        default=None, gt=0,
        description="Batch workers running the model's forwards side by side (agentmem/kv/lanes.py); None = "
        "agentmem.kv.lanes.default_lanes(): 2 on a CPU with at least 2 usable cores, else 1.",
    )

    # --- sessions (working KV of live conversations) ----------------------------------------------
    session_hot_bytes: int = Field(default=512 * 2**20, ge=0, description="Byte budget of the hot tier (model device).")
    session_warm_bytes: int = Field(default=2 * 2**30, ge=0, description="Byte budget of the warm tier (CPU memory).")
    session_idle_seconds: float = Field(
        default=300.0, gt=0, description="A session idle this long is offloaded to disk by the background worker."
    )
    session_ttl_seconds: float | None = Field(
        default=7 * 24 * 3600.0, gt=0, description="After this long without use a session's working KV is erased."
    )
    session_kv_codec: KvCodec | None = Field(
        default=None, description="Codec of session KV written to the cold tier: None = the model's dtype (a restored "
        "session continues token for token); an integer codec (e.g. 'int8') holds more sessions per byte, lossily "
        "(docs/kv-compression.md).")
    session_warm_kv_codec: KvCodec | None = Field(
        default=None, description="Codec of session KV held in the warm tier: None = the model's dtype; an integer "
        "codec (e.g. 'int8') holds several times more sessions in session_warm_bytes, lossily, and is dequantized "
        "on the way back to hot (docs/kv-compression.md). Hot always keeps the model's dtype.")
    session_max_tokens: int = Field(
        default=1536, gt=0, description="Most tokens of conversation a session keeps in its working cache."
    )
    session_lease_seconds: float = Field(
        default=30.0, gt=0, description="A worker serving a session holds its lease this long, renewed while the "
        "session stays in its memory; a crashed worker's sessions are free again after it.")
    session_lease_wait_seconds: float = Field(
        default=10.0, ge=0, description="How long a turn waits for another worker to release a session's lease "
        "before raising SessionBusyError.")

    # --- lifecycle -------------------------------------------------------------------------------
    consolidation: Literal["local", "llm", "off"] = Field(
        default="local",
        description="What remember() does with a memory close to an existing one: 'local' merges near-duplicates "
        "and supersedes what a newer statement replaces, from embedding, lexical, time and speaker signals only; "
        "'llm' asks a chat model (ADD/UPDATE/DELETE/NOOP) on a background worker; 'off' stores everything.",
    )
    recall_follows_versions: bool = Field(
        default=True,
        description="With consolidation on, a superseded entry that recall finds hands its place in the ranking to "
        "the active entry that replaced it (the old wording often matches the question best); False = superseded "
        "entries are simply left out.")
    recall_conflict_demotion: bool = Field(
        default=True,
        description="With consolidation on, of two recalled memories of one speaker that conflict (pairwise "
        "supersession model), the older ranks behind the other candidates (recall fetches a few extra). False = "
        "recall keeps the store's ranking (the ablation of benchmarks/knowledge_update.py).")
    unmounted_roles: tuple[str, ...] = Field(
        default=("assistant",),
        description="Roles whose turns are stored and recallable but not mounted by generate() or sessions "
        "(the assistant's own replies can be wrong; docs/lifecycle.md measures the default).",
    )
    mount_questions: bool = Field(
        default=False,
        description="Mount a memory that only asks (a user's earlier question: every sentence of it a question, "
        "agentmem.consolidate.statements.only_asks)? It holds no fact to answer from, and a user's earlier "
        "questions resemble the next ones more than the facts that answer them do, so by default a mount leaves "
        "them out, as it does the assistant's replies; they stay stored and recalled.",
    )
    recall_questions_last: bool = Field(
        default=True,
        description="Plain recall ranks a memory that only asks (a user's earlier question, as for mount_questions) "
        "after the statements it found: it resembles the next question more than the fact that answers it does, "
        "and it answers nothing (on LoCoMo and REALTALK dev no evidence turn only asks). False = the store's "
        "ranking.",
    )
    mount_min_score: float = Field(
        default=0.3, ge=0.0, le=1.0,
        description="Recalled memories scoring below this (Hit.score: how likely the memory answers the query, "
        "the same on any store) are not mounted by generate(), sessions, the chat endpoint, the memory proxy or the "
        "LangGraph node/chat model (one policy: AgentMemory.recall_for_mount). 0.3: the score's bound for an "
        "unrelated memory, so what may answer is mounted and what is unrelated is not; a preference or constraint "
        "the request does not restate often scores 0.3-0.5 ('I don't drink alcohol.' for 'Would I like a glass of "
        "wine with dinner?'). What it keeps and costs on LoCoMo, REALTALK and small stores is in docs/recall.md. "
        "0.5 mounts only what is likelier than not to answer; 0.0 = no threshold.")
    mount_profile_max: int = Field(
        default=8, ge=0,
        description="Memories of kind 'profile' (facts about the user, standing preferences and constraints) are "
        "mounted with every answer besides the k recalled ones, whatever their score: at most this many, the most "
        "relevant first (like Letta's core memory). A request's kinds / tags / filters apply to them too; 0 mounts "
        "them only when recalled like any other memory.")
    topic_switch_threshold: float | None = Field(
        default=None, ge=-1.0, le=1.0,
        description="A session message (of 3+ content words) whose cosine similarity to the session's last 3 user "
        "turns falls below this starts a new topic: the old turns leave the working KV (they stay long-term "
        "memories); counted as topic_switches in mem.sessions.stats(). None = off (default: a wrong switch loses "
        "the conversation's context). 0.1 separates unrelated from related messages with MiniLM.",
    )
    sweep_interval: float | None = Field(
        default=None, gt=0, description="Seconds between background sweeps of expired entries; None = no timer."
    )
    erasure_replay_s: float | None = Field(
        default=None, gt=0, description="Seconds between reads of the erasures other processes on this store "
        "journalled (their in-memory copies of erased text dropped here too: caches, a server's request log, the "
        "sessions' working KV); a store with a period also journals its own erasures (ids only, kept ten minutes). "
        "None = every 1 s when catalog_url names a database other processes open (several servers on one "
        "PostgreSQL), no journal for the embedded catalog; AgentMemory.replay_erasures() reads it at once.")
    busy_timeout_ms: int = Field(default=30_000, gt=0)

    # --- backends (see agentmem.factory; None = the embedded default under the store path) ------------
    catalog_url: str | None = Field(
        default=None, description="Catalog: None = SQLite under the path; 'postgresql+psycopg://user@host/db'.")
    vector_url: str | None = Field(
        default=None, description="Vectors: None = embedded Chroma under the path; 'pgvector' (the catalog's "
        "PostgreSQL database); 'chroma+http://host:port'; 'memory' (in-process, not persisted).")
    blob_url: str | None = Field(default=None, description="KV blobs: None = files under the path; 'redis://...'; "
                                 "'memory' (in-process, not persisted).")
    session_store_url: str | None = Field(
        default=None, description="Cold tier of session KV: None = files under the path; 'redis://host:port/db' "
        "(shared by every worker; ?prefix= sets the key prefix).")
    pending_grace_s: float = Field(
        default=60.0, ge=0, description="A write or deletion recorded as in flight for longer than this is taken to "
        "be a crashed writer's and is rolled back / finished on open (clocks of hosts sharing a store must agree "
        "to well within it).")

    @model_validator(mode="before")
    @classmethod
    def _kv_dtype_alias(cls, data: Any) -> Any:
        # kv_dtype came first; a store configured with it keeps meaning what it meant.
        if isinstance(data, dict) and "kv_dtype" in data and "kv_codec" not in data:
            data = {**data, "kv_codec": data["kv_dtype"]}
        return data


__all__ = ["DEVICE_PATTERN", "KvCodec", "KvDtype", "MemoryConfig", "TorchDtype"]
