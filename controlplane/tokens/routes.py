"""Admin routes for admin tokens and for reading the audit log."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.params import FromPath, FromQuery, JSONBody
from litestar.status_codes import HTTP_200_OK
from sqlalchemy import select

from controlplane.auth import UNBOUND_ONLY, Role
from controlplane.models import AdminToken, AuditEntry
from controlplane.schemas import Ident, Name, Page, Vk, actor_id, filtered, page
from controlplane.tokens import service
from vkgate.clock import rfc3339


class TokenCreate(msgspec.Struct, forbid_unknown_fields=True):
    name: Name
    role: Role
    organization_id: Ident | None = None
    """Set, the token sees and changes only this organization's resources, and cannot create
    organizations or manage admin tokens."""


class TokenRead(msgspec.Struct, kw_only=True):
    id: str
    name: str
    role: str
    organization_id: str | None
    prefix: str
    created_at: str
    revoked_at: str | None


class TokenWithSecret(TokenRead, kw_only=True):
    token: str


class AuditRead(msgspec.Struct):
    id: int
    at: str
    actor: str
    action: str
    resource_kind: str
    resource_id: str
    organization_id: str | None
    details: dict[str, Any]


def audit_read(row: AuditEntry) -> AuditRead:
    return AuditRead(
        id=row.id,
        at=rfc3339(row.at),
        actor=row.actor,
        action=row.action,
        resource_kind=row.resource_kind,
        resource_id=row.resource_id,
        organization_id=row.organization_id,
        details=row.details,
    )


def token_read(row: AdminToken) -> TokenRead:
    return TokenRead(
        id=row.id,
        name=row.name,
        role=row.role,
        organization_id=row.organization_id,
        prefix=row.prefix,
        created_at=rfc3339(row.created_at),
        revoked_at=rfc3339(row.revoked_at) if row.revoked_at else None,
    )


class AdminTokenController(Controller):
    path = "/api/admin/tokens"
    tags = ["admin tokens"]
    opt = {"role": "admin", UNBOUND_ONLY: True}

    @post("/")
    async def create(
        self, data: JSONBody[TokenCreate], vk: Vk, request: Request[Any, Any, Any]
    ) -> TokenWithSecret:
        async with vk.write(actor_id(request)) as tx:
            row, token = await service.create(tx, vk.hasher, data)
        return TokenWithSecret(**msgspec.structs.asdict(token_read(row)), token=token)

    @get("/")
    async def list_all(
        self, vk: Vk, limit: FromQuery[int | None] = None, cursor: FromQuery[str | None] = None
    ) -> Page[TokenRead]:
        async with vk.read() as tx:
            rows, next_cursor = await page(
                tx, select(AdminToken), AdminToken.id, limit=limit, cursor=cursor
            )
        return Page([token_read(r) for r in rows], next_cursor)

    @post("/{token_id:str}/revoke", status_code=HTTP_200_OK)
    async def revoke(
        self, token_id: FromPath[str], vk: Vk, request: Request[Any, Any, Any]
    ) -> TokenRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.revoke(tx, token_id)
        return token_read(row)


@get("/api/admin/audit-log", tags=["audit log"])
async def audit_log(
    vk: Vk,
    organization_id: FromQuery[str | None] = None,
    resource_id: FromQuery[str | None] = None,
    limit: FromQuery[int | None] = None,
    cursor: FromQuery[str | None] = None,
) -> Page[AuditRead]:
    """Oldest first; `next_cursor` continues after the last entry shown. A token bound to an
    organization sees that organization's entries only."""
    query = filtered(
        select(AuditEntry),
        {AuditEntry.organization_id: organization_id, AuditEntry.resource_id: resource_id},
    )
    async with vk.read() as tx:
        rows, next_cursor = await page(
            tx, query, AuditEntry.id, limit=limit, cursor=cursor, numeric=True
        )
    return Page([audit_read(r) for r in rows], next_cursor)
