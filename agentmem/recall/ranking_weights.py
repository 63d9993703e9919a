"""The ranking a store uses, built from ``MemoryConfig.ranking``: "bundled" (the shipped weights) or the path of a
weights file (:mod:`agentmem.recall.weights_file`'s shape), whose groups and values overlay the bundled ones.

Example:
    >>> w = load_ranking("bundled")
    >>> w.retrieval == RetrievalParams() and w.head == HeadModel() and w.calibration == Calibration()
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmem.errors import InvalidInputError
from agentmem.recall.calibration import Calibration
from agentmem.recall.learned_rank import HeadModel
from agentmem.recall.retrieval import RetrievalParams
from agentmem.recall.weights_file import BUNDLED_RANKING, bundled, read_groups


@dataclass(frozen=True)
class RankingWeights:
    """Every fitted constant of one store's ranking: the fusion and head parameters, the learned head order's
    model and the score calibration.

    Example:
        >>> RankingWeights().retrieval.dense_weight
        0.35
    """

    retrieval: RetrievalParams = RetrievalParams()
    head: HeadModel = HeadModel()
    calibration: Calibration = Calibration()


# each group of a weights file and the part it builds
_PARTS: dict[str, type] = {"retrieval": RetrievalParams, "head_model": HeadModel, "calibration": Calibration}


def _checked(value: Any, default: Any, where: str) -> Any:
    """``value`` as the type of the bundled ``default`` (bool, int, float or a list of floats), else an error."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:  # a list of floats (the learned head's weights)
        ok = isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        value = tuple(float(v) for v in value) if ok else value
    if not ok:
        raise InvalidInputError(f"{where}: {value!r} is not a {type(default).__name__}")
    return value


def _part(name: str, values: dict[str, Any], path: Path) -> Any:
    """The part of group ``name`` with the file's ``values`` over the bundled ones."""
    merged = bundled(name)
    unknown = sorted(set(values) - set(merged))
    if unknown:
        raise InvalidInputError(f"ranking weights file {str(path)!r}: group {name!r} has unknown values {unknown}")
    for key, value in values.items():
        merged[key] = _checked(value, merged[key], f"ranking weights file {str(path)!r}: {name}.{key}")
    merged = {k: tuple(v) if isinstance(v, list) else v for k, v in merged.items()}
    if name == "head_model" and len(merged["weights"]) != len(HeadModel().weights):
        raise InvalidInputError(f"ranking weights file {str(path)!r}: head_model.weights needs "
                                f"{len(HeadModel().weights)} values, not {len(merged['weights'])}")
    return _PARTS[name](**merged)


def load_ranking(setting: str | Path = "bundled") -> RankingWeights:
    """The ranking ``setting`` names (``MemoryConfig.ranking``): "bundled", or a weights file's path.

    A missing or malformed file, an unknown group or value, or a value of the wrong type is an
    :class:`~agentmem.errors.InvalidInputError` naming the file.

    Example:
        >>> load_ranking("bundled").head.bias
        -12.0291
        >>> load_ranking("/no/such/ranking.json")  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        agentmem.errors.InvalidInputError: ranking weights file '/no/such/ranking.json' does not exist
    """
    if setting == "bundled":
        return RankingWeights()
    path = Path(setting).expanduser()
    groups = read_groups(path)
    return RankingWeights(retrieval=_part("retrieval", groups.get("retrieval", {}), path),
                          head=_part("head_model", groups.get("head_model", {}), path),
                          calibration=_part("calibration", groups.get("calibration", {}), path))


__all__ = ["BUNDLED_RANKING", "RankingWeights", "load_ranking"]
