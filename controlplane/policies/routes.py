"""Admin routes for routing policies."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, delete, get, patch, post
from litestar.params import FromPath, FromQuery, JSONBody
from sqlalchemy import select

from controlplane.models import RoutingPolicy
from controlplane.policies import service
from controlplane.policies.schemas import PolicyCreate, PolicyRead, PolicyUpdate
from controlplane.schemas import Page, Vk, actor_id, filtered, page
from controlplane.state import Tx
from vkgate.clock import rfc3339


async def policy_read(tx: Tx, row: RoutingPolicy) -> PolicyRead:
    return PolicyRead(
        id=row.id,
        organization_id=row.organization_id,
        name=row.name,
        aliases=await service.aliases_of(tx, row.id),
        rules=service.rules_of(row),
        created_at=rfc3339(row.created_at),
        updated_at=rfc3339(row.updated_at),
    )


class RoutingPolicyController(Controller):
    path = "/api/admin/routing-policies"
    tags = ["routing policies"]

    @post("/")
    async def create(
        self, data: JSONBody[PolicyCreate], vk: Vk, request: Request[Any, Any, Any]
    ) -> PolicyRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.create(tx, data)
            await tx.session.flush()
            return await policy_read(tx, row)

    @get("/")
    async def list_all(
        self,
        vk: Vk,
        organization_id: FromQuery[str | None] = None,
        limit: FromQuery[int | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> Page[PolicyRead]:
        query = filtered(select(RoutingPolicy), {RoutingPolicy.organization_id: organization_id})
        async with vk.read() as tx:
            rows, next_cursor = await page(tx, query, RoutingPolicy.id, limit=limit, cursor=cursor)
            return Page([await policy_read(tx, r) for r in rows], next_cursor)

    @get("/{policy_id:str}")
    async def get_one(self, policy_id: FromPath[str], vk: Vk) -> PolicyRead:
        async with vk.read() as tx:
            row = await tx.get(RoutingPolicy, policy_id, "routing policy")
            return await policy_read(tx, row)

    @patch("/{policy_id:str}")
    async def update(
        self,
        policy_id: FromPath[str],
        data: JSONBody[PolicyUpdate],
        vk: Vk,
        request: Request[Any, Any, Any],
    ) -> PolicyRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.update_policy(tx, policy_id, data)
            await tx.session.flush()
            return await policy_read(tx, row)

    @delete("/{policy_id:str}")
    async def remove(
        self, policy_id: FromPath[str], vk: Vk, request: Request[Any, Any, Any]
    ) -> None:
        async with vk.write(actor_id(request)) as tx:
            await service.delete_policy(tx, policy_id)
