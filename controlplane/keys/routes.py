"""Admin routes for virtual keys."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec
from litestar import Controller, Request, get, patch, post
from litestar.params import FromPath, FromQuery, JSONBody
from litestar.status_codes import HTTP_200_OK
from sqlalchemy import select

from controlplane.keys import service
from controlplane.keys.schemas import (
    KeyCreate,
    KeyLimits,
    KeyRead,
    KeyRotate,
    KeyUpdate,
    KeyWithSecret,
)
from controlplane.keys.service import KeyStatus
from controlplane.models import Project, VirtualKey, VirtualKeySecret
from controlplane.schemas import (
    Page,
    Vk,
    actor_id,
    check_limits_are_integers,
    filtered,
    page,
)
from controlplane.state import Tx
from vkgate.clock import rfc3339


async def key_reads(tx: Tx, rows: list[VirtualKey]) -> list[KeyRead]:
    ids = [r.id for r in rows]
    prefixes: dict[str, str] = {}
    secrets = await tx.session.scalars(
        select(VirtualKeySecret)
        .where(VirtualKeySecret.vk_id.in_(ids))
        .order_by(VirtualKeySecret.id)
    )
    for secret in secrets:
        prefixes[secret.vk_id] = secret.prefix  # the newest secret wins
    result = await tx.session.execute(
        select(Project.id, Project.team_id).where(Project.id.in_({r.project_id for r in rows}))
    )
    teams = {project_id: team_id for project_id, team_id in result}
    return [
        KeyRead(
            id=r.id,
            name=r.name,
            prefix=prefixes.get(r.id, ""),
            organization_id=r.organization_id,
            team_id=teams.get(r.project_id),
            project_id=r.project_id,
            routing_policy_id=r.routing_policy_id,
            allowed_models=r.allowed_models,
            limits=msgspec.convert(r.limits, KeyLimits),
            metadata=dict(r.metadata_),
            status=r.status,
            expires_at=rfc3339(r.expires_at) if r.expires_at else None,
            revision=r.revision,
            created_at=rfc3339(r.created_at),
            updated_at=rfc3339(r.updated_at),
        )
        for r in rows
    ]


async def key_read(tx: Tx, row: VirtualKey) -> KeyRead:
    return (await key_reads(tx, [row]))[0]


async def with_secret(
    tx: Tx, row: VirtualKey, key: str, previous_valid_until: datetime | None = None
) -> KeyWithSecret:
    await tx.session.flush()
    read = await key_read(tx, row)
    return KeyWithSecret(
        **msgspec.structs.asdict(read),
        key=key,
        previous_key_valid_until=rfc3339(previous_valid_until) if previous_valid_until else None,
    )


class VirtualKeyController(Controller):
    path = "/api/admin/virtual-keys"
    tags = ["virtual keys"]

    @post("/")
    async def create(
        self, data: JSONBody[KeyCreate], vk: Vk, request: Request[Any, Any, Any]
    ) -> KeyWithSecret:
        check_limits_are_integers(await request.json())
        async with vk.write(actor_id(request)) as tx:
            row, key = await service.create(tx, vk.hasher, data)
            return await with_secret(tx, row, key)

    @get("/")
    async def list_all(
        self,
        vk: Vk,
        organization_id: FromQuery[str | None] = None,
        project_id: FromQuery[str | None] = None,
        status: FromQuery[KeyStatus | None] = None,
        limit: FromQuery[int | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> Page[KeyRead]:
        query = filtered(
            select(VirtualKey),
            {
                VirtualKey.organization_id: organization_id,
                VirtualKey.project_id: project_id,
                VirtualKey.status: status,
            },
        )
        async with vk.read() as tx:
            rows, next_cursor = await page(tx, query, VirtualKey.id, limit=limit, cursor=cursor)
            return Page(await key_reads(tx, list(rows)), next_cursor)

    @get("/{vk_id:str}")
    async def get_one(self, vk_id: FromPath[str], vk: Vk) -> KeyRead:
        async with vk.read() as tx:
            return await key_read(tx, await tx.get(VirtualKey, vk_id, "virtual key"))

    @patch("/{vk_id:str}")
    async def update(
        self,
        vk_id: FromPath[str],
        data: JSONBody[KeyUpdate],
        vk: Vk,
        request: Request[Any, Any, Any],
    ) -> KeyRead:
        check_limits_are_integers(await request.json())
        async with vk.write(actor_id(request)) as tx:
            row = await service.update(tx, vk_id, data)
            await tx.session.flush()
            return await key_read(tx, row)

    @post("/{vk_id:str}/rotate", status_code=HTTP_200_OK)
    async def rotate(
        self,
        vk_id: FromPath[str],
        vk: Vk,
        request: Request[Any, Any, Any],
        data: JSONBody[KeyRotate | None] = None,
    ) -> KeyWithSecret:
        grace = (data or KeyRotate()).grace_seconds
        async with vk.write(actor_id(request)) as tx:
            row, key, valid_until = await service.rotate(tx, vk.hasher, vk_id, grace_seconds=grace)
            return await with_secret(tx, row, key, valid_until)

    @post("/{vk_id:str}/revoke", status_code=HTTP_200_OK)
    async def revoke(
        self, vk_id: FromPath[str], vk: Vk, request: Request[Any, Any, Any]
    ) -> KeyRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.revoke(tx, vk_id)
            await tx.session.flush()
            return await key_read(tx, row)

    @post("/{vk_id:str}/disable", status_code=HTTP_200_OK)
    async def disable(
        self, vk_id: FromPath[str], vk: Vk, request: Request[Any, Any, Any]
    ) -> KeyRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.set_enabled(tx, vk_id, enabled=False)
            await tx.session.flush()
            return await key_read(tx, row)

    @post("/{vk_id:str}/enable", status_code=HTTP_200_OK)
    async def enable(
        self, vk_id: FromPath[str], vk: Vk, request: Request[Any, Any, Any]
    ) -> KeyRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.set_enabled(tx, vk_id, enabled=True)
            await tx.session.flush()
            return await key_read(tx, row)
