"""Spend: a date range, grouped by any of the report's dimensions, a chart by day stacked by
the chosen group, the table, and its CSV, all from the report `/api/spend/report` gives."""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from litestar import Request, Response, get
from litestar.response import Template
from markupsafe import Markup

from controlplane.console import _charts, _choices
from controlplane.console._core import Page, open_page
from controlplane.errors import invalid
from controlplane.ledger.queries import GROUPS, Period
from controlplane.models import Organization
from controlplane.spend import reports
from vkgate.money import nanos_to_usd

DIMENSIONS = [g for g in GROUPS if g != "route"] + ["route"]
SERIES = 9
"""Groups drawn apart in the chart; the rest are stacked as one `other`."""
DEFAULT_GROUPS = ["model"]
TABLE_ROWS = 200
"""Rows of the table a page shows (the CSV has them all; the totals count them all)."""
TABLE_MEASURES = (
    "requests",
    "refused",
    "failed",
    "unpriced",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cost_nano_usd",
    "cache_hits",
    "saved_nano_usd",
)
"""What the table shows: the ledger reads only these (the CSV, the report's every measure)."""
MONEY = {"cost_nano_usd": "cost_usd", "saved_nano_usd": "saved_usd"}
"""The measures in nano-USD, and the fields the table shows them as, as the report does."""


def _offset(text: str | None, count: int) -> int:
    if not text:
        return 0
    if not (text.isascii() and text.isdigit()) or int(text) > max(count, 0):
        raise invalid("offset must be a row number this page gave", param="offset")
    return int(text)


def _ordered(group: tuple[Any, ...]) -> tuple[tuple[bool, Any], ...]:
    # The report's own order: its fields ascending, nulls last, as ClickHouse sorts.
    return tuple((v is None, v or "") for v in group)


def _without_day(rows: list[dict[str, Any]], fields: list[str]) -> list[dict[str, Any]]:
    """The report by `fields` from the report by day and `fields`: the same integer sums, in
    the report's own order."""
    summed: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        group = tuple(row[f] for f in fields)
        into = summed.get(group)
        if into is None:
            summed[group] = {**row}
            continue
        for measure in TABLE_MEASURES:
            into[measure] += row[measure]
    return [summed[k] for k in sorted(summed, key=_ordered)]


def _shown(row: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """A row as the table shows it: its counts, and its money in USD as the report says it."""
    out = {f: row[f] for f in fields}
    for measure in TABLE_MEASURES:
        if measure in MONEY:
            out[MONEY[measure]] = nanos_to_usd(int(row[measure]))
        else:
            out[measure] = int(row[measure])
    return out


async def _query(view: Page, request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The query as the page and the API both take it; an organization is chosen for a
    token bound to none when the address names none."""
    params = request.query_params
    now = view.vk.clock.now()
    today = now.date()
    organization_id = params.get("organization_id") or view.actor.organization_id
    orgs = []
    async with view.vk.read() as tx:
        orgs = list(await _choices.organizations(tx))
        if organization_id is None and orgs:
            organization_id = orgs[0].id
        if organization_id is not None:
            await tx.get(Organization, organization_id, "organization", param="organization_id")
    chosen = [g for g in params.getall("group_by", []) for g in g.split(",") if g.strip()]
    # The form says `grouped` so that no box ticked means totals only, not the default.
    asked = chosen or params.get("grouped")
    groups = reports.parse_group_by(",".join(chosen) if asked else ",".join(DEFAULT_GROUPS))
    start = params.get("from") or today.replace(day=1).isoformat()
    end = params.get("to") or (today + timedelta(days=1)).isoformat()
    return {
        "organization_id": organization_id,
        "from": start,
        "to": end,
        "group_by": groups,
        "organizations": orgs,
    }


def _api_query(q: dict[str, Any], **extra: str) -> str:
    wanted = {
        "organization_id": q["organization_id"],
        "from": q["from"],
        "to": q["to"],
        "group_by": ",".join(q["group_by"]),
        **extra,
    }
    return urlencode({k: v for k, v in wanted.items() if v}, safe=",")


def _chart(
    rows: list[dict[str, Any]], group: str | None, period: Period, now: datetime
) -> tuple[Markup, list[str]]:
    field = GROUPS[group][0] if group else None
    by_series: dict[str, int] = defaultdict(int)
    for r in rows:
        by_series[str(r.get(field) or "(none)") if field else "spend"] += r["cost_nano_usd"]
    ranked = sorted(by_series, key=lambda k: (-by_series[k], k))
    named = ranked[:SERIES]
    legend = [*named, "other"] if len(ranked) > SERIES else named
    index = {name: i for i, name in enumerate(named)}
    if period.start is not None:
        first = period.start.date()
    else:
        first = min((date.fromisoformat(r["day"]) for r in rows), default=now.date())
    last = (period.end - timedelta(microseconds=1)).date() if period.end else now.date()
    days: list[str] = []
    day = first
    while day <= last and len(days) < 400:
        days.append(day.isoformat())
        day += timedelta(days=1)
    stacks: dict[str, dict[int, int]] = {d: defaultdict(int) for d in days}
    for r in rows:
        name = str(r.get(field) or "(none)") if field else "spend"
        series = index.get(name, SERIES)
        if r["day"] in stacks:
            stacks[r["day"]][series] += r["cost_nano_usd"]
    drawn = [
        [
            _charts.Segment(
                s,
                n,
                f"{d} · {legend[s] if s < len(legend) else 'other'} · ${nanos_to_usd(n)}",
            )
            for s, n in sorted(stacks[d].items())
        ]
        for d in days
    ]
    title = f"Spend by day{f', stacked by {group}' if group else ''}"
    return _charts.stacked_bars(title, days, drawn), legend


@get("/spend")
async def spend(request: Request[Any, Any, Any]) -> Template:
    view = await open_page(request)
    q = await _query(view, request)
    context: dict[str, Any] = {
        "q": q,
        "dimensions": DIMENSIONS,
        "totals": None,
        "chart": None,
        "legend": [],
        "api_query": "",
    }
    if q["organization_id"] is not None:
        period = reports.parse_period(q["organization_id"], q["from"], q["to"])
        groups = q["group_by"]
        # One read of the ledger, by day as well (for the chart), of the measures the table
        # shows: the table adds the days up and formats only the rows it shows.
        by_day = await view.vk.ledger.report(
            period, groups if "day" in groups else ["day", *groups], TABLE_MEASURES
        )
        fields = [GROUPS[g][0] for g in groups]
        rows = by_day if "day" in groups else _without_day(by_day, fields)
        stack_by = next((g for g in groups if g != "day"), None)
        chart, legend = _chart(by_day, stack_by, period, view.vk.clock.now())
        offset = _offset(request.query_params.get("offset"), len(rows))
        totals = {m: sum(int(r[m]) for r in rows) for m in TABLE_MEASURES}
        context.update(
            totals=_shown(totals, []),
            rows=[_shown(r, fields) for r in rows[offset : offset + TABLE_ROWS]],
            row_count=len(rows),
            offset=offset,
            table_rows=TABLE_ROWS,
            group_fields=fields,
            chart=chart,
            legend=legend,
            api_query=_api_query(q),
            csv_query=_api_query(q),
        )
    return view.render("spend.html", "spend", heading="Spend", **context)


@get("/spend.csv")
async def spend_csv(request: Request[Any, Any, Any]) -> Response[bytes]:
    view = await open_page(request)
    q = await _query(view, request)
    if q["organization_id"] is None:
        raise invalid("there is no organization to report on yet", param="organization_id")
    period = reports.parse_period(q["organization_id"], q["from"], q["to"])
    built = await reports.report(view.vk.ledger, period, q["group_by"])
    return Response(
        reports.to_csv(built.fields, built.rows),
        media_type="text/csv; charset=utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="spend-{q["organization_id"]}.csv"',
            "Cache-Control": "no-store",
        },
    )


HANDLERS = [spend, spend_csv]
