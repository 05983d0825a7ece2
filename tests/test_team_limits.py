"""Team rate limits: set on create or PATCH, carried by every bundle of the team's keys, announced
to proxies as a config change of each of those keys; and the strict rules every limit follows."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import Internal, World
from tests.support.api import ADMIN, create, error_of

Client = httpx.AsyncClient
TEAMS = "/api/admin/teams"
KEYS = "/api/admin/virtual-keys"
CONFIG = "/api/internal/gateway/config"


async def patch_team(client: Client, team_id: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.patch(f"{TEAMS}/{team_id}", json=body, headers=ADMIN)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def new_key(client: Client, world: World, project_id: str, name: str) -> str:
    key = await create(
        client, KEYS, {"project_id": project_id, "name": name, "routing_policy_id": world.policy}
    )
    key_id: str = key["id"]
    return key_id


async def new_project(client: Client, world: World, name: str, team_id: str | None) -> str:
    body = {"organization_id": world.org, "name": name, "team_id": team_id}
    project_id: str = (await create(client, "/api/admin/projects", body))["id"]
    return project_id


async def bundle(internal: Internal, vk_id: str) -> dict[str, Any]:
    response = await internal.call("GET", f"{CONFIG}/{vk_id}")
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def audit_of(client: Client, resource_id: str) -> list[dict[str, Any]]:
    response = await client.get(
        "/api/admin/audit-log", params={"resource_id": resource_id}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    entries: list[dict[str, Any]] = response.json()["data"]
    return entries


# --- create, read, update -----------------------------------------------------------------------


async def test_team_created_with_limits_reads_them_back(client: Client, world: World) -> None:
    limits = {"rpm": 600, "tpm": 200000, "rpd": 10000, "max_concurrency": 8}
    team = await create(
        client, TEAMS, {"organization_id": world.org, "name": "search", "limits": limits}
    )
    assert team["limits"] == limits
    fetched = await client.get(f"{TEAMS}/{team['id']}", headers=ADMIN)
    assert fetched.json() == team
    listed = await client.get(TEAMS, params={"organization_id": world.org}, headers=ADMIN)
    assert {t["id"]: t["limits"] for t in listed.json()["data"]}[team["id"]] == limits
    [entry] = await audit_of(client, team["id"])
    assert entry["action"] == "team.create"
    assert entry["details"] == {"name": "search", "limits": limits}


async def test_patch_replaces_every_team_limit_and_null_clears_them(
    client: Client, world: World
) -> None:
    first = await patch_team(client, world.team, {"limits": {"rpm": 60, "tpm": 1000}})
    assert first["limits"] == {"rpm": 60, "tpm": 1000}
    second = await patch_team(client, world.team, {"limits": {"max_concurrency": 2}})
    assert second["limits"] == {"max_concurrency": 2}
    assert second["name"] == "ml"
    cleared = await patch_team(client, world.team, {"limits": None})
    assert cleared["limits"] == {}
    fetched = await client.get(f"{TEAMS}/{world.team}", headers=ADMIN)
    assert fetched.json()["limits"] == {}


async def test_team_patch_is_audited_with_the_fields_it_changed(
    client: Client, world: World
) -> None:
    await patch_team(client, world.team, {"name": "ml-platform", "limits": {"rpm": 5}})
    await patch_team(client, world.team, {"name": "ml"})
    entries = await audit_of(client, world.team)
    assert [e["action"] for e in entries] == ["team.create", "team.update", "team.update"]
    assert entries[1]["details"] == {"fields": ["name", "limits"], "limits": {"rpm": 5}}
    assert entries[2]["details"] == {"fields": ["name"]}
    assert {e["organization_id"] for e in entries} == {world.org}


async def test_renaming_a_team_to_a_taken_name_is_a_conflict(client: Client, world: World) -> None:
    await create(client, TEAMS, {"organization_id": world.org, "name": "ops"})
    response = await client.patch(f"{TEAMS}/{world.team}", json={"name": "ops"}, headers=ADMIN)
    error_of(response, 409, "conflict", param="name")
    # Its own name is not taken by itself.
    assert (await patch_team(client, world.team, {"name": "ml"}))["name"] == "ml"


async def test_patching_an_unknown_team_is_not_found(client: Client, world: World) -> None:
    response = await client.patch(
        f"{TEAMS}/team_missing", json={"limits": {"rpm": 1}}, headers=ADMIN
    )
    error_of(response, 404, "not_found")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"organization_id": "x"}, "organization_id"),
        ({"limits": {"rph": 5}}, "limits.rph"),
        ({"limits": 5}, "limits"),
        ({"name": ""}, "name"),
    ],
    ids=["organization-is-fixed", "unknown-limit", "limits-not-an-object", "empty-name"],
)
async def test_invalid_team_patch_is_refused_naming_the_field(
    client: Client, world: World, body: dict[str, Any], param: str
) -> None:
    response = await client.patch(f"{TEAMS}/{world.team}", json=body, headers=ADMIN)
    error_of(response, 422, "validation_error", param=param)


# --- reaching proxies ---------------------------------------------------------------------------


async def test_team_limits_change_announces_every_usable_key_of_the_teams_projects(
    client: Client, internal: Internal, world: World
) -> None:
    second_project = await new_project(client, world, "search", world.team)
    sibling = await new_key(client, world, second_project, "sibling")
    revoked = await new_key(client, world, second_project, "revoked")
    disabled = await new_key(client, world, world.project, "disabled")
    await client.post(f"{KEYS}/{revoked}/revoke", headers=ADMIN)
    await client.post(f"{KEYS}/{disabled}/disable", headers=ADMIN)
    other_team = (await create(client, TEAMS, {"organization_id": world.org, "name": "ops"}))["id"]
    await new_key(client, world, await new_project(client, world, "ops-app", other_team), "ops")
    await new_key(client, world, await new_project(client, world, "loose", None), "loose")
    since = await internal.revision()

    await patch_team(client, world.team, {"limits": {"rpm": 100}})

    events = await internal.events_since(since)
    # A disabled key may be enabled again, with the bundle it then gets; a revoked one never is.
    assert sorted(events) == sorted(
        ("VK_CONFIG_UPDATED", "virtual_key", key) for key in (world.key_id, sibling, disabled)
    )


async def test_an_announced_key_carries_its_events_revision(
    client: Client, internal: Internal, world: World
) -> None:
    since = await internal.revision()
    await patch_team(client, world.team, {"limits": {"rpm": 100}})
    key = (await client.get(f"{KEYS}/{world.key_id}", headers=ADMIN)).json()
    assert key["revision"] == since + 1 == await internal.revision()
    assert (await bundle(internal, world.key_id))["revision"] == since + 1


async def test_a_team_change_that_leaves_the_limits_alone_wakes_no_proxy(
    client: Client, internal: Internal, world: World
) -> None:
    await patch_team(client, world.team, {"limits": {"rpm": 100}})
    since = await internal.revision()
    await patch_team(client, world.team, {"name": "renamed"})
    await patch_team(client, world.team, {"limits": {"rpm": 100}})
    assert await internal.events_since(since) == []
    # The same limits again changed nothing, so recorded nothing.
    assert [e["action"] for e in await audit_of(client, world.team)] == [
        "team.create",
        "team.update",
        "team.update",
    ]


async def test_bundle_carries_the_teams_limits_and_a_new_etag_when_they_change(
    client: Client, internal: Internal, world: World
) -> None:
    before = await internal.call("GET", f"{CONFIG}/{world.key_id}")
    assert before.json()["team_limits"] == {}

    await patch_team(client, world.team, {"limits": {"rpm": 100, "max_concurrency": 3}})

    after = await internal.call(
        "GET", f"{CONFIG}/{world.key_id}", headers={"If-None-Match": before.headers["etag"]}
    )
    assert after.status_code == 200
    assert after.json()["team_limits"] == {"rpm": 100, "max_concurrency": 3}
    assert after.json()["limits"] == {}  # the key's own limits are apart from its team's


async def test_a_key_of_a_project_without_a_team_has_empty_team_limits(
    client: Client, internal: Internal, world: World
) -> None:
    await patch_team(client, world.team, {"limits": {"rpm": 100}})
    loose = await new_key(client, world, await new_project(client, world, "loose", None), "k")
    got = await bundle(internal, loose)
    assert got["team_id"] is None
    assert got["team_limits"] == {}


# --- every limit is a whole number of 1 or more, or null ----------------------------------------

BAD_LIMITS: list[tuple[str, Any]] = [
    *(("rpm", value) for value in (0, -1, 1.5, 2.0, "5", True, 10**13, [], {})),
    ("tpm", "100"),
    ("rpd", 0),
    ("max_concurrency", 1.5),
]


async def _send_limits(client: Client, world: World, target: str, limits: Any) -> httpx.Response:
    if target == "key-create":
        body = {
            "project_id": world.project,
            "name": "limited",
            "routing_policy_id": world.policy,
            "limits": limits,
        }
        return await client.post(KEYS, json=body, headers=ADMIN)
    if target == "key-patch":
        return await client.patch(f"{KEYS}/{world.key_id}", json={"limits": limits}, headers=ADMIN)
    if target == "team-create":
        body = {"organization_id": world.org, "name": "limited", "limits": limits}
        return await client.post(TEAMS, json=body, headers=ADMIN)
    return await client.patch(f"{TEAMS}/{world.team}", json={"limits": limits}, headers=ADMIN)


TARGETS = ["key-create", "key-patch", "team-create", "team-patch"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("field", "value"), BAD_LIMITS, ids=[f"{f}={v!r}" for f, v in BAD_LIMITS])
async def test_a_limit_that_is_not_a_positive_integer_is_refused_naming_it(
    client: Client, internal: Internal, world: World, target: str, field: str, value: Any
) -> None:
    since = await internal.revision()
    response = await _send_limits(client, world, target, {field: value})
    error = error_of(response, 422, "validation_error", param=f"limits.{field}")
    assert f"limits.{field}" in error["message"]
    assert await internal.events_since(since) == []


@pytest.mark.parametrize("target", TARGETS)
async def test_a_null_limit_is_no_limit_and_the_smallest_limit_is_one(
    client: Client, world: World, target: str
) -> None:
    response = await _send_limits(client, world, target, {"rpm": None, "tpm": 1})
    assert response.status_code in (200, 201), response.text
    assert response.json()["limits"] == {"tpm": 1}
