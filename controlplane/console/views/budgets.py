"""Budgets: limit, spent this window, what is left, and a burn-down with the date the limit is
reached at the current pace."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, get, post
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template
from sqlalchemy import select

from controlplane.budgets import service
from controlplane.budgets.schemas import BudgetCreate, BudgetUpdate, OnBreach, ScopeKind, Window
from controlplane.console import _budgets, _charts, _choices
from controlplane.console._core import convert, open_form, open_page, redirect
from controlplane.models import Budget
from controlplane.schemas import filtered, page
from vkgate.money import nanos_to_usd

log = logging.getLogger("vkgate.controlplane.console")
LEDGER_DOWN = "The spend ledger cannot be read right now; spend figures are missing."


@get("/budgets")
async def budgets(
    request: Request[Any, Any, Any],
    organization_id: FromQuery[str | None] = None,
    cursor: FromQuery[str | None] = None,
) -> Template:
    view = await open_page(request)
    query = filtered(select(Budget), {Budget.organization_id: organization_id or None})
    async with view.vk.read() as tx:
        rows, next_cursor = await page(tx, query, Budget.id, limit=50, cursor=cursor)
        orgs = await _choices.organizations(tx)
        provider_rows = await _choices.providers(tx)
    error = None
    now = view.vk.clock.now()
    try:
        found = await _budgets.statuses(view.vk.ledger, list(rows), now)
    except Exception as exc:
        log.warning("console budgets: ledger read failed: %s", type(exc).__name__)
        found = [_budgets.BudgetStatus(b, None, None, None) for b in rows]
        error = LEDGER_DOWN
    return view.render(
        "budgets.html",
        "budgets",
        heading="Budgets",
        rows=found,
        next_cursor=next_cursor,
        organizations=orgs,
        org_names=_choices.names(orgs),
        providers=provider_rows,
        scope_kinds=[k.value for k in ScopeKind],
        windows=[w.value for w in Window],
        breaches=[b.value for b in OnBreach],
        chosen_org=organization_id or "",
        error=error,
    )


@post("/budgets")
async def create_budget(request: Request[Any, Any, Any]) -> Redirect:
    view, form = await open_form(request)
    data = convert(
        {
            "organization_id": form.text("organization_id"),
            "name": form.text("name"),
            "scope": {"kind": form.text("scope_kind"), "id": form.text("scope_id")},
            "window": form.text("window"),
            "limit_usd": form.text("limit_usd"),
            "provider_id": form.text("provider_id"),
            "on_breach": form.text("on_breach") or OnBreach.BLOCK.value,
        },
        BudgetCreate,
    )
    async with view.vk.write(view.actor.id) as tx:
        row = await service.create(tx, data)
    return redirect(f"/budgets/{row.id}")


@get("/budgets/{budget_id:str}")
async def budget(request: Request[Any, Any, Any], budget_id: FromPath[str]) -> Template:
    view = await open_page(request)
    async with view.vk.read() as tx:
        row = await tx.get(Budget, budget_id, "budget")
    now = view.vk.clock.now()
    chart = forecast = None
    status = _budgets.BudgetStatus(row, None, None, None)
    error = None
    try:
        status = (await _budgets.statuses(view.vk.ledger, [row], now))[0]
        if not status.per_end_user:
            burn = await _budgets.burn_down(view.vk.ledger, status, now)
            reach_index = None
            if burn.reach_at is not None and burn.days:
                reach_index = (burn.reach_at - burn.days[0]).total_seconds() / 86400 - 1
            chart = _charts.burn_down(
                f"Burn-down of {row.name or row.id}: spend to date against the limit",
                burn.days,
                burn.cumulative,
                row.limit_nano_usd,
                reach_index,
            )
            forecast = {
                "reached": burn.reached,
                "reach_at": burn.reach_at,
                "pace_usd": nanos_to_usd(burn.pace_nano_per_day),
            }
    except Exception as exc:
        log.warning("console budget: ledger read failed: %s", type(exc).__name__)
        error = LEDGER_DOWN
    return view.render(
        "budget.html",
        "budgets",
        heading=f"Budget {row.name or row.id}",
        status=status,
        chart=chart,
        forecast=forecast,
        now=now,
        error=error,
    )


@post("/budgets/{budget_id:str}")
async def update_budget(request: Request[Any, Any, Any], budget_id: FromPath[str]) -> Redirect:
    view, form = await open_form(request)
    data = convert({"limit_usd": form.text("limit_usd")}, BudgetUpdate)
    async with view.vk.write(view.actor.id) as tx:
        await service.update(tx, budget_id, data)
    return redirect(f"/budgets/{budget_id}")


HANDLERS = [budgets, create_budget, budget, update_budget]
