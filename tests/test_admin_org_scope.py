"""Admin tokens bound to one organization: creating them, and what they may do inside it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import World
from tests.support.api import ADMIN, create, error_of

Client = httpx.AsyncClient
TOKENS = "/api/admin/tokens"
AUDIT = "/api/admin/audit-log"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def bound_token(client: Client, org: str, role: str = "admin") -> dict[str, Any]:
    return await create(
        client, TOKENS, {"name": f"{role}-{org}", "role": role, "organization_id": org}
    )


async def test_a_bound_token_shows_its_organization_in_every_read(
    client: Client, world: World
) -> None:
    token = await bound_token(client, world.org)
    assert token["organization_id"] == world.org
    assert token["role"] == "admin" and token["token"].startswith("vka-")
    unbound = await create(client, TOKENS, {"name": "everything", "role": "finance"})
    assert unbound["organization_id"] is None

    listed = (await client.get(TOKENS, headers=ADMIN)).json()["data"]
    assert {t["id"]: t["organization_id"] for t in listed} == {
        token["id"]: world.org,
        unbound["id"]: None,
    }


async def test_a_token_for_an_unknown_organization_is_refused_naming_the_field(
    client: Client,
) -> None:
    response = await client.post(
        TOKENS,
        json={"name": "ghost", "role": "admin", "organization_id": "org_missing"},
        headers=ADMIN,
    )
    error = error_of(response, 404, "not_found", param="organization_id")
    assert "org_missing" in error["message"]
    for bad in ("", 7):
        response = await client.post(
            TOKENS, json={"name": "ghost", "role": "admin", "organization_id": bad}, headers=ADMIN
        )
        error_of(response, 422, "validation_error", param="organization_id")
    assert (await client.get(TOKENS, headers=ADMIN)).json()["data"] == []


async def test_a_bound_admin_token_manages_its_own_organization_and_is_audited_by_id(
    client: Client, world: World
) -> None:
    token = await bound_token(client, world.org)
    headers = bearer(token["token"])
    team = await create(
        client, "/api/admin/teams", {"organization_id": world.org, "name": "ops"}, headers
    )
    project = await create(
        client,
        "/api/admin/projects",
        {"organization_id": world.org, "team_id": team["id"], "name": "bots"},
        headers,
    )
    key = await create(
        client,
        "/api/admin/virtual-keys",
        {"project_id": project["id"], "name": "bot", "routing_policy_id": world.policy},
        headers,
    )
    budget = await create(
        client,
        "/api/admin/budgets",
        {
            "organization_id": world.org,
            "scope": {"kind": "team", "id": team["id"]},
            "window": "day",
            "limit_usd": "5",
            "provider_id": world.provider,
        },
        headers,
    )
    rotated = await client.post(f"/api/admin/virtual-keys/{key['id']}/rotate", headers=headers)
    assert rotated.status_code == 200
    patched = await client.patch(
        f"/api/admin/providers/{world.provider}", json={"name": "renamed"}, headers=headers
    )
    assert patched.status_code == 200
    assert (
        await client.delete(f"/api/admin/budgets/{budget['id']}", headers=headers)
    ).status_code == 204
    own = await client.get(f"/api/admin/organizations/{world.org}", headers=headers)
    assert own.status_code == 200 and own.json()["id"] == world.org

    entries = (await client.get(AUDIT, params={"limit": "1000"}, headers=headers)).json()["data"]
    mine = [(e["action"], e["resource_id"]) for e in entries if e["actor"] == token["id"]]
    assert mine == [
        ("team.create", team["id"]),
        ("project.create", project["id"]),
        ("virtual_key.create", key["id"]),
        ("budget.create", budget["id"]),
        ("virtual_key.rotate", key["id"]),
        ("provider.update", world.provider),
        ("budget.delete", budget["id"]),
    ]
    # Its own creation is an entry of its organization, so the organization sees it too.
    assert ("admin_token.create", token["id"]) in [(e["action"], e["resource_id"]) for e in entries]
    assert {e["organization_id"] for e in entries} == {world.org}


async def test_a_bound_finance_token_reads_its_organization_and_changes_nothing(
    client: Client, world: World
) -> None:
    token = await bound_token(client, world.org, role="finance")
    headers = bearer(token["token"])
    read = await client.get(f"/api/admin/virtual-keys/{world.key_id}", headers=headers)
    assert read.status_code == 200 and read.json()["id"] == world.key_id
    report = await client.get("/api/spend/report", headers=headers)
    assert report.status_code == 200, report.text
    refused = await client.post(
        "/api/admin/teams", json={"organization_id": world.org, "name": "x"}, headers=headers
    )
    error_of(refused, 403, "forbidden")


async def test_a_revoked_bound_token_is_unauthorized(client: Client, world: World) -> None:
    token = await bound_token(client, world.org)
    revoked = await client.post(f"{TOKENS}/{token['id']}/revoke", headers=ADMIN)
    assert revoked.status_code == 200 and revoked.json()["organization_id"] == world.org
    error_of(
        await client.get("/api/admin/teams", headers=bearer(token["token"])), 401, "unauthorized"
    )
    entries = (await client.get(AUDIT, params={"resource_id": token["id"]}, headers=ADMIN)).json()
    assert [(e["action"], e["organization_id"]) for e in entries["data"]] == [
        ("admin_token.create", world.org),
        ("admin_token.revoke", world.org),
    ]


@pytest.mark.parametrize("role", ["admin", "finance"])
async def test_a_bound_token_lists_only_its_own_organization(
    client: Client, world: World, role: str
) -> None:
    other = await create(client, "/api/admin/organizations", {"name": "globex"})
    token = await bound_token(client, world.org, role)
    listed = await client.get("/api/admin/organizations", headers=bearer(token["token"]))
    assert [o["id"] for o in listed.json()["data"]] == [world.org]
    missing = await client.get(
        f"/api/admin/organizations/{other['id']}", headers=bearer(token["token"])
    )
    error_of(missing, 404, "not_found", param=None)
    everything = await client.get("/api/admin/organizations", headers=ADMIN)
    assert {o["id"] for o in everything.json()["data"]} == {world.org, other["id"]}
