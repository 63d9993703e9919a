"""The ranking's fitted constants as data: ``weights/ranking.json`` (bundled) and files of the same shape.

A weights file holds one group per part of the ranking (``retrieval``: :class:`~agentmem.recall.retrieval.
RetrievalParams`; ``head_model``: :class:`~agentmem.recall.learned_rank.HeadModel`; ``calibration``:
:class:`~agentmem.recall.calibration.Calibration`), each with its ``values`` and a ``provenance`` (what data, what
procedure, which research script fits it). This module only reads and checks the JSON; the parts take their
defaults from :func:`bundled` and :mod:`agentmem.recall.ranking_weights` builds them from a file. It imports no
part, so every part can read its defaults here.

Example:
    >>> bundled("calibration")["bias"]
    -3.6411
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from agentmem.errors import InvalidInputError

BUNDLED_RANKING = Path(__file__).parent / "weights" / "ranking.json"
GROUPS = ("retrieval", "head_model", "calibration")


def read_groups(path: Path) -> dict[str, dict[str, Any]]:
    """The ``values`` of each group in the weights file at ``path`` (groups it lacks are absent).

    Raises :class:`~agentmem.errors.InvalidInputError` naming the file when it is missing, is not JSON, or names a
    group this version does not know.

    Example:
        >>> sorted(read_groups(BUNDLED_RANKING))
        ['calibration', 'head_model', 'retrieval']
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInputError(f"ranking weights file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidInputError(f"ranking weights file {str(path)!r} is not readable JSON: {e}") from None
    if not isinstance(data, dict):
        raise InvalidInputError(f"ranking weights file {str(path)!r} must hold a JSON object")
    unknown = sorted(set(data) - set(GROUPS) - {"format", "about"})
    if unknown:
        raise InvalidInputError(f"ranking weights file {str(path)!r}: unknown groups {unknown}; known: {list(GROUPS)}")
    groups = {}
    for name in GROUPS:
        if name in data:
            values = data[name].get("values") if isinstance(data[name], dict) else None
            if not isinstance(values, dict):
                raise InvalidInputError(f"ranking weights file {str(path)!r}: group {name!r} needs a 'values' object")
            groups[name] = values
    return groups


@cache
def _bundled_groups() -> dict[str, dict[str, Any]]:
    return read_groups(BUNDLED_RANKING)


def bundled(group: str) -> dict[str, Any]:
    """A copy of the bundled values of ``group`` (read once per process).

    Example:
        >>> bundled("retrieval")["dense_weight"]
        0.35
    """
    return dict(_bundled_groups()[group])


__all__ = ["BUNDLED_RANKING", "GROUPS", "bundled", "read_groups"]
