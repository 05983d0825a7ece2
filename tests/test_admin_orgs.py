"""Admin API: organizations, teams and projects, and the request rules every admin route shares."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import World
from tests.support.api import ADMIN, create, error_of, walk_pages
from tests.support.clock import ManualClock

Client = httpx.AsyncClient
ORGS = "/api/admin/organizations"
TEAMS = "/api/admin/teams"
PROJECTS = "/api/admin/projects"
JSON_HEADERS = {**ADMIN, "content-type": "application/json"}


async def list_of(client: Client, path: str, **filters: str) -> list[dict[str, Any]]:
    response = await client.get(path, params=filters, headers=ADMIN)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["next_cursor"] is None
    data: list[dict[str, Any]] = body["data"]
    return data


async def audit_actions(client: Client, resource_id: str) -> list[str]:
    response = await client.get(
        "/api/admin/audit-log", params={"resource_id": resource_id}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    return [entry["action"] for entry in response.json()["data"]]


# Organizations


async def test_organization_create_answers_its_id_name_and_creation_time(
    client: Client, clock: ManualClock
) -> None:
    created = await create(client, ORGS, {"name": "acme"})
    assert set(created) == {"id", "name", "created_at"}
    assert created["id"].startswith("org_")
    assert created["name"] == "acme"
    assert created["created_at"] == "2026-03-10T12:00:00Z"


async def test_organization_get_returns_what_create_answered(client: Client) -> None:
    created = await create(client, ORGS, {"name": "acme"})
    fetched = await client.get(f"{ORGS}/{created['id']}", headers=ADMIN)
    assert fetched.status_code == 200
    assert fetched.json() == created


async def test_unknown_organization_is_not_found(client: Client) -> None:
    response = await client.get(f"{ORGS}/org_missing", headers=ADMIN)
    error = error_of(response, 404, "not_found", param=None)
    assert error["type"] == "not_found_error"
    assert "org_missing" in error["message"]


async def test_organization_list_pages_one_at_a_time_through_next_cursor(client: Client) -> None:
    ids = {(await create(client, ORGS, {"name": f"org-{i}"}))["id"] for i in range(5)}
    walked = [org["id"] for org in await walk_pages(client, ORGS)]
    assert sorted(walked) == walked
    assert set(walked) == ids
    assert len(walked) == len(ids)


async def test_organization_list_without_limit_returns_everything_and_no_cursor(
    client: Client,
) -> None:
    for i in range(3):
        await create(client, ORGS, {"name": f"org-{i}"})
    assert {org["name"] for org in await list_of(client, ORGS)} == {"org-0", "org-1", "org-2"}


@pytest.mark.parametrize("limit", ["0", "1001", "-1"])
async def test_list_limit_out_of_range_is_refused_naming_limit(client: Client, limit: str) -> None:
    response = await client.get(ORGS, params={"limit": limit}, headers=ADMIN)
    error_of(response, 422, "validation_error", param="limit")


async def test_list_limit_that_is_not_a_number_is_refused_naming_limit(client: Client) -> None:
    response = await client.get(ORGS, params={"limit": "ten"}, headers=ADMIN)
    error_of(response, 422, "validation_error", param="limit")


async def test_duplicate_organization_name_conflicts(client: Client) -> None:
    await create(client, ORGS, {"name": "acme"})
    response = await client.post(ORGS, json={"name": "acme"}, headers=ADMIN)
    error = error_of(response, 409, "conflict", param="name")
    assert error["type"] == "conflict_error"
    assert len(await list_of(client, ORGS)) == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "name"),
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({"name": " leading-space"}, "name"),
        ({"name": "trailing-space "}, "name"),
        ({"name": "x" * 201}, "name"),
        ({"name": 7}, "name"),
        ({"name": None}, "name"),
        ({"name": ["acme"]}, "name"),
        ({"name": "acme", "owner": "bob"}, "owner"),
    ],
    ids=[
        "missing",
        "empty",
        "blank",
        "leading-space",
        "trailing-space",
        "too-long",
        "number",
        "null",
        "list",
        "unknown-field",
    ],
)
async def test_invalid_organization_body_is_refused_naming_the_field(
    client: Client, body: dict[str, Any], param: str
) -> None:
    response = await client.post(ORGS, json=body, headers=ADMIN)
    error = error_of(response, 422, "validation_error", param=param)
    assert error["type"] == "invalid_request_error"
    assert await list_of(client, ORGS) == []


async def test_name_with_inner_spaces_is_accepted(client: Client) -> None:
    assert (await create(client, ORGS, {"name": "Acme Corp"}))["name"] == "Acme Corp"


@pytest.mark.parametrize("raw", [b"{nope", b'{"name": "acme"', b"\xff\xfe", b"{'name': 'acme'}"])
async def test_malformed_json_is_an_invalid_request(client: Client, raw: bytes) -> None:
    response = await client.post(ORGS, content=raw, headers=JSON_HEADERS)
    error = error_of(response, 400, "invalid_request", param=None)
    assert error["type"] == "invalid_request_error"


async def test_empty_body_is_an_invalid_request(client: Client) -> None:
    response = await client.post(ORGS, content=b"", headers=JSON_HEADERS)
    error_of(response, 400, "invalid_request", param=None)


@pytest.mark.parametrize("raw", [b"[]", b'"acme"', b"42", b"null"])
async def test_json_that_is_not_an_object_is_a_validation_error(client: Client, raw: bytes) -> None:
    response = await client.post(ORGS, content=raw, headers=JSON_HEADERS)
    error_of(response, 422, "validation_error")


async def test_body_over_the_size_limit_is_refused_and_creates_nothing(client: Client) -> None:
    raw = b'{"name": "' + b"a" * (1024 * 1024) + b'"}'
    response = await client.post(ORGS, content=raw, headers=JSON_HEADERS)
    error_of(response, 413, "payload_too_large", param=None)
    assert await list_of(client, ORGS) == []


async def test_body_just_under_the_size_limit_reaches_validation(client: Client) -> None:
    raw = b'{"name": "' + b"a" * (1024 * 1024 - 100) + b'"}'
    response = await client.post(ORGS, content=raw, headers=JSON_HEADERS)
    error_of(response, 422, "validation_error", param="name")


async def test_unsupported_method_answers_the_error_body(client: Client) -> None:
    response = await client.put(ORGS, json={"name": "acme"}, headers=ADMIN)
    error_of(response, 405, "method_not_allowed")


async def test_organization_create_is_audited_as_the_env_token(client: Client) -> None:
    org = await create(client, ORGS, {"name": "acme"})
    response = await client.get(
        "/api/admin/audit-log", params={"resource_id": org["id"]}, headers=ADMIN
    )
    [entry] = response.json()["data"]
    assert entry["action"] == "organization.create"
    assert entry["resource_kind"] == "organization"
    assert entry["organization_id"] == org["id"]
    assert entry["actor"] == "env"
    assert entry["details"] == {"name": "acme"}


# Teams


async def test_team_create_and_get_round_trip(client: Client, clock: ManualClock) -> None:
    org = await create(client, ORGS, {"name": "acme"})
    team = await create(client, TEAMS, {"organization_id": org["id"], "name": "ml"})
    assert team["id"].startswith("team_")
    assert team["organization_id"] == org["id"]
    assert team["name"] == "ml"
    assert team["limits"] == {}
    assert team["created_at"] == "2026-03-10T12:00:00Z"
    fetched = await client.get(f"{TEAMS}/{team['id']}", headers=ADMIN)
    assert fetched.status_code == 200
    assert fetched.json() == team


async def test_unknown_team_is_not_found(client: Client) -> None:
    error_of(await client.get(f"{TEAMS}/team_missing", headers=ADMIN), 404, "not_found")


async def test_team_in_unknown_organization_is_not_found_naming_organization_id(
    client: Client,
) -> None:
    response = await client.post(
        TEAMS, json={"organization_id": "org_missing", "name": "ml"}, headers=ADMIN
    )
    error_of(response, 404, "not_found", param="organization_id")


async def test_team_name_is_unique_within_an_organization_only(client: Client) -> None:
    acme = await create(client, ORGS, {"name": "acme"})
    globex = await create(client, ORGS, {"name": "globex"})
    await create(client, TEAMS, {"organization_id": acme["id"], "name": "ml"})
    duplicate = await client.post(
        TEAMS, json={"organization_id": acme["id"], "name": "ml"}, headers=ADMIN
    )
    error_of(duplicate, 409, "conflict", param="name")
    await create(client, TEAMS, {"organization_id": globex["id"], "name": "ml"})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": "ml"}, "organization_id"),
        ({"organization_id": "ORG"}, "name"),
        ({"organization_id": "ORG", "name": ""}, "name"),
        ({"organization_id": 12, "name": "ml"}, "organization_id"),
        ({"organization_id": "", "name": "ml"}, "organization_id"),
        ({"organization_id": "ORG", "name": "ml", "lead": "ann"}, "lead"),
    ],
    ids=["no-org", "no-name", "empty-name", "org-number", "org-empty", "unknown-field"],
)
async def test_invalid_team_body_is_refused_naming_the_field(
    client: Client, world: World, body: dict[str, Any], param: str
) -> None:
    body = {k: world.org if v == "ORG" else v for k, v in body.items()}
    response = await client.post(TEAMS, json=body, headers=ADMIN)
    error_of(response, 422, "validation_error", param=param)


async def test_team_list_filters_by_organization_and_pages(client: Client) -> None:
    acme = await create(client, ORGS, {"name": "acme"})
    globex = await create(client, ORGS, {"name": "globex"})
    acme_teams = {
        (await create(client, TEAMS, {"organization_id": acme["id"], "name": f"t{i}"}))["id"]
        for i in range(3)
    }
    globex_team = await create(client, TEAMS, {"organization_id": globex["id"], "name": "t0"})

    walked = await walk_pages(client, TEAMS, organization_id=acme["id"])
    assert {t["id"] for t in walked} == acme_teams
    assert len(walked) == 3
    assert [t["id"] for t in await list_of(client, TEAMS, organization_id=globex["id"])] == [
        globex_team["id"]
    ]
    assert len(await walk_pages(client, TEAMS)) == 4
    assert await list_of(client, TEAMS, organization_id="org_missing") == []


async def test_team_create_is_audited(client: Client, world: World) -> None:
    assert await audit_actions(client, world.team) == ["team.create"]


# Projects


async def test_project_create_with_a_team_and_without(client: Client, world: World) -> None:
    with_team = await create(
        client, PROJECTS, {"organization_id": world.org, "team_id": world.team, "name": "search"}
    )
    assert with_team["id"].startswith("proj_")
    assert with_team["team_id"] == world.team
    assert with_team["organization_id"] == world.org
    without = await create(client, PROJECTS, {"organization_id": world.org, "name": "batch"})
    assert without["team_id"] is None
    fetched = await client.get(f"{PROJECTS}/{without['id']}", headers=ADMIN)
    assert fetched.json() == without


async def test_unknown_project_is_not_found(client: Client) -> None:
    error_of(await client.get(f"{PROJECTS}/proj_missing", headers=ADMIN), 404, "not_found")


async def test_project_in_unknown_organization_is_not_found_naming_organization_id(
    client: Client,
) -> None:
    response = await client.post(
        PROJECTS, json={"organization_id": "org_missing", "name": "chat"}, headers=ADMIN
    )
    error_of(response, 404, "not_found", param="organization_id")


async def test_project_with_unknown_team_is_not_found_naming_team_id(
    client: Client, world: World
) -> None:
    response = await client.post(
        PROJECTS,
        json={"organization_id": world.org, "team_id": "team_missing", "name": "x"},
        headers=ADMIN,
    )
    error_of(response, 404, "not_found", param="team_id")


async def test_project_with_a_team_of_another_organization_is_refused(
    client: Client, world: World
) -> None:
    other = await create(client, ORGS, {"name": "globex"})
    response = await client.post(
        PROJECTS,
        json={"organization_id": other["id"], "team_id": world.team, "name": "x"},
        headers=ADMIN,
    )
    error_of(response, 422, "validation_error", param="team_id")
    assert await list_of(client, PROJECTS, organization_id=other["id"]) == []


async def test_project_name_is_unique_within_an_organization(client: Client, world: World) -> None:
    response = await client.post(
        PROJECTS, json={"organization_id": world.org, "name": "chat"}, headers=ADMIN
    )
    error_of(response, 409, "conflict", param="name")
    other = await create(client, ORGS, {"name": "globex"})
    await create(client, PROJECTS, {"organization_id": other["id"], "name": "chat"})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": "p"}, "organization_id"),
        ({"organization_id": "ORG"}, "name"),
        ({"organization_id": "ORG", "name": "p", "team_id": 3}, "team_id"),
        ({"organization_id": "ORG", "name": "p", "team_id": ""}, "team_id"),
        ({"organization_id": "ORG", "name": "p", "budget": "1"}, "budget"),
    ],
    ids=["no-org", "no-name", "team-number", "team-empty", "unknown-field"],
)
async def test_invalid_project_body_is_refused_naming_the_field(
    client: Client, world: World, body: dict[str, Any], param: str
) -> None:
    body = {k: world.org if v == "ORG" else v for k, v in body.items()}
    response = await client.post(PROJECTS, json=body, headers=ADMIN)
    error_of(response, 422, "validation_error", param=param)


async def test_project_list_filters_by_organization_and_team(client: Client, world: World) -> None:
    second_team = await create(client, TEAMS, {"organization_id": world.org, "name": "infra"})
    infra = await create(
        client,
        PROJECTS,
        {"organization_id": world.org, "team_id": second_team["id"], "name": "infra"},
    )
    loose = await create(client, PROJECTS, {"organization_id": world.org, "name": "loose"})
    other = await create(client, ORGS, {"name": "globex"})
    await create(client, PROJECTS, {"organization_id": other["id"], "name": "chat"})

    in_org = await walk_pages(client, PROJECTS, organization_id=world.org)
    assert {p["id"] for p in in_org} == {world.project, infra["id"], loose["id"]}
    by_team = await list_of(client, PROJECTS, team_id=second_team["id"])
    assert [p["id"] for p in by_team] == [infra["id"]]
    both = await list_of(client, PROJECTS, organization_id=other["id"], team_id=world.team)
    assert both == []
    assert len(await walk_pages(client, PROJECTS)) == 4


async def test_project_create_is_audited_with_its_team(client: Client, world: World) -> None:
    response = await client.get(
        "/api/admin/audit-log", params={"resource_id": world.project}, headers=ADMIN
    )
    [entry] = response.json()["data"]
    assert entry["action"] == "project.create"
    assert entry["organization_id"] == world.org
    assert entry["details"] == {"name": "chat", "team_id": world.team}
