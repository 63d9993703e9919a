"""The unit vector of an entry's own text, stored on its row (``EntryRecord.text_vector``, float16 bytes).

The index holds the vector of the entry's memory line (``"[5 December 2026, 12:13] Caroline: ..."``), which is what
recall ranks by. Two things need the text alone: consolidation's conflict check compares what was said, and
``Hit.score`` (:mod:`agentmem.recall.calibration`) must read the same for the same text whenever it was stored — the
time stamped into the line moves a short memory's cosine to its question by up to 0.1 from one minute to the next.
Both read this vector, written with the row, so no recall re-embeds a text.

Example:
    >>> v = unpack_vector(pack_vector(np.array([0.6, 0.8], dtype=np.float32)))
    >>> [round(float(x), 3) for x in v]
    [0.6, 0.8]
    >>> round(text_cosine(pack_vector(np.array([1.0, 0.0])), np.array([0.6, 0.8], dtype=np.float32)), 3)
    0.6
"""

from __future__ import annotations

import numpy as np


def pack_vector(vec: np.ndarray) -> bytes:
    """A unit vector as the float16 bytes stored in ``EntryRecord.text_vector`` (cosines keep ~3 decimals).

    Example:
        >>> len(pack_vector(np.ones(384, dtype=np.float32) / np.sqrt(384)))
        768
    """
    return np.asarray(vec, dtype=np.float16).tobytes()


def unpack_vector(blob: bytes) -> np.ndarray:
    """The float32 unit vector of :func:`pack_vector`'s bytes (re-normalised after the float16 rounding).

    Example:
        >>> float(np.linalg.norm(unpack_vector(pack_vector(np.array([3.0, 4.0]) / 5))))
        1.0
    """
    vec = np.frombuffer(blob, dtype=np.float16).astype(np.float32)
    return vec / max(float(np.linalg.norm(vec)), 1e-12)


def text_cosine(blob: bytes | None, query: np.ndarray) -> float | None:
    """The cosine of a unit ``query`` vector and a row's stored text vector; None when the row has none (written
    before text vectors were kept, or with a vector whose size is not the query's).

    Example:
        >>> text_cosine(None, np.array([1.0, 0.0], dtype=np.float32)) is None
        True
    """
    if not blob or len(blob) != 2 * query.shape[-1]:
        return None
    return float(unpack_vector(blob) @ np.asarray(query, dtype=np.float32))


__all__ = ["pack_vector", "text_cosine", "unpack_vector"]
