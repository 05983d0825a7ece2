"""The harness itself: both backends migrate and serve a first admin call."""

from __future__ import annotations

from litestar import Litestar
from litestar.testing import AsyncTestClient

from tests.conftest import ADMIN, Internal, World


async def test_organization_round_trips(client: AsyncTestClient[Litestar]) -> None:
    created = await client.post("/api/admin/organizations", json={"name": "acme"}, headers=ADMIN)
    assert created.status_code == 201
    fetched = await client.get(f"/api/admin/organizations/{created.json()['id']}", headers=ADMIN)
    assert fetched.json()["name"] == "acme"


async def test_world_key_resolves(world: World, internal: Internal) -> None:
    from vkgate.keys import key_sha256

    response = await internal.call(
        "POST", "/api/internal/gateway/resolve-key", {"key_sha256": key_sha256(world.key)}
    )
    assert response.status_code == 200, response.text
    assert response.json()["vk_id"] == world.key_id
