"""The unit vector of an entry's own text, stored on its row (``EntryRecord.text_vector``, float16 bytes), and, for a
memory of several sentences, one per sentence that states something (``EntryRecord.sentence_vectors``).

The index holds the vector of the entry's memory line (``"[5 December 2026, 12:13] Caroline: ..."``), which is what
recall ranks by. Two things need the text alone: consolidation's conflict check compares what was said, and
``Hit.score`` (:mod:`agentmem.recall.calibration`) must read the same for the same text whenever it was stored — the
time stamped into the line moves a short memory's cosine to its question by up to 0.1 from one minute to the next.
Both read this vector, written with the row, so no recall re-embeds a text. The conflict check also reads the
sentence vectors: a newer memory may contradict one sentence of an older message ("Hi! I'm Dana. I take 20 mg of
lisinopril." / "My doctor raised my lisinopril to 40 mg."), which the whole message's vector dilutes.

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


def pack_vectors(vecs: np.ndarray) -> bytes:
    """Unit vectors (one per row) as the float16 bytes stored in ``EntryRecord.sentence_vectors``; no rows: ``b""``.

    Example:
        >>> len(pack_vectors(np.ones((3, 384), dtype=np.float32))), pack_vectors(np.zeros((0, 384)))
        (2304, b'')
    """
    return np.asarray(vecs, dtype=np.float16).tobytes()


def unpack_vectors(blob: bytes, dim: int) -> np.ndarray:
    """The float32 unit vectors of :func:`pack_vectors`' bytes, ``dim`` values each (re-normalised).

    Example:
        >>> vecs = unpack_vectors(pack_vectors(np.array([[0.6, 0.8], [0.0, 1.0]])), 2)
        >>> [[round(float(x), 3) for x in row] for row in vecs]
        [[0.6, 0.8], [0.0, 1.0]]
        >>> unpack_vectors(b"", 384).shape
        (0, 384)
    """
    vecs = np.frombuffer(blob, dtype=np.float16).astype(np.float32).reshape(-1, dim)
    return vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)


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


__all__ = ["pack_vector", "pack_vectors", "text_cosine", "unpack_vector", "unpack_vectors"]
