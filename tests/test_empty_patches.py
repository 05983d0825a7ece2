"""A PATCH that names no field answers the resource and records nothing."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import Internal, World
from tests.support.api import ADMIN, create


@pytest.mark.parametrize(
    "resource", ["teams", "providers", "routing-policies", "budgets", "virtual-keys"]
)
async def test_empty_patch_appends_no_event_and_no_audit_row(
    client: httpx.AsyncClient, internal: Internal, world: World, resource: str
) -> None:
    budget = await create(
        client,
        "/api/admin/budgets",
        {
            "organization_id": world.org,
            "scope": {"kind": "organization"},
            "window": "day",
            "limit_usd": "5",
        },
    )
    ids = {
        "teams": world.team,
        "providers": world.provider,
        "routing-policies": world.policy,
        "budgets": budget["id"],
        "virtual-keys": world.key_id,
    }
    revision = await internal.revision()
    audit_before = (await client.get("/api/admin/audit-log", headers=ADMIN)).json()["data"]
    response = await client.patch(f"/api/admin/{resource}/{ids[resource]}", json={}, headers=ADMIN)
    assert response.status_code == 200, response.text
    assert response.json()["id"] == ids[resource]
    assert await internal.revision() == revision
    assert (await client.get("/api/admin/audit-log", headers=ADMIN)).json()["data"] == audit_before
