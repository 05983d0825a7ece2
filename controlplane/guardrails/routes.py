"""Admin routes for guardrails."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, delete, get, patch, post
from litestar.params import FromPath, FromQuery, JSONBody
from sqlalchemy import select

from controlplane.guardrails import service
from controlplane.guardrails.schemas import (
    GuardrailCreate,
    GuardrailRead,
    GuardrailScope,
    GuardrailUpdate,
    ScopeKind,
)
from controlplane.models import Guardrail
from controlplane.schemas import Page, Vk, actor_id, filtered, page
from vkgate.clock import rfc3339


def guardrail_read(row: Guardrail) -> GuardrailRead:
    return GuardrailRead(
        id=row.id,
        organization_id=row.organization_id,
        name=row.name,
        scope=GuardrailScope(kind=ScopeKind(row.scope_kind), id=row.scope_id),
        stage=row.stage,
        kind=row.kind,
        config=row.config,
        action=row.action,
        on_error=row.on_error,
        timeout_ms=row.timeout_ms,
        enabled=row.enabled,
        has_secret=row.secret_encrypted is not None,
        created_at=rfc3339(row.created_at),
        updated_at=rfc3339(row.updated_at),
    )


class GuardrailController(Controller):
    path = "/api/admin/guardrails"
    tags = ["guardrails"]

    @post("/")
    async def create(
        self, data: JSONBody[GuardrailCreate], vk: Vk, request: Request[Any, Any, Any]
    ) -> GuardrailRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.create(tx, vk.cipher, data)
        return guardrail_read(row)

    @get("/")
    async def list_all(
        self,
        vk: Vk,
        organization_id: FromQuery[str | None] = None,
        limit: FromQuery[int | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> Page[GuardrailRead]:
        query = filtered(select(Guardrail), {Guardrail.organization_id: organization_id})
        async with vk.read() as tx:
            rows, next_cursor = await page(tx, query, Guardrail.id, limit=limit, cursor=cursor)
        return Page([guardrail_read(r) for r in rows], next_cursor)

    @get("/{guardrail_id:str}")
    async def get_one(self, guardrail_id: FromPath[str], vk: Vk) -> GuardrailRead:
        async with vk.read() as tx:
            row = await tx.get(Guardrail, guardrail_id, "guardrail")
        return guardrail_read(row)

    @patch("/{guardrail_id:str}")
    async def update(
        self,
        guardrail_id: FromPath[str],
        data: JSONBody[GuardrailUpdate],
        vk: Vk,
        request: Request[Any, Any, Any],
    ) -> GuardrailRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.update(tx, vk.cipher, guardrail_id, data)
        return guardrail_read(row)

    @delete("/{guardrail_id:str}")
    async def remove(
        self, guardrail_id: FromPath[str], vk: Vk, request: Request[Any, Any, Any]
    ) -> None:
        async with vk.write(actor_id(request)) as tx:
            await service.delete(tx, guardrail_id)
