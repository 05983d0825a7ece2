"""Admin API and CLI: response-cache rules, their scopes, the bundle of the keys they cover, and
the change feed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Internal, World
from tests.support.api import ADMIN, create, error_of, walk_pages
from tests.support.processes import clean_env, sqlite_controlplane
from tests.test_admin_auth import bearer, new_token
from tests.test_admin_budgets import other_world
from tests.test_admin_org_scope import bound_token
from tests.test_cli import Cli, header_of, new_org

Client = httpx.AsyncClient
RULES = "/api/admin/cache-rules"


def rule_body(org: str, **fields: Any) -> dict[str, Any]:
    """An organization-wide rule caching `gpt-*` for five minutes, changed by `fields`."""
    body = {
        "organization_id": org,
        "name": "cache-gpt",
        "scope": {"kind": "organization"},
        "models": ["gpt-*"],
        "ttl_seconds": 300,
    }
    body.update(fields)
    return {k: v for k, v in body.items() if v is not None}


async def test_a_rule_is_created_read_listed_changed_and_deleted(
    client: Client, world: World
) -> None:
    created = await create(client, RULES, rule_body(world.org))
    assert created["scope"] == {"kind": "organization", "id": world.org}
    assert (created["models"], created["ttl_seconds"], created["enabled"]) == (["gpt-*"], 300, True)
    path = f"{RULES}/{created['id']}"
    assert (await client.get(path, headers=ADMIN)).json() == created
    project = await create(
        client,
        RULES,
        rule_body(world.org, name="p", scope={"kind": "project", "id": world.project}),
    )
    other = await other_world(client)
    await create(client, RULES, rule_body(other["org"]))
    listed = await walk_pages(client, RULES, organization_id=world.org)
    assert [r["id"] for r in listed] == sorted([created["id"], project["id"]])

    changed = await client.patch(
        path, json={"models": ["gpt-4o", "claude-*"], "enabled": False}, headers=ADMIN
    )
    assert changed.status_code == 200, changed.text
    assert (changed.json()["models"], changed.json()["enabled"]) == (["gpt-4o", "claude-*"], False)
    assert changed.json()["ttl_seconds"] == 300
    assert (await client.delete(path, headers=ADMIN)).status_code == 204
    error_of(await client.get(path, headers=ADMIN), 404, "not_found")
    error_of(await client.delete(path, headers=ADMIN), 404, "not_found")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"ttl_seconds": 0}, "ttl_seconds"),
        ({"ttl_seconds": 31 * 86_400}, "ttl_seconds"),
        ({"models": []}, "models"),
        ({"models": ["has space"]}, "models[0]"),
        ({"scope": {"kind": "end_user"}}, "scope.kind"),
        ({"scope": {"kind": "team"}}, "scope.id"),
        ({"name": None}, "name"),
        ({"colour": "blue"}, None),
    ],
)
async def test_an_invalid_rule_is_refused_naming_the_field(
    client: Client, world: World, fields: dict[str, Any], param: str | None
) -> None:
    response = await client.post(RULES, json=rule_body(world.org, **fields), headers=ADMIN)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] in ("validation_error", "invalid_request")
    if param is not None:
        assert error["param"] == param, error
    else:
        assert "colour" in error["message"], error


async def test_a_scope_names_something_of_the_rules_own_organization(
    client: Client, world: World
) -> None:
    other = await other_world(client)
    for scope in (
        {"kind": "project", "id": other["project"]},
        {"kind": "team", "id": other["team"]},
        {"kind": "organization", "id": other["org"]},
    ):
        response = await client.post(RULES, json=rule_body(world.org, scope=scope), headers=ADMIN)
        error_of(response, 422, "validation_error", param="scope.id")
    unknown = await client.post(
        RULES, json=rule_body(world.org, scope={"kind": "virtual_key", "id": "vk_nope"}),
        headers=ADMIN,
    )  # fmt: skip
    error_of(unknown, 404, "not_found")


async def test_the_bundle_of_a_key_carries_the_enabled_rules_that_cover_it(
    client: Client, world: World, internal: Internal
) -> None:
    whole = await create(client, RULES, rule_body(world.org))
    team = await create(
        client, RULES, rule_body(world.org, scope={"kind": "team", "id": world.team}, models=["*"])
    )
    await create(client, RULES, rule_body(world.org, enabled=False))
    other_project = await create(
        client, "/api/admin/projects", {"organization_id": world.org, "name": "elsewhere"}
    )
    await create(
        client, RULES, rule_body(world.org, scope={"kind": "project", "id": other_project["id"]})
    )
    response = await internal.call("GET", f"/api/internal/gateway/config/{world.key_id}")
    rules = response.json()["cache_rules"]
    assert {(r["rule_id"], r["scope_kind"], tuple(r["models"])) for r in rules} == {
        (whole["id"], "organization", ("gpt-*",)),
        (team["id"], "team", ("*",)),
    }


async def test_changes_append_their_events_and_are_audited(
    client: Client, world: World, internal: Internal
) -> None:
    start = await internal.revision()
    created = await create(client, RULES, rule_body(world.org))
    path = f"{RULES}/{created['id']}"
    assert (await client.patch(path, json={"ttl_seconds": 60}, headers=ADMIN)).status_code == 200
    refused = await client.patch(path, json={"ttl_seconds": -1}, headers=ADMIN)
    assert refused.status_code == 422
    assert (await client.delete(path, headers=ADMIN)).status_code == 204
    assert await internal.events_since(start) == [
        ("CACHE_RULE_CREATED", "cache_rule", created["id"]),
        ("CACHE_RULE_UPDATED", "cache_rule", created["id"]),
        ("CACHE_RULE_DELETED", "cache_rule", created["id"]),
    ]
    audit = await client.get(
        "/api/admin/audit-log", params={"resource_id": created["id"]}, headers=ADMIN
    )
    assert [e["action"] for e in audit.json()["data"]] == [
        "cache_rule.create",
        "cache_rule.update",
        "cache_rule.delete",
    ]


async def test_an_empty_patch_appends_no_event_and_no_audit_row(
    client: Client, world: World, internal: Internal
) -> None:
    created = await create(client, RULES, rule_body(world.org))
    revision = await internal.revision()
    response = await client.patch(f"{RULES}/{created['id']}", json={}, headers=ADMIN)
    assert response.status_code == 200
    assert response.json() == created
    assert await internal.revision() == revision


async def test_a_finance_token_reads_rules_and_changes_none(client: Client, world: World) -> None:
    created = await create(client, RULES, rule_body(world.org))
    finance = bearer((await new_token(client, "finance"))["token"])
    listed = await client.get(RULES, params={"organization_id": world.org}, headers=finance)
    assert [r["id"] for r in listed.json()["data"]] == [created["id"]]
    for method, path, body in (
        ("POST", RULES, rule_body(world.org)),
        ("PATCH", f"{RULES}/{created['id']}", {"enabled": False}),
        ("DELETE", f"{RULES}/{created['id']}", None),
    ):
        response = await client.request(method, path, json=body, headers=finance)
        assert response.status_code == 403, response.text


async def test_a_bound_token_sees_and_changes_only_its_organizations_rules(
    client: Client, world: World
) -> None:
    other = await other_world(client)
    theirs = await create(client, RULES, rule_body(other["org"]))
    headers = bearer((await bound_token(client, world.org))["token"])
    mine = await create(client, RULES, rule_body(world.org), headers)
    listed = await client.get(RULES, headers=headers)
    assert [r["id"] for r in listed.json()["data"]] == [mine["id"]]
    error_of(await client.get(f"{RULES}/{theirs['id']}", headers=headers), 404, "not_found")
    error_of(await client.delete(f"{RULES}/{theirs['id']}", headers=headers), 404, "not_found")
    refused = await client.post(RULES, json=rule_body(other["org"]), headers=headers)
    assert refused.status_code == 404, refused.text


async def test_the_openapi_schema_lists_the_cache_rule_routes(client: Client) -> None:
    paths = (await client.get("/schema/openapi.json")).json()["paths"]
    assert {"get", "post"} <= set(paths[RULES])
    assert {"get", "patch", "delete"} <= set(paths[f"{RULES}/{{rule_id}}"])


@pytest.fixture(scope="module")
def controlplane_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with sqlite_controlplane(tmp_path_factory.mktemp("cache-rules-cli")) as service:
        yield service.url


def test_cache_rule_commands_create_list_update_and_delete(
    controlplane_url: str, tmp_path: Path
) -> None:
    cli = Cli(controlplane_url, clean_env(VKGATE_HOME=str(tmp_path / "empty-home")))
    org = new_org(cli, "acme-cache")
    project = cli.json("projects", "create", "--org", org, "chat")["id"]
    rule = cli.json(
        "cache-rules", "create", "--org", org, "--name", "chat", "--scope", f"project:{project}",
        "--model", "gpt-4o*,claude-*", "--ttl", "600",
    )  # fmt: skip
    assert rule["scope"] == {"kind": "project", "id": project}
    assert (rule["models"], rule["ttl_seconds"], rule["enabled"]) == (
        ["gpt-4o*", "claude-*"],
        600,
        True,
    )
    listing = cli.ok("cache-rules", "list", "--org", org)
    assert header_of(listing) == ["ID", "NAME", "SCOPE", "MODELS", "TTL_SECONDS", "ENABLED"]
    assert rule["id"] in listing
    updated = cli.json("cache-rules", "update", rule["id"], "--disable", "--ttl", "60")
    assert (updated["enabled"], updated["ttl_seconds"]) == (False, 60)
    assert cli.json("cache-rules", "show", rule["id"]) == updated
    assert "--scope" in cli.fails(
        "cache-rules", "create", "--org", org, "--name", "x", "--scope", "end_user",
        "--model", "*", "--ttl", "1",
    )  # fmt: skip
    assert cli.ok("cache-rules", "delete", rule["id"]).strip() == f"deleted {rule['id']}"
    assert cli.json("cache-rules", "list", "--org", org) == []
