"""Admin routes for budgets."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, delete, get, patch, post
from litestar.params import FromPath, FromQuery, JSONBody
from sqlalchemy import select

from controlplane.budgets import service
from controlplane.budgets.schemas import (
    BudgetCreate,
    BudgetRead,
    BudgetScope,
    BudgetUpdate,
    ScopeKind,
)
from controlplane.models import Budget
from controlplane.schemas import Page, Vk, actor_id, filtered, page
from vkgate.clock import rfc3339
from vkgate.money import nanos_to_usd


def budget_read(row: Budget) -> BudgetRead:
    return BudgetRead(
        id=row.id,
        organization_id=row.organization_id,
        name=row.name,
        scope=BudgetScope(kind=ScopeKind(row.scope_kind), id=row.scope_id),
        window=row.window,
        limit_usd=nanos_to_usd(row.limit_nano_usd),
        provider_id=row.provider_id,
        on_breach=row.on_breach,
        created_at=rfc3339(row.created_at),
        updated_at=rfc3339(row.updated_at),
    )


class BudgetController(Controller):
    path = "/api/admin/budgets"
    tags = ["budgets"]

    @post("/")
    async def create(
        self, data: JSONBody[BudgetCreate], vk: Vk, request: Request[Any, Any, Any]
    ) -> BudgetRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.create(tx, data)
        return budget_read(row)

    @get("/")
    async def list_all(
        self,
        vk: Vk,
        organization_id: FromQuery[str | None] = None,
        limit: FromQuery[int | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> Page[BudgetRead]:
        query = filtered(select(Budget), {Budget.organization_id: organization_id})
        async with vk.read() as tx:
            rows, next_cursor = await page(tx, query, Budget.id, limit=limit, cursor=cursor)
        return Page([budget_read(r) for r in rows], next_cursor)

    @get("/{budget_id:str}")
    async def get_one(self, budget_id: FromPath[str], vk: Vk) -> BudgetRead:
        async with vk.read() as tx:
            row = await tx.get(Budget, budget_id, "budget")
        return budget_read(row)

    @patch("/{budget_id:str}")
    async def update(
        self,
        budget_id: FromPath[str],
        data: JSONBody[BudgetUpdate],
        vk: Vk,
        request: Request[Any, Any, Any],
    ) -> BudgetRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.update(tx, budget_id, data)
        return budget_read(row)

    @delete("/{budget_id:str}")
    async def remove(
        self, budget_id: FromPath[str], vk: Vk, request: Request[Any, Any, Any]
    ) -> None:
        async with vk.write(actor_id(request)) as tx:
            await service.delete(tx, budget_id)
