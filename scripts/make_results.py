"""Regenerate docs/results.md from the benchmark results committed under docs/.

The page is never edited by hand: each row of ``docs/results.toml`` names a committed JSON / JSON-lines file the
benchmarks wrote, which record in it to show, the goal and the goal's checks; this script reads them and writes the
table, so a quoted figure is always the committed one. ``tests/infra/test_results_page.py`` fails when the page is
stale or a row points at a record that is not there.

JSON-lines files hold runs as a *label line* (only ``benchmark`` / ``command`` / ``commit`` / ``date`` / ``note``
keys) followed by the result lines it labels; a row's ``match`` is compared with the result's fields and its
label's, and the last matching record wins. A ``.json`` file is one object; ``path`` picks a part of it.

Example:
    $ .venv/bin/python scripts/make_results.py            # writes docs/results.md
    $ .venv/bin/python scripts/make_results.py --check    # exit 1 if docs/results.md is stale
"""

from __future__ import annotations

import argparse
import json
import operator
import sys
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib  # type: ignore[no-redef]

DOCS = Path(__file__).resolve().parent.parent / "docs"
LABEL_KEYS = {"benchmark", "command", "commit", "date", "note"}
OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq}


class ResultsError(ValueError):
    """A row of docs/results.toml names a file, record or field that is not there."""


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every result record of a JSON-lines file, each merged with the fields of the label line above it.

    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "r.jsonl"
    >>> _ = p.write_text('{"commit": "abc", "note": "n"}\\n{"recall@5": 0.7}\\n')
    >>> read_records(p)
    [{'commit': 'abc', 'note': 'n', 'recall@5': 0.7}]
    """
    label: dict[str, Any] = {}
    records = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ResultsError(f"{path.name}:{n} is not JSON: {exc}") from None
        if set(obj) <= LABEL_KEYS:
            label = obj
        else:
            records.append({**label, **obj})
    return records


def pick(row: dict[str, Any]) -> dict[str, Any]:
    """The record a row of the manifest shows."""
    path = DOCS / row["source"]
    if not path.exists():
        raise ResultsError(f"row {row['title']!r}: {row['source']} is not under docs/")
    if path.suffix == ".jsonl":
        want = row.get("match", {})
        found = [r for r in read_records(path) if all(r.get(k) == v for k, v in want.items())]
        if not found:
            raise ResultsError(f"row {row['title']!r}: no record of {row['source']} matches {want}")
        return found[-1]
    record = json.loads(path.read_text())
    where: dict[str, Any] = {}  # the commit / date nearest the part shown, from any level above it
    for part in filter(None, row.get("path", "").split(".")):
        where.update({k: record[k] for k in ("commit", "date") if isinstance(record, dict) and k in record})
        if not isinstance(record, dict) or part not in record:
            raise ResultsError(f"row {row['title']!r}: {row['source']} has no {row['path']!r}")
        record = record[part]
    return {**where, **record}


def field(record: dict[str, Any], dotted: str) -> Any:
    """A (dotted) field of a record; ``a.*`` is every value of ``a``; a key holding dots (``min_score.0.5``) is
    matched whole."""
    value: Any = record
    parts = dotted.split(".")
    while parts:
        if parts[0] == "*" and isinstance(value, dict):
            return list(value.values())
        n = next((n for n in range(1, len(parts) + 1)
                  if isinstance(value, dict) and ".".join(parts[:n]) in value), None)
        if n is None:
            raise ResultsError(f"no field {dotted!r} in {sorted(record)}")
        value, parts = value[".".join(parts[:n])], parts[n:]
    return value


def check(record: dict[str, Any], rule: str) -> bool:
    """Whether ``rule`` ("key op number", e.g. ``recall@10 >= 0.82``) holds; ``a.* >= x`` holds for every value."""
    key, op, bound = rule.split()
    value = field(record, key)
    values = value if isinstance(value, list) else [value]
    return all(OPS[op](v, float(bound)) for v in values)


def fmt(value: Any) -> str:
    if isinstance(value, dict):
        return " ".join(f"{k}: {fmt(v)}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def render_row(row: dict[str, Any]) -> str:
    record = pick(row)
    shown = " · ".join(f"{k} **{fmt(field(record, k))}**" for k in row["show"])
    checks = row.get("checks", [])
    met = "–" if not checks else ("yes" if all(check(record, c) for c in checks) else "**no**")
    when = " ".join(str(record[k]) for k in ("commit", "date") if k in record) or "–"
    links = [f"[{name}]({name})" for name in (row.get("details"), row["source"]) if name]
    cells = [row["title"], f"`{row['command']}`", row.get("goal", "–"), shown, met, when, " · ".join(links)]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def render(manifest: dict[str, Any]) -> str:
    """The whole page."""
    lines = [
        "# Measured results",
        "",
        "<!-- generated by scripts/make_results.py from docs/results.toml: edit those, not this page -->",
        "",
        manifest["intro"].strip(),
        "",
        "| what | command | goal | measured | met? | commit / date | details · result file |",
        "|---|---|---|---|---|---|---|",
        *(render_row(row) for row in manifest["row"]),
        "",
        manifest.get("outro", "").strip(),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/results.md differs from what is generated")
    args = ap.parse_args(argv)
    page = render(tomllib.loads((DOCS / "results.toml").read_text()))
    target = DOCS / "results.md"
    if args.check:
        stale = not target.exists() or target.read_text() != page
        print("docs/results.md is stale: run scripts/make_results.py" if stale else "docs/results.md is current")
        return int(stale)
    target.write_text(page)
    print(f"wrote {target.relative_to(DOCS.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
