"""Admin API: routing policies, whose aliases name ordered chains of the organization's providers."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import Internal, World
from tests.support.api import ADMIN, create, error_of, walk_pages
from tests.support.clock import ManualClock

Client = httpx.AsyncClient
POLICIES = "/api/admin/routing-policies"
PROVIDERS = "/api/admin/providers"
KEYS = "/api/admin/virtual-keys"


def step(provider_id: str, model: str) -> dict[str, str]:
    return {"provider_id": provider_id, "model": model}


def with_provider(value: Any, provider_id: str) -> Any:
    """`value` with every "PROV" placeholder replaced by a real provider id."""
    if value == "PROV":
        return provider_id
    if isinstance(value, dict):
        return {k: with_provider(v, provider_id) for k, v in value.items()}
    if isinstance(value, list):
        return [with_provider(v, provider_id) for v in value]
    return value


async def provider(client: Client, org: str, name: str) -> str:
    body = {"organization_id": org, "name": name, "kind": "mock"}
    return str((await create(client, PROVIDERS, body))["id"])


async def other_org(client: Client) -> str:
    return str((await create(client, "/api/admin/organizations", {"name": "globex"}))["id"])


async def get_policy(client: Client, policy_id: str) -> httpx.Response:
    return await client.get(f"{POLICIES}/{policy_id}", headers=ADMIN)


async def bundle_aliases(internal: Internal, vk_id: str) -> dict[str, list[tuple[str, str]]]:
    """alias → [(provider_id, model)] as a proxy would receive them for the key."""
    response = await internal.call("GET", f"/api/internal/gateway/config/{vk_id}")
    assert response.status_code == 200, response.text
    return {
        alias: [(t["provider_id"], t["model"]) for t in chain]
        for alias, chain in response.json()["aliases"].items()
    }


# Create and read


async def test_policy_create_keeps_each_chain_in_order(
    client: Client, world: World, clock: ManualClock
) -> None:
    backup = await provider(client, world.org, "backup")
    aliases = {
        "smart": [step(world.provider, "gpt-4o"), step(backup, "mock-large")],
        "fast": [step(backup, "mock-small"), step(world.provider, "gpt-4o-mini")],
    }
    created = await create(
        client, POLICIES, {"organization_id": world.org, "name": "prod", "aliases": aliases}
    )
    assert created["id"].startswith("rp_")
    assert created["organization_id"] == world.org
    assert created["name"] == "prod"
    assert created["aliases"] == aliases
    assert created["created_at"] == created["updated_at"] == "2026-03-10T12:00:00Z"
    fetched = await get_policy(client, created["id"])
    assert fetched.status_code == 200
    assert fetched.json() == created


async def test_world_policy_reads_back_its_alias(client: Client, world: World) -> None:
    response = await get_policy(client, world.policy)
    assert response.json()["aliases"] == {"fast": [step(world.provider, "gpt-4o-mini")]}


async def test_unknown_policy_is_not_found(client: Client) -> None:
    error_of(await get_policy(client, "rp_missing"), 404, "not_found", param=None)


async def test_policy_in_unknown_organization_is_not_found_naming_organization_id(
    client: Client, world: World
) -> None:
    body = {
        "organization_id": "org_missing",
        "name": "p",
        "aliases": {"a": [step(world.provider, "m")]},
    }
    response = await client.post(POLICIES, json=body, headers=ADMIN)
    error_of(response, 404, "not_found", param="organization_id")


async def test_unknown_provider_in_a_chain_is_not_found_naming_the_step(
    client: Client, world: World
) -> None:
    aliases = {"fast": [step(world.provider, "gpt-4o-mini"), step("prov_missing", "m")]}
    body = {"organization_id": world.org, "name": "broken", "aliases": aliases}
    response = await client.post(POLICIES, json=body, headers=ADMIN)
    error = error_of(response, 404, "not_found", param="aliases.fast[1].provider_id")
    assert "prov_missing" in error["message"]


async def test_provider_of_another_organization_is_refused_and_nothing_is_kept(
    client: Client, world: World
) -> None:
    globex = await other_org(client)
    foreign = await provider(client, globex, "foreign")
    aliases = {"fast": [step(world.provider, "gpt-4o-mini")], "cheap": [step(foreign, "m")]}
    body = {"organization_id": world.org, "name": "mixed", "aliases": aliases}
    response = await client.post(POLICIES, json=body, headers=ADMIN)
    error_of(response, 422, "validation_error", param="aliases.cheap[0].provider_id")

    listed = await client.get(POLICIES, params={"organization_id": world.org}, headers=ADMIN)
    assert [p["id"] for p in listed.json()["data"]] == [world.policy]
    audit = await client.get(
        "/api/admin/audit-log", params={"organization_id": world.org}, headers=ADMIN
    )
    created = [
        e["resource_id"] for e in audit.json()["data"] if e["action"] == "routing_policy.create"
    ]
    assert created == [world.policy]


async def test_policy_name_is_unique_within_an_organization_only(
    client: Client, world: World
) -> None:
    aliases = {"fast": [step(world.provider, "gpt-4o-mini")]}
    body = {"organization_id": world.org, "name": "default", "aliases": aliases}
    error_of(await client.post(POLICIES, json=body, headers=ADMIN), 409, "conflict", param="name")
    globex = await other_org(client)
    theirs = await provider(client, globex, "theirs")
    await create(
        client,
        POLICIES,
        {"organization_id": globex, "name": "default", "aliases": {"fast": [step(theirs, "m")]}},
    )


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"organization_id": None}, "organization_id"),
        ({"name": None}, "name"),
        ({"aliases": None}, "aliases"),
        ({"name": ""}, "name"),
        ({"aliases": {}}, "aliases"),
        ({"aliases": []}, "aliases"),
        ({"aliases": {"fast": []}}, "aliases[...]"),
        ({"aliases": {"fast": [step("PROV", "m")] * 17}}, "aliases[...]"),
        ({"aliases": {"has space": [step("PROV", "m")]}}, "aliases"),
        ({"aliases": {"fast": [{"provider_id": "PROV"}]}}, "aliases[...][0].model"),
        ({"aliases": {"fast": [{"model": "m"}]}}, "aliases[...][0].provider_id"),
        ({"aliases": {"fast": [{**step("PROV", "m"), "weight": 2}]}}, "aliases[...][0].weight"),
        ({"aliases": {"fast": [step("PROV", "")]}}, "aliases[...][0].model"),
        ({"aliases": {"fast": "PROV"}}, "aliases[...]"),
        ({"default": True}, "default"),
    ],
    ids=[
        "no-org",
        "no-name",
        "no-aliases",
        "empty-name",
        "no-alias",
        "aliases-list",
        "empty-chain",
        "chain-too-long",
        "alias-with-space",
        "step-without-model",
        "step-without-provider",
        "step-unknown-field",
        "empty-model",
        "chain-not-a-list",
        "unknown-field",
    ],
)
async def test_invalid_policy_body_is_refused_naming_the_field(
    client: Client, world: World, change: dict[str, Any], param: str
) -> None:
    aliases = {"fast": [step(world.provider, "gpt-4o-mini")]}
    body: dict[str, Any] = {"organization_id": world.org, "name": "new", "aliases": aliases}
    body.update(change)
    body = {k: with_provider(v, world.provider) for k, v in body.items() if v is not None}
    response = await client.post(POLICIES, json=body, headers=ADMIN)
    error_of(response, 422, "validation_error", param=param)


async def test_policy_list_filters_by_organization_and_pages(client: Client, world: World) -> None:
    ids = {world.policy}
    for i in range(3):
        body = {
            "organization_id": world.org,
            "name": f"p{i}",
            "aliases": {f"a{i}": [step(world.provider, "m")]},
        }
        ids.add((await create(client, POLICIES, body))["id"])
    globex = await other_org(client)
    theirs = await provider(client, globex, "theirs")
    foreign = await create(
        client,
        POLICIES,
        {"organization_id": globex, "name": "p", "aliases": {"a": [step(theirs, "m")]}},
    )

    seen = await walk_pages(client, POLICIES, organization_id=world.org)
    assert {p["id"] for p in seen} == ids and len(seen) == 4
    assert all(p["aliases"] for p in seen)

    theirs_only = await client.get(POLICIES, params={"organization_id": globex}, headers=ADMIN)
    assert [p["id"] for p in theirs_only.json()["data"]] == [foreign["id"]]


# Update


async def test_patch_aliases_replaces_every_alias_and_reaches_the_key_bundle(
    client: Client, world: World, internal: Internal, clock: ManualClock
) -> None:
    backup = await provider(client, world.org, "backup")
    assert await bundle_aliases(internal, world.key_id) == {
        "fast": [(world.provider, "gpt-4o-mini")]
    }
    clock.advance(30)
    aliases = {"smart": [step(backup, "mock-large"), step(world.provider, "gpt-4o")]}
    response = await client.patch(
        f"{POLICIES}/{world.policy}", json={"aliases": aliases}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    updated = response.json()
    assert updated["aliases"] == aliases
    assert updated["updated_at"] == "2026-03-10T12:00:30Z"
    assert updated["created_at"] == "2026-03-10T12:00:00Z"
    assert (await get_policy(client, world.policy)).json()["aliases"] == aliases
    assert await bundle_aliases(internal, world.key_id) == {
        "smart": [(backup, "mock-large"), (world.provider, "gpt-4o")]
    }


async def test_patch_name_alone_keeps_the_aliases(client: Client, world: World) -> None:
    response = await client.patch(
        f"{POLICIES}/{world.policy}", json={"name": "renamed"}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    assert response.json()["name"] == "renamed"
    assert response.json()["aliases"] == {"fast": [step(world.provider, "gpt-4o-mini")]}


async def test_patch_with_a_bad_step_changes_nothing(client: Client, world: World) -> None:
    globex = await other_org(client)
    foreign = await provider(client, globex, "foreign")
    response = await client.patch(
        f"{POLICIES}/{world.policy}",
        json={"name": "renamed", "aliases": {"fast": [step(foreign, "m")]}},
        headers=ADMIN,
    )
    error_of(response, 422, "validation_error", param="aliases.fast[0].provider_id")
    kept = (await get_policy(client, world.policy)).json()
    assert kept["name"] == "default"
    assert kept["aliases"] == {"fast": [step(world.provider, "gpt-4o-mini")]}


async def test_patch_to_a_taken_name_conflicts(client: Client, world: World) -> None:
    second = await create(
        client,
        POLICIES,
        {
            "organization_id": world.org,
            "name": "second",
            "aliases": {"a": [step(world.provider, "m")]},
        },
    )
    response = await client.patch(
        f"{POLICIES}/{second['id']}", json={"name": "default"}, headers=ADMIN
    )
    error_of(response, 409, "conflict", param="name")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"aliases": {}}, "aliases"),
        ({"aliases": None}, "aliases"),
        ({"name": ""}, "name"),
        ({"organization_id": "org_x"}, "organization_id"),
    ],
    ids=["no-alias", "null-aliases", "empty-name", "organization_id"],
)
async def test_invalid_patch_is_refused_naming_the_field(
    client: Client, world: World, body: dict[str, Any], param: str
) -> None:
    response = await client.patch(f"{POLICIES}/{world.policy}", json=body, headers=ADMIN)
    error_of(response, 422, "validation_error", param=param)


async def test_patch_of_unknown_policy_is_not_found(client: Client) -> None:
    response = await client.patch(f"{POLICIES}/rp_missing", json={"name": "x"}, headers=ADMIN)
    error_of(response, 404, "not_found")


# Delete


async def test_delete_conflicts_while_a_live_key_uses_the_policy_and_succeeds_once_revoked(
    client: Client, world: World
) -> None:
    path = f"{POLICIES}/{world.policy}"
    error_of(await client.delete(path, headers=ADMIN), 409, "conflict")
    assert (await get_policy(client, world.policy)).status_code == 200

    revoked = await client.post(f"{KEYS}/{world.key_id}/revoke", headers=ADMIN)
    assert revoked.status_code == 200, revoked.text
    deleted = await client.delete(path, headers=ADMIN)
    assert deleted.status_code == 204
    error_of(await get_policy(client, world.policy), 404, "not_found")
    key = await client.get(f"{KEYS}/{world.key_id}", headers=ADMIN)
    assert key.json()["routing_policy_id"] is None
    assert key.json()["status"] == "revoked"


async def test_a_disabled_key_still_holds_its_policy(client: Client, world: World) -> None:
    disabled = await client.post(f"{KEYS}/{world.key_id}/disable", headers=ADMIN)
    assert disabled.status_code == 200, disabled.text
    error_of(await client.delete(f"{POLICIES}/{world.policy}", headers=ADMIN), 409, "conflict")


async def test_deleting_a_policy_releases_its_providers(client: Client, world: World) -> None:
    assert (await client.post(f"{KEYS}/{world.key_id}/revoke", headers=ADMIN)).status_code == 200
    assert (await client.delete(f"{PROVIDERS}/{world.provider}", headers=ADMIN)).status_code == 409
    assert (await client.delete(f"{POLICIES}/{world.policy}", headers=ADMIN)).status_code == 204
    assert (await client.delete(f"{PROVIDERS}/{world.provider}", headers=ADMIN)).status_code == 204


async def test_delete_of_unknown_policy_is_not_found(client: Client) -> None:
    error_of(await client.delete(f"{POLICIES}/rp_missing", headers=ADMIN), 404, "not_found")


# Change feed and audit


async def test_create_and_update_append_updated_and_delete_appends_deleted(
    client: Client, world: World, internal: Internal
) -> None:
    start = await internal.revision()
    created = await create(
        client,
        POLICIES,
        {
            "organization_id": world.org,
            "name": "new",
            "aliases": {"a": [step(world.provider, "m")]},
        },
    )
    path = f"{POLICIES}/{created['id']}"
    assert (await client.patch(path, json={"name": "newer"}, headers=ADMIN)).status_code == 200
    assert (await client.delete(path, headers=ADMIN)).status_code == 204
    assert await internal.events_since(start) == [
        ("ROUTING_POLICY_UPDATED", "routing_policy", created["id"]),
        ("ROUTING_POLICY_UPDATED", "routing_policy", created["id"]),
        ("ROUTING_POLICY_DELETED", "routing_policy", created["id"]),
    ]


async def test_refused_policy_changes_append_no_event(
    client: Client, world: World, internal: Internal
) -> None:
    start = await internal.revision()
    assert (await client.delete(f"{POLICIES}/{world.policy}", headers=ADMIN)).status_code == 409
    bad = {"aliases": {"fast": [step("prov_missing", "m")]}}
    assert (
        await client.patch(f"{POLICIES}/{world.policy}", json=bad, headers=ADMIN)
    ).status_code == 404
    assert await internal.events_since(start) == []


async def test_policy_changes_are_audited(client: Client, world: World) -> None:
    path = f"{POLICIES}/{world.policy}"
    assert (await client.patch(path, json={"name": "renamed"}, headers=ADMIN)).status_code == 200
    assert (await client.post(f"{KEYS}/{world.key_id}/revoke", headers=ADMIN)).status_code == 200
    assert (await client.delete(path, headers=ADMIN)).status_code == 204
    response = await client.get(
        "/api/admin/audit-log", params={"resource_id": world.policy}, headers=ADMIN
    )
    entries = response.json()["data"]
    assert [e["action"] for e in entries] == [
        "routing_policy.create",
        "routing_policy.update",
        "routing_policy.delete",
    ]
    assert [e["details"]["name"] for e in entries] == ["default", "renamed", "renamed"]
    assert {e["resource_kind"] for e in entries} == {"routing_policy"}


async def test_patch_refuses_to_drop_an_alias_a_live_key_allows(
    client: httpx.AsyncClient, world: World
) -> None:
    key = await client.post(
        "/api/admin/virtual-keys",
        json={
            "project_id": world.project,
            "name": "narrow",
            "routing_policy_id": world.policy,
            "allowed_models": ["fast"],
        },
        headers=ADMIN,
    )
    assert key.status_code == 201, key.text
    chain = [{"provider_id": world.provider, "model": "gpt-4o"}]
    refused = await client.patch(
        f"/api/admin/routing-policies/{world.policy}",
        json={"aliases": {"big": chain}},
        headers=ADMIN,
    )
    assert refused.status_code == 409
    assert refused.json()["error"]["param"] == "aliases"
    assert key.json()["id"] in refused.json()["error"]["message"]
    revoked = await client.post(f"/api/admin/virtual-keys/{key.json()['id']}/revoke", headers=ADMIN)
    assert revoked.status_code == 200
    accepted = await client.patch(
        f"/api/admin/routing-policies/{world.policy}",
        json={"aliases": {"big": chain}},
        headers=ADMIN,
    )
    assert accepted.status_code == 200, accepted.text
