"""Erasure reaches the in-process caches: after ``forget``, no object reachable from the facade or from agentmem's
modules holds the erased text or its vector (issue #41: "erasure must reach every in-process copy").

The check walks the live object graph (``gc.get_referents``) from the ``AgentMemory`` and every ``agentmem`` module,
so it finds a copy wherever it sits (a module-level ``lru_cache``, a cache on a part), not only where we expect one.
The embedder is a small bag-of-words one written against the ``Embedder`` port, so the test knows each text's exact
vector.
"""

from __future__ import annotations

import gc
import sqlite3
import sys
import types
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from agentmem import AgentMemory

MARKER = "zqerasedmarker"
DIM = 64


class WordsEmbedder:
    """Unit bag-of-words vectors (each word hashed into one of ``DIM`` columns): deterministic, no model."""

    dim = DIM

    def encode(self, texts: Any, *, batch_size: int = 64) -> np.ndarray:
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row, zlib.crc32(word.strip(".,:;?!").encode()) % DIM] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


def copies_of(text: str, vector: np.ndarray | None, roots: list[Any]) -> list[str]:
    """Where, among objects reachable from ``roots``, ``text`` (in a str/bytes) or ``vector`` (a row of a float
    array) still is: a path of type names per copy. Other libraries' modules and tensors are not walked into."""
    foreign = {id(vars(m)) for name, m in list(sys.modules.items())
               if m is not None and not name.startswith("agentmem")}  # this test module among them
    needle = text.encode()
    seen: set[int] = set()
    found: list[str] = []
    stack: list[tuple[Any, str]] = [(r, type(r).__name__) for r in roots]
    while stack:
        obj, path = stack.pop()
        if id(obj) in seen or id(obj) in foreign:
            continue
        seen.add(id(obj))
        if isinstance(obj, str):
            if text in obj:
                found.append(path)
            continue
        if isinstance(obj, (bytes, bytearray, memoryview)):
            if needle in bytes(obj):
                found.append(path)
            continue
        if isinstance(obj, np.ndarray):
            if vector is not None and obj.dtype.kind == "f" and obj.shape[-1:] == vector.shape:
                if np.any(np.all(np.isclose(obj.reshape(-1, vector.shape[0]), vector, atol=1e-5), axis=1)):
                    found.append(path)
            continue
        if isinstance(obj, types.ModuleType) and not obj.__name__.startswith("agentmem"):
            continue
        if type(obj).__module__.startswith("torch"):
            continue
        for ref in gc.get_referents(obj):
            stack.append((ref, f"{path} > {type(ref).__name__}"))
    return found


def _agentmem_modules() -> list[Any]:
    return [m for name, m in sys.modules.items() if name.startswith("agentmem") and m is not None]


def test_forget_leaves_no_copy_of_the_text_in_recall_caches(tmp_path: Path) -> None:
    """Recall's head cues memoise each turn's words (lru caches keyed by the text); erase must empty them."""
    with AgentMemory(tmp_path / "store", embedder=WordsEmbedder(), sweep_interval=None) as mem:
        for text in ("Ann: I paint birds at the lake", f"Ann: my locker code is {MARKER} now",
                     "Ann: we went sailing on Sunday", "Bob: the lake was cold"):
            mem.remember(text, user_id="u1", session_id="s1")
        hits = mem.recall("what is Ann's locker code", user_id="u1", k=4)
        assert any(MARKER in h.text for h in hits)
        del hits
        assert copies_of(MARKER, None, [mem, *_agentmem_modules()]), "the walk does not see the cached copies"
        assert mem.forget(user_id="u1") == 4
        gc.collect()
        leftover = copies_of(MARKER, None, [mem, *_agentmem_modules()])
        assert not leftover, f"erased text still held in-process: {leftover[:5]}"


def test_forget_leaves_no_copy_of_the_vector_in_the_consolidation_cache(tmp_path: Path) -> None:
    """Consolidation caches the text vectors of stored neighbours that carry none on their row (written by a
    version that kept them only with consolidation on); erase must drop the erased entry's."""
    store, embedder = tmp_path / "store", WordsEmbedder()
    erased = f"my locker code is {MARKER}"
    with AgentMemory(store, embedder=embedder, consolidation="off", sweep_interval=None) as mem:
        old = mem.remember(erased, user_id="u1")
    with sqlite3.connect(store / "catalog.db") as conn:  # the row as such a version wrote it
        conn.execute("UPDATE entries SET text_vector = NULL")
    conn.close()
    vector = embedder.encode([erased])[0]
    with AgentMemory(store, embedder=embedder, sweep_interval=None) as mem:  # consolidation on (the default)
        mem.remember(f"my locker code is {MARKER} again", user_id="u1")  # its neighbour's vector is embedded
        assert copies_of(MARKER, vector, [mem]), "the walk does not see the cached vector"
        assert mem.forget(old.id) == 1
        gc.collect()
        leftover = copies_of("\x00never\x00", vector, [mem, *_agentmem_modules()])
        assert not leftover, f"erased vector still held in-process: {leftover[:5]}"


def test_forget_leaves_no_copy_of_the_text_after_answers_mounted_it(tmp_path: Path) -> None:
    """An answer mounts the recalled memories (their token ids are memoised per text); erase must drop them."""
    from agentmem.kv.testing import tiny_causal_lm

    with AgentMemory(tmp_path / "store", model=tiny_causal_lm("llama", seed=0), embedder=WordsEmbedder(),
                     sweep_interval=None) as mem:
        mem.remember(f"my locker code is {MARKER}", user_id="u1", encode=True)
        for mode in ("kv", "text"):
            mem.generate("what is my locker code", user_id="u1", mode=mode, max_new_tokens=2)
        assert mem.forget(user_id="u1") == 1
        gc.collect()
        leftover = copies_of(MARKER, None, [mem, *_agentmem_modules()])
        assert not leftover, f"erased text still held in-process: {leftover[:5]}"
