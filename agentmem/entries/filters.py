"""Metadata filters with mem0's operators, validated up front and evaluated in Python.

Example:
    >>> f = compile_filters({"source": {"$eq": "chat"}, "$or": [{"n": {"$gt": 2}}, {"n": {"$lt": 0}}]})
    >>> f({"source": "chat", "n": 3}), f({"source": "chat", "n": 1})
    (True, False)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agentmem.errors import InvalidInputError

Predicate = Callable[[Mapping[str, Any]], bool]
_MISSING = object()


def _compare(op: str, have: Any, want: Any) -> bool:
    if op == "$eq":
        return have == want
    if op == "$ne":
        return have != want
    if op in ("$in", "$nin"):
        try:
            found = have in want
        except TypeError:  # an unhashable value (a list, a dict) against a set: compare one by one
            found = any(have == w for w in want)
        return found if op == "$in" else not found
    if op == "$contains":
        if isinstance(have, str):
            return isinstance(want, str) and want in have
        if isinstance(have, (list, tuple)):
            return want in have
        return False
    # ordering operators: a missing value or a type clash is "no match", never an exception
    try:
        if op == "$gt":
            return have > want
        if op == "$gte":
            return have >= want
        if op == "$lt":
            return have < want
        if op == "$lte":
            return have <= want
    except TypeError:
        return False
    raise AssertionError(op)  # unreachable: validated in _field_predicate


_OPERATORS = ("$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$contains")


def _field_predicate(key: str, cond: Any) -> Predicate:
    if not isinstance(cond, Mapping):  # shorthand: {"source": "chat"} means $eq
        cond = {"$eq": cond}
    if not cond:
        raise InvalidInputError(f"filter on {key!r} is empty; give an operator such as {{'$eq': value}}")
    checks: list[tuple[str, Any]] = []
    for op, want in cond.items():
        if op not in _OPERATORS:
            raise InvalidInputError(
                f"unknown filter operator {op!r} on {key!r}; use one of {', '.join(_OPERATORS)}, $and, $or"
            )
        if op in ("$in", "$nin") and not isinstance(want, (list, tuple, set)):
            raise InvalidInputError(f"{op} on {key!r} needs a list, got {type(want).__name__}")
        checks.append((op, want))

    def predicate(metadata: Mapping[str, Any]) -> bool:
        have = metadata.get(key, _MISSING)
        if have is _MISSING:
            return all(op in ("$ne", "$nin") for op, _ in checks)
        return all(_compare(op, have, want) for op, want in checks)

    return predicate


_MAX_DEPTH = 32


def compile_filters(filters: Mapping[str, Any] | None, _depth: int = 0) -> Predicate | None:
    """Validate ``filters`` and return a predicate over an entry's metadata (None when no filter)."""
    if filters is None:
        return None
    if _depth > _MAX_DEPTH:
        raise InvalidInputError(f"filters are nested more than {_MAX_DEPTH} levels deep")
    if not isinstance(filters, Mapping):
        raise InvalidInputError(f"filters must be a dict, got {type(filters).__name__}")
    parts: list[Predicate] = []
    for key, cond in filters.items():
        if key in ("$and", "$or"):
            if not isinstance(cond, (list, tuple)) or not cond:
                raise InvalidInputError(f"{key} needs a non-empty list of filter dicts")
            subs = [compile_filters(c, _depth + 1) for c in cond]
            subs_ok = [s for s in subs if s is not None]
            if key == "$and":
                parts.append(lambda m, s=subs_ok: all(p(m) for p in s))
            else:
                parts.append(lambda m, s=subs_ok: any(p(m) for p in s))
        elif isinstance(key, str) and key.startswith("$"):
            raise InvalidInputError(f"unknown filter operator {key!r} at top level; use $and or $or")
        else:
            parts.append(_field_predicate(key, cond))
    if not parts:
        return None
    return lambda m: all(p(m) for p in parts)


__all__ = ["Predicate", "compile_filters"]
