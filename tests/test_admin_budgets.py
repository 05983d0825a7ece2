"""Admin API: budgets, their scopes, windows and exact decimal limits."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import Internal, World
from tests.support.api import ADMIN, create, error_of, walk_pages
from tests.support.clock import ManualClock

Client = httpx.AsyncClient
BUDGETS = "/api/admin/budgets"


def budget_body(org: str, **fields: Any) -> dict[str, Any]:
    """A monthly organization budget of 100 USD, changed by `fields` (None drops a field)."""
    body = {
        "organization_id": org,
        "scope": {"kind": "organization"},
        "window": "month",
        "limit_usd": "100",
    }
    body.update(fields)
    return {k: v for k, v in body.items() if v is not None}


async def post_budget(client: Client, body: dict[str, Any]) -> httpx.Response:
    return await client.post(BUDGETS, json=body, headers=ADMIN)


async def other_world(client: Client) -> dict[str, str]:
    """A second organization with a team, a project and a provider."""
    org = (await create(client, "/api/admin/organizations", {"name": "globex"}))["id"]
    team = (await create(client, "/api/admin/teams", {"organization_id": org, "name": "t"}))["id"]
    project = await create(client, "/api/admin/projects", {"organization_id": org, "name": "p"})
    provider = await create(
        client, "/api/admin/providers", {"organization_id": org, "name": "m", "kind": "mock"}
    )
    return {"org": org, "team": team, "project": project["id"], "provider": provider["id"]}


# Create and read


async def test_organization_budget_defaults_its_scope_id_name_and_breach_action(
    client: Client, world: World, clock: ManualClock
) -> None:
    created = await create(client, BUDGETS, budget_body(world.org, limit_usd="100.50"))
    assert created["id"].startswith("bud_")
    assert created["organization_id"] == world.org
    assert created["scope"] == {"kind": "organization", "id": world.org}
    assert created["window"] == "month"
    assert created["limit_usd"] == "100.5"
    assert created["name"] is None
    assert created["provider_id"] is None
    assert created["on_breach"] == "block"
    assert created["created_at"] == created["updated_at"] == "2026-03-10T12:00:00Z"
    fetched = await client.get(f"{BUDGETS}/{created['id']}", headers=ADMIN)
    assert fetched.status_code == 200
    assert fetched.json() == created


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("100.50", "100.5"),
        ("100", "100"),
        ("0.000000001", "0.000000001"),
        ("007.10", "7.1"),
        ("12.000", "12"),
        ("999999999.999999999", "999999999.999999999"),
    ],
)
async def test_limit_usd_round_trips_as_the_shortest_exact_decimal(
    client: Client, world: World, given: str, shown: str
) -> None:
    created = await create(client, BUDGETS, budget_body(world.org, limit_usd=given))
    assert created["limit_usd"] == shown
    fetched = await client.get(f"{BUDGETS}/{created['id']}", headers=ADMIN)
    assert fetched.json()["limit_usd"] == shown


@pytest.mark.parametrize(
    "limit",
    ["-1", "1e3", "1.0000000001", "abc", "", " 1", "1.", ".5", "NaN", 100, 1.5],
)
async def test_limit_usd_that_is_not_an_exact_decimal_string_is_refused(
    client: Client, world: World, limit: Any
) -> None:
    response = await post_budget(client, budget_body(world.org, limit_usd=limit))
    error_of(response, 422, "validation_error", param="limit_usd")


@pytest.mark.parametrize("limit", ["1000000000", "9223372037", "999999999999"])
async def test_limit_usd_beyond_what_the_store_holds_is_refused_not_overflowed(
    client: Client, world: World, limit: str
) -> None:
    response = await post_budget(client, budget_body(world.org, limit_usd=limit))
    error_of(response, 422, "validation_error", param="limit_usd")
    created = await create(client, BUDGETS, budget_body(world.org))
    patched = await client.patch(
        f"{BUDGETS}/{created['id']}", json={"limit_usd": limit}, headers=ADMIN
    )
    error_of(patched, 422, "validation_error", param="limit_usd")


@pytest.mark.parametrize("limit", ["0", "0.0", "000", "0.000000000"])
async def test_a_limit_usd_of_zero_is_refused_on_create_and_on_patch(
    client: Client, world: World, internal: Internal, limit: str
) -> None:
    created = await create(client, BUDGETS, budget_body(world.org))
    since = await internal.revision()
    refused = await post_budget(client, budget_body(world.org, limit_usd=limit))
    error = error_of(refused, 422, "validation_error", param="limit_usd")
    assert "limit_usd must be more than 0" in error["message"]
    patched = await client.patch(
        f"{BUDGETS}/{created['id']}", json={"limit_usd": limit}, headers=ADMIN
    )
    error_of(patched, 422, "validation_error", param="limit_usd")
    assert await internal.events_since(since) == []
    fetched = await client.get(f"{BUDGETS}/{created['id']}", headers=ADMIN)
    assert fetched.json()["limit_usd"] == "100"


async def test_organization_budget_may_name_its_own_organization_only(
    client: Client, world: World
) -> None:
    own = await create(
        client, BUDGETS, budget_body(world.org, scope={"kind": "organization", "id": world.org})
    )
    assert own["scope"]["id"] == world.org
    other = await other_world(client)
    response = await post_budget(
        client, budget_body(world.org, scope={"kind": "organization", "id": other["org"]})
    )
    error_of(response, 422, "validation_error", param="scope.id")


@pytest.mark.parametrize("kind", ["team", "project", "virtual_key"])
async def test_scoped_budget_names_a_resource_of_its_organization(
    client: Client, world: World, kind: str
) -> None:
    ident = {"team": world.team, "project": world.project, "virtual_key": world.key_id}[kind]
    created = await create(
        client, BUDGETS, budget_body(world.org, scope={"kind": kind, "id": ident})
    )
    assert created["scope"] == {"kind": kind, "id": ident}


@pytest.mark.parametrize("kind", ["team", "project", "virtual_key"])
async def test_scoped_budget_without_scope_id_is_refused(
    client: Client, world: World, kind: str
) -> None:
    response = await post_budget(client, budget_body(world.org, scope={"kind": kind}))
    error_of(response, 422, "validation_error", param="scope.id")


@pytest.mark.parametrize("kind", ["team", "project", "virtual_key"])
async def test_scoped_budget_naming_an_unknown_resource_is_not_found(
    client: Client, world: World, kind: str
) -> None:
    response = await post_budget(client, budget_body(world.org, scope={"kind": kind, "id": "x_1"}))
    error_of(response, 404, "not_found", param="scope.id")


@pytest.mark.parametrize("kind", ["team", "project"])
async def test_scoped_budget_naming_another_organizations_resource_is_refused(
    client: Client, world: World, kind: str
) -> None:
    other = await other_world(client)
    response = await post_budget(
        client, budget_body(world.org, scope={"kind": kind, "id": other[kind]})
    )
    error_of(response, 422, "validation_error", param="scope.id")


async def test_virtual_key_budget_of_another_organization_is_refused(
    client: Client, world: World
) -> None:
    other = await other_world(client)
    response = await post_budget(
        client, budget_body(other["org"], scope={"kind": "virtual_key", "id": world.key_id})
    )
    error_of(response, 422, "validation_error", param="scope.id")


async def test_end_user_budget_applies_to_one_user_or_to_each(client: Client, world: World) -> None:
    one = await create(
        client, BUDGETS, budget_body(world.org, scope={"kind": "end_user", "id": "user-42"})
    )
    assert one["scope"] == {"kind": "end_user", "id": "user-42"}
    each = await create(client, BUDGETS, budget_body(world.org, scope={"kind": "end_user"}))
    assert each["scope"] == {"kind": "end_user", "id": None}


async def test_provider_filtered_budget_names_a_provider_of_its_organization(
    client: Client, world: World
) -> None:
    created = await create(
        client,
        BUDGETS,
        budget_body(world.org, provider_id=world.provider, on_breach="warn", name="openai cap"),
    )
    assert created["provider_id"] == world.provider
    assert created["on_breach"] == "warn"
    assert created["name"] == "openai cap"

    unknown = await post_budget(client, budget_body(world.org, provider_id="prov_missing"))
    error_of(unknown, 404, "not_found", param="provider_id")
    other = await other_world(client)
    foreign = await post_budget(client, budget_body(world.org, provider_id=other["provider"]))
    error_of(foreign, 422, "validation_error", param="provider_id")


async def test_budget_of_unknown_organization_is_not_found_naming_organization_id(
    client: Client,
) -> None:
    response = await post_budget(client, budget_body("org_missing"))
    error_of(response, 404, "not_found", param="organization_id")


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"organization_id": None}, "organization_id"),
        ({"scope": None}, "scope"),
        ({"window": None}, "window"),
        ({"limit_usd": None}, "limit_usd"),
        ({"scope": {}}, "scope.kind"),
        ({"scope": {"kind": "department"}}, "scope.kind"),
        ({"scope": {"kind": "end_user", "id": ""}}, "scope.id"),
        ({"scope": {"kind": "end_user", "user": "u"}}, "scope.user"),
        ({"scope": "organization"}, "scope"),
        ({"window": "year"}, "window"),
        ({"window": 30}, "window"),
        ({"on_breach": "throttle"}, "on_breach"),
        ({"name": ""}, "name"),
        ({"provider_id": ""}, "provider_id"),
        ({"currency": "EUR"}, "currency"),
    ],
    ids=[
        "no-org",
        "no-scope",
        "no-window",
        "no-limit",
        "scope-without-kind",
        "unknown-scope-kind",
        "empty-scope-id",
        "scope-unknown-field",
        "scope-string",
        "unknown-window",
        "window-number",
        "unknown-breach",
        "empty-name",
        "empty-provider",
        "unknown-field",
    ],
)
async def test_invalid_budget_body_is_refused_naming_the_field(
    client: Client, world: World, change: dict[str, Any], param: str
) -> None:
    body = {**budget_body(world.org), **change}
    body = {k: v for k, v in body.items() if v is not None}
    error_of(await post_budget(client, body), 422, "validation_error", param=param)


async def test_unknown_budget_is_not_found(client: Client) -> None:
    response = await client.get(f"{BUDGETS}/bud_missing", headers=ADMIN)
    error_of(response, 404, "not_found", param=None)


async def test_budget_list_filters_by_organization_and_pages(client: Client, world: World) -> None:
    ids = set()
    for window in ("day", "week", "month", "total"):
        ids.add((await create(client, BUDGETS, budget_body(world.org, window=window)))["id"])
    other = await other_world(client)
    foreign = await create(client, BUDGETS, budget_body(other["org"]))

    seen = await walk_pages(client, BUDGETS, organization_id=world.org)
    assert {b["id"] for b in seen} == ids and len(seen) == 4
    assert {b["window"] for b in seen} == {"day", "week", "month", "total"}

    theirs = await client.get(BUDGETS, params={"organization_id": other["org"]}, headers=ADMIN)
    assert [b["id"] for b in theirs.json()["data"]] == [foreign["id"]]


# Update and delete


async def test_patch_changes_only_the_fields_it_names(
    client: Client, world: World, clock: ManualClock
) -> None:
    created = await create(client, BUDGETS, budget_body(world.org, name="monthly"))
    clock.advance(3600)
    response = await client.patch(
        f"{BUDGETS}/{created['id']}",
        json={"limit_usd": "250.25", "window": "week", "on_breach": "warn"},
        headers=ADMIN,
    )
    assert response.status_code == 200, response.text
    updated = response.json()
    assert updated["limit_usd"] == "250.25"
    assert updated["window"] == "week"
    assert updated["on_breach"] == "warn"
    assert updated["name"] == "monthly"
    assert updated["scope"] == created["scope"]
    assert updated["created_at"] == "2026-03-10T12:00:00Z"
    assert updated["updated_at"] == "2026-03-10T13:00:00Z"
    fetched = await client.get(f"{BUDGETS}/{created['id']}", headers=ADMIN)
    assert fetched.json() == updated


async def test_patch_null_clears_the_name_and_the_provider_filter(
    client: Client, world: World
) -> None:
    created = await create(
        client, BUDGETS, budget_body(world.org, name="capped", provider_id=world.provider)
    )
    response = await client.patch(
        f"{BUDGETS}/{created['id']}", json={"name": None, "provider_id": None}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    assert response.json()["name"] is None
    assert response.json()["provider_id"] is None


async def test_patch_checks_the_provider_filter_like_create(client: Client, world: World) -> None:
    created = await create(client, BUDGETS, budget_body(world.org))
    path = f"{BUDGETS}/{created['id']}"
    other = await other_world(client)
    foreign = await client.patch(path, json={"provider_id": other["provider"]}, headers=ADMIN)
    error_of(foreign, 422, "validation_error", param="provider_id")
    unknown = await client.patch(path, json={"provider_id": "prov_missing"}, headers=ADMIN)
    error_of(unknown, 404, "not_found", param="provider_id")
    own = await client.patch(path, json={"provider_id": world.provider}, headers=ADMIN)
    assert own.json()["provider_id"] == world.provider


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"scope": {"kind": "team", "id": "t"}}, "scope"),
        ({"organization_id": "org_x"}, "organization_id"),
        ({"limit_usd": "-5"}, "limit_usd"),
        ({"limit_usd": None}, "limit_usd"),
        ({"window": "hour"}, "window"),
        ({"window": None}, "window"),
        ({"on_breach": None}, "on_breach"),
    ],
    ids=[
        "scope",
        "organization_id",
        "negative",
        "null-limit",
        "window",
        "null-window",
        "null-breach",
    ],
)
async def test_invalid_patch_is_refused_naming_the_field(
    client: Client, world: World, body: dict[str, Any], param: str
) -> None:
    created = await create(client, BUDGETS, budget_body(world.org))
    response = await client.patch(f"{BUDGETS}/{created['id']}", json=body, headers=ADMIN)
    error_of(response, 422, "validation_error", param=param)


async def test_patch_of_unknown_budget_is_not_found(client: Client) -> None:
    response = await client.patch(f"{BUDGETS}/bud_missing", json={"limit_usd": "1"}, headers=ADMIN)
    error_of(response, 404, "not_found")


async def test_delete_removes_the_budget_once(client: Client, world: World) -> None:
    created = await create(client, BUDGETS, budget_body(world.org))
    path = f"{BUDGETS}/{created['id']}"
    deleted = await client.delete(path, headers=ADMIN)
    assert deleted.status_code == 204
    error_of(await client.get(path, headers=ADMIN), 404, "not_found")
    error_of(await client.delete(path, headers=ADMIN), 404, "not_found")


async def test_project_budget_reaches_the_bundle_of_the_projects_key(
    client: Client, world: World, internal: Internal
) -> None:
    created = await create(
        client,
        BUDGETS,
        budget_body(world.org, scope={"kind": "project", "id": world.project}, limit_usd="12.5"),
    )
    response = await internal.call("GET", f"/api/internal/gateway/config/{world.key_id}")
    [state] = response.json()["budgets"]
    assert state["budget_id"] == created["id"]
    assert state["limit_usd"] == "12.5"
    assert state["scope_kind"] == "project"


# Change feed and audit


async def test_create_update_and_delete_append_their_budget_events(
    client: Client, world: World, internal: Internal
) -> None:
    start = await internal.revision()
    created = await create(client, BUDGETS, budget_body(world.org))
    path = f"{BUDGETS}/{created['id']}"
    assert (await client.patch(path, json={"limit_usd": "5"}, headers=ADMIN)).status_code == 200
    assert (await client.delete(path, headers=ADMIN)).status_code == 204
    assert await internal.events_since(start) == [
        ("BUDGET_CREATED", "budget", created["id"]),
        ("BUDGET_UPDATED", "budget", created["id"]),
        ("BUDGET_DELETED", "budget", created["id"]),
    ]


async def test_refused_budget_changes_append_no_event(
    client: Client, world: World, internal: Internal
) -> None:
    created = await create(client, BUDGETS, budget_body(world.org))
    other = await other_world(client)
    start = await internal.revision()
    patch = {"provider_id": other["provider"], "limit_usd": "1"}
    refused = await client.patch(f"{BUDGETS}/{created['id']}", json=patch, headers=ADMIN)
    assert refused.status_code == 422
    unscoped = await post_budget(client, budget_body(world.org, scope={"kind": "team"}))
    assert unscoped.status_code == 422
    assert await internal.events_since(start) == []
    fetched = await client.get(f"{BUDGETS}/{created['id']}", headers=ADMIN)
    assert fetched.json()["limit_usd"] == "100"


async def test_budget_changes_are_audited(client: Client, world: World) -> None:
    created = await create(
        client, BUDGETS, budget_body(world.org, scope={"kind": "team", "id": world.team})
    )
    path = f"{BUDGETS}/{created['id']}"
    assert (await client.patch(path, json={"window": "day"}, headers=ADMIN)).status_code == 200
    assert (await client.delete(path, headers=ADMIN)).status_code == 204
    response = await client.get(
        "/api/admin/audit-log", params={"resource_id": created["id"]}, headers=ADMIN
    )
    entries = response.json()["data"]
    assert [e["action"] for e in entries] == ["budget.create", "budget.update", "budget.delete"]
    assert entries[0]["details"] == {
        "scope_kind": "team",
        "scope_id": world.team,
        "window": "month",
    }
    assert entries[1]["details"]["window"] == "day"
    assert {e["organization_id"] for e in entries} == {world.org}
