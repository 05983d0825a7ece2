"""Admin routes for providers."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, delete, get, patch, post
from litestar.params import FromPath, FromQuery, JSONBody
from sqlalchemy import select

from controlplane.models import Provider
from controlplane.providers import cloud, service
from controlplane.providers.schemas import (
    PriceOverride,
    ProviderCreate,
    ProviderRead,
    ProviderUpdate,
)
from controlplane.schemas import Page, Vk, actor_id, filtered, page
from vkgate.clock import rfc3339


def provider_read(row: Provider) -> ProviderRead:
    return ProviderRead(
        id=row.id,
        organization_id=row.organization_id,
        name=row.name,
        kind=row.kind,
        base_url=row.base_url,
        api_version=row.api_version,
        has_api_key=row.api_key_encrypted is not None,
        header_names=list(row.header_names),
        price_overrides=msgspec.convert(row.price_overrides, dict[str, PriceOverride]),
        responses_api=row.responses_api,
        created_at=rfc3339(row.created_at),
        updated_at=rfc3339(row.updated_at),
        region=row.settings.get("region"),
        project=row.settings.get("project"),
        location=row.settings.get("location"),
        cloud_credentials=cloud.stored_or_workload(row),
    )


class ProviderController(Controller):
    path = "/api/admin/providers"
    tags = ["providers"]

    @post("/")
    async def create(
        self, data: JSONBody[ProviderCreate], vk: Vk, request: Request[Any, Any, Any]
    ) -> ProviderRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.create(tx, vk.cipher, data)
        return provider_read(row)

    @get("/")
    async def list_all(
        self,
        vk: Vk,
        organization_id: FromQuery[str | None] = None,
        limit: FromQuery[int | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> Page[ProviderRead]:
        query = filtered(select(Provider), {Provider.organization_id: organization_id})
        async with vk.read() as tx:
            rows, next_cursor = await page(tx, query, Provider.id, limit=limit, cursor=cursor)
        return Page([provider_read(r) for r in rows], next_cursor)

    @get("/{provider_id:str}")
    async def get_one(self, provider_id: FromPath[str], vk: Vk) -> ProviderRead:
        async with vk.read() as tx:
            row = await tx.get(Provider, provider_id, "provider")
        return provider_read(row)

    @patch("/{provider_id:str}")
    async def update(
        self,
        provider_id: FromPath[str],
        data: JSONBody[ProviderUpdate],
        vk: Vk,
        request: Request[Any, Any, Any],
    ) -> ProviderRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.update(tx, vk.cipher, provider_id, data)
        return provider_read(row)

    @delete("/{provider_id:str}")
    async def remove(
        self, provider_id: FromPath[str], vk: Vk, request: Request[Any, Any, Any]
    ) -> None:
        async with vk.write(actor_id(request)) as tx:
            await service.delete(tx, provider_id)
