"""Printing answers: readable tables by default, JSON with --json."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def json_option(function: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(
        function
    )


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def table(rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> str:
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def show(value: Any, columns: Sequence[str], *, as_json: bool) -> None:
    """A row or a list of rows, as a table or as JSON."""
    if as_json:
        click.echo(json.dumps(value, indent=2))
        return
    if isinstance(value, dict):
        width = max(len(k) for k in value) if value else 0
        for name, item in value.items():
            click.echo(f"{name.ljust(width)}  {_cell(item)}")
        return
    click.echo(table(value, columns))
