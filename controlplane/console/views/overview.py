"""The overview: today's and this month's traffic and spend per organization, the keys and
models that spent most, and the budgets nearest their limit."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from litestar import Request, get
from litestar.response import Template
from sqlalchemy import select

from controlplane.console import _budgets
from controlplane.console._core import open_page
from controlplane.models import Budget, Organization, VirtualKey
from vkgate.money import nanos_to_usd

log = logging.getLogger("vkgate.controlplane.console")

TOP = 5
ORGANIZATIONS_SHOWN = 50
BUDGETS_READ = 500
"""The overview weighs at most this many budgets (the first by id) for the nearest list."""
MEASURES = tuple(
    f"{period}_{m}"
    for period in ("month", "today")
    for m in ("requests", "refused", "failed", "cost_nano_usd")
)


@dataclass(frozen=True, slots=True)
class Totals:
    requests: int
    refused: int
    failed: int
    cost_usd: str


def _totals(row: dict[str, Any], prefix: str) -> Totals:
    return Totals(
        requests=int(row[f"{prefix}requests"]),
        refused=int(row[f"{prefix}refused"]),
        failed=int(row[f"{prefix}failed"]),
        cost_usd=nanos_to_usd(int(row[f"{prefix}cost_nano_usd"])),
    )


def _summed(rows: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
    """`rows` added up by `column`, most spent first."""
    sums: dict[str, dict[str, Any]] = {}
    for row in rows:
        into = sums.setdefault(row[column], {column: row[column], **dict.fromkeys(MEASURES, 0)})
        for measure in MEASURES:
            into[measure] += int(row[measure])
    return sorted(sums.values(), key=lambda r: (-r["month_cost_nano_usd"], r[column]))


@get("/")
async def overview(request: Request[Any, Any, Any]) -> Template:
    view = await open_page(request)
    now = view.vk.clock.now()
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    month = day.replace(day=1)
    scope = view.actor.organization_id
    failed = "The spend ledger cannot be read right now; figures are missing."

    async def read_sums() -> list[dict[str, Any]] | None:
        try:
            # One more key than shown: the requests of no key ('') may rank among them.
            return await view.vk.ledger.overview(
                None if scope is None else [scope], month, day, TOP + 1
            )
        except Exception as exc:  # the rest of the page still helps while the ledger is away
            log.warning("console overview: ledger read failed: %s", type(exc).__name__)
            return None

    async def read_nearest() -> list[_budgets.BudgetStatus] | None:
        async with view.vk.read() as tx:
            budgets = list(
                await tx.session.scalars(
                    tx.scoped(select(Budget)).order_by(Budget.id).limit(BUDGETS_READ)
                )
            )
        if not budgets:
            return []
        try:
            found = await _budgets.statuses(view.vk.ledger, budgets, now)
        except Exception as exc:
            log.warning("console overview: budget read failed: %s", type(exc).__name__)
            return None
        return sorted((s for s in found if not s.per_end_user), key=lambda s: -s.fraction)[:TOP]

    # Independent reads at once: the budgets' rows come from the database while the ledger
    # sums the month (the ledger's two reads still take its one connection in turn).
    read, weighed = await asyncio.gather(read_sums(), read_nearest())
    sums = read or []
    nearest = weighed or []
    ledger_error = failed if read is None or weighed is None else None
    # Every ledger row has one model value (maybe ''): an organization's totals are its models'.
    models = [r for r in sums if r["dimension"] == "model"]
    by_org = _summed(models, "organization_id")[:ORGANIZATIONS_SHOWN]
    keys = [r for r in sums if r["dimension"] == "virtual_key" and r["value"]]
    top_keys = _summed(keys, "value")[:TOP]
    top_models = _summed([r for r in models if r["value"]], "value")[:TOP]
    async with view.vk.read() as tx:
        org_ids = {r["organization_id"] for r in by_org} | ({scope} if scope else set())
        orgs = await tx.session.execute(
            tx.scoped(select(Organization)).where(Organization.id.in_(org_ids))
        )
        org_names = {o.id: o.name for o in orgs.scalars()}
        key_rows = await tx.session.scalars(
            tx.scoped(select(VirtualKey)).where(VirtualKey.id.in_([r["value"] for r in top_keys]))
        )
        key_names = {k.id: k.name for k in key_rows}
    organizations = [
        {
            "id": r["organization_id"],
            "name": org_names.get(r["organization_id"], r["organization_id"]),
            "today": _totals(r, "today_"),
            "month": _totals(r, "month_"),
        }
        for r in by_org
        if r["organization_id"] in org_names
    ]
    return view.render(
        "overview.html",
        "overview",
        heading="Overview",
        now=now,
        month=month,
        organizations=organizations,
        top_keys=[
            {"id": r["value"], "name": key_names.get(r["value"], ""), "month": _totals(r, "month_")}
            for r in top_keys
        ],
        top_models=[{"model": r["value"], "month": _totals(r, "month_")} for r in top_models],
        nearest=nearest,
        error=ledger_error,
    )


HANDLERS = [overview]
