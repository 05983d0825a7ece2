"""Admin API access: bearer tokens and their roles, the audit log of every change, the schema."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import World
from tests.support.api import ADMIN, create, error_of, walk_pages
from tests.support.clock import ManualClock
from tests.support.env import ADMIN_TOKEN

Client = httpx.AsyncClient
TOKENS = "/api/admin/tokens"
AUDIT = "/api/admin/audit-log"
ORGS = "/api/admin/organizations"
FAILURES_METRIC = "vkgate_controlplane_admin_auth_failures_total"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def new_token(client: Client, role: str, name: str | None = None) -> dict[str, Any]:
    return await create(client, TOKENS, {"name": name or f"{role}-token", "role": role})


async def auth_failures(client: Client) -> float:
    response = await client.get("/metrics")
    assert response.status_code == 200
    for line in response.text.splitlines():
        if line.startswith(f"{FAILURES_METRIC} "):
            return float(line.split()[1])
    raise AssertionError(f"{FAILURES_METRIC} missing from /metrics")


async def audit_entries(client: Client, **filters: str) -> list[dict[str, Any]]:
    response = await client.get(AUDIT, params={**filters, "limit": "1000"}, headers=ADMIN)
    assert response.status_code == 200, response.text
    entries: list[dict[str, Any]] = response.json()["data"]
    return entries


@pytest.fixture
async def finance(client: Client) -> dict[str, str]:
    """Headers of a finance token."""
    return bearer((await new_token(client, "finance"))["token"])


# Authentication


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer not-the-admin-token-0123456789abcdef"},
        {"Authorization": f"Basic {ADMIN_TOKEN}"},
        {"Authorization": ADMIN_TOKEN},
        {"Authorization": f"Bearer {ADMIN_TOKEN}x"},
        {"X-Api-Key": ADMIN_TOKEN},
    ],
    ids=[
        "none",
        "empty",
        "scheme-only",
        "scheme-and-space",
        "wrong-token",
        "basic-scheme",
        "no-scheme",
        "token-with-suffix",
        "other-header",
    ],
)
async def test_request_without_a_valid_token_is_unauthorized_and_counted(
    client: Client, headers: dict[str, str]
) -> None:
    before = await auth_failures(client)
    response = await client.get(ORGS, headers=headers)
    error = error_of(response, 401, "unauthorized", param=None)
    assert error["type"] == "authentication_error"
    assert response.headers["www-authenticate"] == "Bearer"
    assert await auth_failures(client) == before + 1


async def test_unauthorized_mutation_is_refused_before_its_body_is_read(client: Client) -> None:
    response = await client.post(
        ORGS, content=b"{not json", headers={"content-type": "application/json"}
    )
    error_of(response, 401, "unauthorized")
    assert (await client.get(ORGS, headers=ADMIN)).json()["data"] == []


async def test_valid_requests_do_not_count_as_auth_failures(client: Client) -> None:
    before = await auth_failures(client)
    assert (await client.get(ORGS, headers=ADMIN)).status_code == 200
    assert (
        await client.get(ORGS, headers={"Authorization": f"bearer {ADMIN_TOKEN}"})
    ).status_code == 200
    assert await auth_failures(client) == before


async def test_configured_admin_token_can_read_and_change(client: Client) -> None:
    created = await create(client, ORGS, {"name": "acme"})
    listed = await client.get(ORGS, headers=ADMIN)
    assert [o["id"] for o in listed.json()["data"]] == [created["id"]]


# Admin tokens


async def test_token_create_shows_the_token_once(client: Client, clock: ManualClock) -> None:
    created = await new_token(client, "admin", "ci")
    assert created["id"].startswith("tok_")
    assert created["name"] == "ci"
    assert created["role"] == "admin"
    assert created["token"].startswith("vka-")
    assert len(created["token"]) > 40
    assert created["prefix"] == created["token"][:11]
    assert created["created_at"] == "2026-03-10T12:00:00Z"
    assert created["revoked_at"] is None

    listed = await client.get(TOKENS, headers=ADMIN)
    assert created["token"] not in listed.text
    [row] = listed.json()["data"]
    assert "token" not in row
    assert row == {k: v for k, v in created.items() if k != "token"}


async def test_created_admin_token_can_change_things(client: Client) -> None:
    token = await new_token(client, "admin")
    created = await create(client, ORGS, {"name": "acme"}, headers=bearer(token["token"]))
    assert created["name"] == "acme"


async def test_token_name_is_unique(client: Client) -> None:
    await new_token(client, "admin", "ci")
    response = await client.post(TOKENS, json={"name": "ci", "role": "finance"}, headers=ADMIN)
    error_of(response, 409, "conflict", param="name")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"role": "admin"}, "name"),
        ({"name": "ci"}, "role"),
        ({"name": "", "role": "admin"}, "name"),
        ({"name": "ci", "role": "root"}, "role"),
        ({"name": "ci", "role": "ADMIN"}, "role"),
        ({"name": "ci", "role": 1}, "role"),
        ({"name": "ci", "role": "admin", "expires_at": "2030-01-01T00:00:00Z"}, "expires_at"),
    ],
    ids=[
        "no-name",
        "no-role",
        "empty-name",
        "unknown-role",
        "upper-role",
        "role-number",
        "unknown",
    ],
)
async def test_invalid_token_body_is_refused_naming_the_field(
    client: Client, body: dict[str, Any], param: str
) -> None:
    error_of(await client.post(TOKENS, json=body, headers=ADMIN), 422, "validation_error", param)
    assert (await client.get(TOKENS, headers=ADMIN)).json()["data"] == []


async def test_revoked_token_is_unauthorized_from_then_on(
    client: Client, clock: ManualClock
) -> None:
    token = await new_token(client, "admin")
    headers = bearer(token["token"])
    assert (await client.get(ORGS, headers=headers)).status_code == 200

    clock.advance(90)
    revoked = await client.post(f"{TOKENS}/{token['id']}/revoke", headers=ADMIN)
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["revoked_at"] == "2026-03-10T12:01:30Z"
    assert "token" not in revoked.json()

    before = await auth_failures(client)
    error_of(await client.get(ORGS, headers=headers), 401, "unauthorized")
    error_of(await client.post(ORGS, json={"name": "x"}, headers=headers), 401, "unauthorized")
    assert await auth_failures(client) == before + 2


async def test_revoking_twice_keeps_the_first_revocation_and_audits_it_once(
    client: Client, clock: ManualClock
) -> None:
    token = await new_token(client, "finance")
    path = f"{TOKENS}/{token['id']}/revoke"
    first = await client.post(path, headers=ADMIN)
    clock.advance(60)
    second = await client.post(path, headers=ADMIN)
    assert second.status_code == 200
    assert second.json()["revoked_at"] == first.json()["revoked_at"]
    actions = [e["action"] for e in await audit_entries(client, resource_id=token["id"])]
    assert actions == ["admin_token.create", "admin_token.revoke"]


async def test_a_token_may_revoke_itself(client: Client) -> None:
    token = await new_token(client, "admin")
    headers = bearer(token["token"])
    response = await client.post(f"{TOKENS}/{token['id']}/revoke", headers=headers)
    assert response.status_code == 200
    error_of(await client.get(ORGS, headers=headers), 401, "unauthorized")


async def test_revoking_an_unknown_token_is_not_found(client: Client) -> None:
    error_of(await client.post(f"{TOKENS}/tok_missing/revoke", headers=ADMIN), 404, "not_found")


async def test_token_list_pages_one_at_a_time(client: Client) -> None:
    ids = {(await new_token(client, "finance", f"t{i}"))["id"] for i in range(4)}
    seen = [t["id"] for t in await walk_pages(client, TOKENS)]
    assert sorted(seen) == seen
    assert set(seen) == ids and len(seen) == 4


# Roles


LISTS = [
    ORGS,
    "/api/admin/teams",
    "/api/admin/projects",
    "/api/admin/providers",
    "/api/admin/routing-policies",
    "/api/admin/virtual-keys",
    "/api/admin/budgets",
    "/api/admin/guardrails",
    AUDIT,
]
"""Every list the admin API serves an organization's resources from."""


@pytest.mark.parametrize("path", LISTS)
async def test_finance_token_reads_every_list(
    client: Client, world: World, finance: dict[str, str], path: str
) -> None:
    budget = {
        "organization_id": world.org,
        "scope": {"kind": "organization"},
        "window": "day",
        "limit_usd": "1",
    }
    await create(client, "/api/admin/budgets", budget)
    await create(
        client,
        "/api/admin/guardrails",
        {"organization_id": world.org, "name": "pii", "kind": "pii"},
    )
    response = await client.get(path, headers=finance)
    assert response.status_code == 200, response.text
    assert response.json()["data"]


async def test_finance_token_reads_one_resource(
    client: Client, world: World, finance: dict[str, str]
) -> None:
    response = await client.get(f"/api/admin/providers/{world.provider}", headers=finance)
    assert response.status_code == 200
    assert response.json()["id"] == world.provider


FINANCE_REFUSED: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", ORGS, {"name": "globex"}),
    ("POST", "/api/admin/teams", {"organization_id": "ORG", "name": "new"}),
    ("PATCH", "/api/admin/teams/TEAM", {"limits": {"rpm": 1}}),
    ("POST", "/api/admin/projects", {"organization_id": "ORG", "name": "new"}),
    ("POST", "/api/admin/providers", {"organization_id": "ORG", "name": "n", "kind": "mock"}),
    ("PATCH", "/api/admin/providers/PROVIDER", {"name": "renamed"}),
    ("DELETE", "/api/admin/providers/PROVIDER", None),
    ("PATCH", "/api/admin/routing-policies/POLICY", {"name": "renamed"}),
    ("DELETE", "/api/admin/routing-policies/POLICY", None),
    (
        "POST",
        "/api/admin/budgets",
        {
            "organization_id": "ORG",
            "scope": {"kind": "organization"},
            "window": "day",
            "limit_usd": "1",
        },
    ),
    ("POST", "/api/admin/virtual-keys/KEY/revoke", None),
    ("PATCH", "/api/admin/virtual-keys/KEY", {"name": "renamed"}),
    ("POST", TOKENS, {"name": "escalate", "role": "admin"}),
]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    FINANCE_REFUSED,
    ids=[f"{method} {path}" for method, path, _ in FINANCE_REFUSED],
)
async def test_finance_token_is_forbidden_to_change_anything(
    client: Client,
    world: World,
    finance: dict[str, str],
    method: str,
    path: str,
    body: dict[str, Any] | None,
) -> None:
    ids = {
        "ORG": world.org,
        "TEAM": world.team,
        "PROVIDER": world.provider,
        "POLICY": world.policy,
        "KEY": world.key_id,
    }
    for placeholder, ident in ids.items():
        path = path.replace(placeholder, ident)
    if body is not None:
        body = {k: ids.get(v, v) if isinstance(v, str) else v for k, v in body.items()}
    audit_before = await audit_entries(client)
    failures_before = await auth_failures(client)

    response = await client.request(method, path, json=body, headers=finance)
    error = error_of(response, 403, "forbidden", param=None)
    assert error["type"] == "permission_error"
    assert await audit_entries(client) == audit_before
    assert await auth_failures(client) == failures_before


async def test_finance_token_cannot_even_list_admin_tokens(
    client: Client, finance: dict[str, str]
) -> None:
    error_of(await client.get(TOKENS, headers=finance), 403, "forbidden")


async def test_finance_token_leaves_resources_untouched(
    client: Client, world: World, finance: dict[str, str]
) -> None:
    path = f"/api/admin/providers/{world.provider}"
    assert (await client.delete(path, headers=finance)).status_code == 403
    assert (await client.patch(path, json={"name": "x"}, headers=finance)).status_code == 403
    assert (await client.get(path, headers=ADMIN)).json()["name"] == "openai-main"


# Audit log


async def test_every_mutation_is_audited_in_order_as_the_env_token(
    client: Client, world: World, clock: ManualClock
) -> None:
    budget = await create(
        client,
        "/api/admin/budgets",
        {
            "organization_id": world.org,
            "scope": {"kind": "organization"},
            "window": "day",
            "limit_usd": "1",
        },
    )
    path = f"/api/admin/budgets/{budget['id']}"
    clock.advance(5)
    assert (await client.patch(path, json={"limit_usd": "2"}, headers=ADMIN)).status_code == 200
    assert (await client.delete(path, headers=ADMIN)).status_code == 204
    token = await new_token(client, "finance")
    assert (await client.post(f"{TOKENS}/{token['id']}/revoke", headers=ADMIN)).status_code == 200

    entries = await audit_entries(client)
    assert [(e["action"], e["resource_id"]) for e in entries] == [
        ("organization.create", world.org),
        ("team.create", world.team),
        ("project.create", world.project),
        ("provider.create", world.provider),
        ("routing_policy.create", world.policy),
        ("virtual_key.create", world.key_id),
        ("budget.create", budget["id"]),
        ("budget.update", budget["id"]),
        ("budget.delete", budget["id"]),
        ("admin_token.create", token["id"]),
        ("admin_token.revoke", token["id"]),
    ]
    assert {e["actor"] for e in entries} == {"env"}
    assert [e["at"] for e in entries[:7]] == ["2026-03-10T12:00:00Z"] * 7
    assert {e["at"] for e in entries[7:]} == {"2026-03-10T12:00:05Z"}
    assert [e["organization_id"] for e in entries] == [world.org] * 9 + [None, None]
    assert sorted(e["id"] for e in entries) == [e["id"] for e in entries]


async def test_audit_actor_is_the_token_id_and_never_the_token(
    client: Client, world: World
) -> None:
    token = await new_token(client, "admin", "ops")
    headers = bearer(token["token"])
    org = await create(client, ORGS, {"name": "globex"}, headers=headers)
    renamed = await client.patch(
        f"/api/admin/providers/{world.provider}", json={"name": "renamed"}, headers=headers
    )
    assert renamed.status_code == 200

    by_ops = [e for e in await audit_entries(client) if e["actor"] == token["id"]]
    assert [(e["action"], e["resource_id"]) for e in by_ops] == [
        ("organization.create", org["id"]),
        ("provider.update", world.provider),
    ]
    everything = await client.get(AUDIT, params={"limit": "1000"}, headers=ADMIN)
    assert token["token"] not in everything.text
    assert ADMIN_TOKEN not in everything.text
    assert token["prefix"] not in everything.text


async def test_refused_mutations_leave_no_audit_entry(client: Client, world: World) -> None:
    before = await audit_entries(client)
    refusals = [
        await client.post(ORGS, json={"name": "acme"}, headers=ADMIN),
        await client.post(ORGS, json={"name": ""}, headers=ADMIN),
        await client.delete(f"/api/admin/providers/{world.provider}", headers=ADMIN),
        await client.patch("/api/admin/budgets/bud_missing", json={"name": "x"}, headers=ADMIN),
        await client.post(ORGS, json={"name": "new"}),
    ]
    assert [r.status_code for r in refusals] == [409, 422, 409, 404, 401]
    assert await audit_entries(client) == before


async def test_audit_log_filters_by_organization_and_resource(client: Client, world: World) -> None:
    globex = await create(client, ORGS, {"name": "globex"})
    await create(client, "/api/admin/teams", {"organization_id": globex["id"], "name": "t"})

    theirs = await audit_entries(client, organization_id=globex["id"])
    assert [e["action"] for e in theirs] == ["organization.create", "team.create"]
    ours = await audit_entries(client, organization_id=world.org)
    assert len(ours) == 6
    assert {e["organization_id"] for e in ours} == {world.org}
    [entry] = await audit_entries(client, resource_id=world.key_id)
    assert entry["action"] == "virtual_key.create"
    assert entry["resource_kind"] == "virtual_key"
    assert await audit_entries(client, organization_id=world.org, resource_id=globex["id"]) == []


async def test_audit_log_pages_oldest_first_through_next_cursor(
    client: Client, world: World
) -> None:
    everything = await audit_entries(client)
    seen = await walk_pages(client, AUDIT)
    assert seen == everything
    assert len(seen) == 6

    two = (await client.get(AUDIT, params={"limit": "2"}, headers=ADMIN)).json()
    rest = await client.get(AUDIT, params={"cursor": two["next_cursor"]}, headers=ADMIN)
    assert two["data"] + rest.json()["data"] == everything
    assert rest.json()["next_cursor"] is None


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"cursor": "abc"}, "cursor"),
        # Digits no id can be: past a 64-bit integer, and a digit that is not 0-9.
        ({"cursor": "9" * 30}, "cursor"),
        ({"cursor": "\u00b2"}, "cursor"),
        ({"limit": "0"}, "limit"),
        ({"limit": "x"}, "limit"),
    ],
    ids=["cursor-not-ours", "cursor-too-large", "cursor-superscript", "limit-zero", "limit-nan"],
)
async def test_audit_log_refuses_a_bad_cursor_or_limit(
    client: Client, params: dict[str, str], param: str
) -> None:
    response = await client.get(AUDIT, params=params, headers=ADMIN)
    error_of(response, 422, "validation_error", param=param)


# OpenAPI


async def test_openapi_schema_lists_the_admin_routes_and_hides_the_internal_ones(
    client: Client,
) -> None:
    response = await client.get("/schema/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["info"]["title"] == "vkgate control plane"
    paths = schema["paths"]
    for path, methods in {
        "/api/admin/organizations": {"get", "post"},
        "/api/admin/organizations/{organization_id}": {"get"},
        "/api/admin/teams": {"get", "post"},
        "/api/admin/teams/{team_id}": {"get", "patch"},
        "/api/admin/projects": {"get", "post"},
        "/api/admin/providers": {"get", "post"},
        "/api/admin/providers/{provider_id}": {"get", "patch", "delete"},
        "/api/admin/routing-policies": {"get", "post"},
        "/api/admin/routing-policies/{policy_id}": {"get", "patch", "delete"},
        "/api/admin/budgets": {"get", "post"},
        "/api/admin/budgets/{budget_id}": {"get", "patch", "delete"},
        "/api/admin/tokens": {"get", "post"},
        "/api/admin/tokens/{token_id}/revoke": {"post"},
        "/api/admin/audit-log": {"get"},
    }.items():
        assert methods <= set(paths[path]), path
    assert not [p for p in paths if p.startswith("/api/internal")]
    assert "ProviderCreate" in schema["components"]["schemas"]
