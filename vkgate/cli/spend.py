"""`vkgate spend report|ledger …`: what was spent, from the ledger, as finance reads it."""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections.abc import Iterable, Sequence
from typing import Any

import click

from vkgate.cli._context import admin_client
from vkgate.cli._output import table

GROUP_FIELDS = {
    "team": "team_id",
    "project": "project_id",
    "virtual_key": "virtual_key_id",
    "model": "model",
    "served_model": "served_model",
    "provider": "provider_id",
    "end_user": "end_user",
    "day": "day",
    "route": "route",
}
UNIT_FIELDS = (
    "input_audio_tokens",
    "output_audio_tokens",
    "input_image_tokens",
    "output_image_tokens",
    "input_characters",
    "images",
    "audio_seconds",
)
"""Shown in the table only when some row has them (chat alone has none); CSV and JSON always
carry them."""
LEDGER_COLUMNS = (
    "at",
    "kind",
    "route",
    "virtual_key_id",
    "end_user",
    "model",
    "served_model",
    "status",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "price_source",
    "cache_hit",
    "saved_usd",
)


def _group_by(text: str | None) -> list[str]:
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    for name in names:
        if name not in GROUP_FIELDS:
            raise click.BadParameter(
                f"unknown field {name!r}; choose from {', '.join(GROUP_FIELDS)}",
                param_hint="--group-by",
            )
    return names


def _period_options(function: Any) -> Any:
    function = click.option("--to", "end", help="Exclusive end: a date or RFC 3339 time (UTC).")(
        function
    )
    function = click.option(
        "--from", "start", help="Inclusive start: a date (2026-03-01) or RFC 3339 time."
    )(function)
    return click.option("--org", "org_id", required=True, help="Organization id.")(function)


def _output_options(function: Any) -> Any:
    function = click.option("--json", "as_json", is_flag=True, help="Print JSON.")(function)
    return click.option("--csv", "as_csv", is_flag=True, help="Print CSV (for spreadsheets).")(
        function
    )


@click.group("spend")
def spend() -> None:
    """Spend from the ledger: reports and raw rows (admin or finance token)."""


@spend.command("report")
@_period_options
@click.option(
    "--group-by",
    help=(
        "Comma list of team, project, virtual_key, model, served_model, provider, end_user, "
        "day, route."
    ),
)
@_output_options
def report(
    org_id: str,
    start: str | None,
    end: str | None,
    group_by: str | None,
    as_csv: bool,
    as_json: bool,
) -> None:
    """Requests, refusals, failures, tokens, the units audio and image calls use, requests
    no price covered (`unpriced`, at $0 in the ledger), cost, and the requests the response
    cache answered (`cache_hits`) with what they saved (`saved_usd`), grouped; with totals."""
    groups = _group_by(group_by)
    answer = admin_client().get(
        "/api/spend/report",
        organization_id=org_id,
        group_by=",".join(groups) or None,
        **{"from": start, "to": end},
    )
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    fields = [GROUP_FIELDS[g] for g in groups] + list(answer["totals"])
    if as_csv:
        click.echo(_csv(fields, answer["rows"]), nl=False)
        return
    total = {fields[0]: "TOTAL", **answer["totals"]} if groups else answer["totals"]
    unused = {f for f in UNIT_FIELDS if not _nonzero(answer["totals"].get(f))}
    click.echo(_table([f for f in fields if f not in unused], [*answer["rows"], total]))


@spend.command("ledger")
@_period_options
@click.option("--limit", type=click.IntRange(min=1), help="At most this many rows.")
@_output_options
def ledger(
    org_id: str,
    start: str | None,
    end: str | None,
    limit: int | None,
    as_csv: bool,
    as_json: bool,
) -> None:
    """Raw ledger rows in time order (every page, or --limit of them)."""
    rows: Iterable[dict[str, Any]] = admin_client().list_all(
        "/api/spend/ledger", organization_id=org_id, **{"from": start, "to": end}
    )
    chosen = list(itertools.islice(rows, limit) if limit else rows)
    if as_json:
        click.echo(json.dumps(chosen, indent=2))
    elif as_csv:
        click.echo(_csv(list(chosen[0]) if chosen else [], chosen), nl=False)
    else:
        click.echo(_table(LEDGER_COLUMNS, chosen))


def _nonzero(value: Any) -> bool:
    try:
        return float(value or 0) != 0
    except (TypeError, ValueError):
        return True


def _csv(fields: Sequence[str], rows: Iterable[dict[str, Any]]) -> str:
    if not fields:
        return ""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(fields)
    for row in rows:
        writer.writerow(["" if row.get(f) is None else _text(row.get(f)) for f in fields])
    return out.getvalue()


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _table(fields: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    return table(rows, fields)
