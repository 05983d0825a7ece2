"""Admin routes for cache rules."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, delete, get, patch, post
from litestar.params import FromPath, FromQuery, JSONBody
from sqlalchemy import select

from controlplane.cache_rules import service
from controlplane.cache_rules.schemas import (
    CacheRuleCreate,
    CacheRuleRead,
    CacheRuleUpdate,
    CacheScope,
    CacheScopeKind,
)
from controlplane.models import CacheRule
from controlplane.schemas import Page, Vk, actor_id, filtered, page
from vkgate.clock import rfc3339


def cache_rule_read(row: CacheRule) -> CacheRuleRead:
    return CacheRuleRead(
        id=row.id,
        organization_id=row.organization_id,
        name=row.name,
        scope=CacheScope(kind=CacheScopeKind(row.scope_kind), id=row.scope_id),
        models=list(row.models),
        ttl_seconds=row.ttl_seconds,
        enabled=row.enabled,
        created_at=rfc3339(row.created_at),
        updated_at=rfc3339(row.updated_at),
    )


class CacheRuleController(Controller):
    path = "/api/admin/cache-rules"
    tags = ["cache rules"]

    @post("/")
    async def create(
        self, data: JSONBody[CacheRuleCreate], vk: Vk, request: Request[Any, Any, Any]
    ) -> CacheRuleRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.create(tx, data)
        return cache_rule_read(row)

    @get("/")
    async def list_all(
        self,
        vk: Vk,
        organization_id: FromQuery[str | None] = None,
        limit: FromQuery[int | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> Page[CacheRuleRead]:
        query = filtered(select(CacheRule), {CacheRule.organization_id: organization_id})
        async with vk.read() as tx:
            rows, next_cursor = await page(tx, query, CacheRule.id, limit=limit, cursor=cursor)
        return Page([cache_rule_read(r) for r in rows], next_cursor)

    @get("/{rule_id:str}")
    async def get_one(self, rule_id: FromPath[str], vk: Vk) -> CacheRuleRead:
        async with vk.read() as tx:
            row = await tx.get(CacheRule, rule_id, "cache rule")
        return cache_rule_read(row)

    @patch("/{rule_id:str}")
    async def update(
        self,
        rule_id: FromPath[str],
        data: JSONBody[CacheRuleUpdate],
        vk: Vk,
        request: Request[Any, Any, Any],
    ) -> CacheRuleRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.update(tx, rule_id, data)
        return cache_rule_read(row)

    @delete("/{rule_id:str}")
    async def remove(self, rule_id: FromPath[str], vk: Vk, request: Request[Any, Any, Any]) -> None:
        async with vk.write(actor_id(request)) as tx:
            await service.delete(tx, rule_id)
