"""Security properties of the control plane: roles, secrets, organization scope, signatures,
token lookups and failed-authentication throttling, each through real HTTP calls."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import pytest
from litestar import Litestar
from sqlalchemy import event, select

from controlplane.app import create_app
from controlplane.db import Database
from controlplane.models import AdminToken
from controlplane.settings import ControlPlaneSettings
from tests.conftest import Internal, World, seed_world, serve_in_loop, signed_get
from tests.support.api import ADMIN, create, error_of
from tests.support.captured import Captured, controlplane_logs
from tests.support.clock import ManualClock
from tests.support.env import ADMIN_TOKEN, INTERNAL_SECRET, secrets_env
from tests.support.ledger import SPEND_COMMANDS, ledger_rows, request, segment
from tests.test_admin_auth import AUDIT, LISTS
from vkgate import signing
from vkgate.env import SettingError
from vkgate.errors import ERRORS, ErrorCode
from vkgate.spend import SpendAck, SpendRecord

Client = httpx.AsyncClient
TOKENS = "/api/admin/tokens"
MUTATING = {"post", "put", "patch", "delete"}
API_KEY_SECRET = "sk-distinctive-api-key-3f9a1c77e2b84d05"
HEADER_SECRET = "hdr-distinctive-header-secret-91c2d7"
ROTATED_SECRET = "sk-distinctive-rotated-key-0a6e5b42f1"
PLACEHOLDER = re.compile(r"\{(\w+)\}")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_contract_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The contract's error body: exactly `{"error": {message, type, code, param}}`."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "code", "param"}, error
    assert error["code"] == code
    assert error["type"] == ERRORS[ErrorCode(code)].openai_type
    return error


async def audit_log(client: Client) -> list[dict[str, Any]]:
    response = await client.get(AUDIT, params={"limit": "1000"}, headers=ADMIN)
    assert response.status_code == 200, response.text
    entries: list[dict[str, Any]] = response.json()["data"]
    return entries


@dataclass
class Org(World):
    """An organization with one of each resource, a budget too, made through the admin API."""

    budget: str = ""
    guardrail: str = ""
    cache_rule: str = ""

    @property
    def id(self) -> str:
        return self.org


async def seed_org(client: Client, name: str, provider: dict[str, Any] | None = None) -> Org:
    world = await seed_world(client, provider or {"name": "mock", "kind": "mock"}, "small", name)
    budget = (
        await create(
            client,
            "/api/admin/budgets",
            {
                "organization_id": world.org,
                "scope": {"kind": "team", "id": world.team},
                "window": "month",
                "limit_usd": "10",
                "provider_id": world.provider,
            },
        )
    )["id"]
    guardrail = (
        await create(
            client,
            "/api/admin/guardrails",
            {
                "organization_id": world.org,
                "name": "secrets",
                "kind": "secrets",
                "scope": {"kind": "project", "id": world.project},
            },
        )
    )["id"]
    cache_rule = (
        await create(
            client,
            "/api/admin/cache-rules",
            {
                "organization_id": world.org,
                "name": "small",
                "scope": {"kind": "project", "id": world.project},
                "models": ["small"],
                "ttl_seconds": 60,
            },
        )
    )["id"]
    return Org(
        **dataclasses.asdict(world), budget=budget, guardrail=guardrail, cache_rule=cache_rule
    )


async def openapi_operations(client: Client) -> list[tuple[str, str]]:
    """(method, path template) of every documented operation under /api/."""
    response = await client.get("/schema/openapi.json")
    assert response.status_code == 200
    return [
        (method.upper(), path)
        for path, item in response.json()["paths"].items()
        if path.startswith("/api/")
        for method in item
        if method in MUTATING | {"get"}
    ]


def fill(template: str, ids: dict[str, str]) -> str:
    return PLACEHOLDER.sub(lambda m: ids[m.group(1)], template)


def path_ids(org: Org, token_id: str) -> dict[str, str]:
    return {
        "organization_id": org.id,
        "team_id": org.team,
        "project_id": org.project,
        "provider_id": org.provider,
        "policy_id": org.policy,
        "vk_id": org.key_id,
        "budget_id": org.budget,
        "guardrail_id": org.guardrail,
        "rule_id": org.cache_rule,
        "token_id": token_id,
    }


async def everything_readable(client: Client, org: Org) -> dict[str, str]:
    """Each admin list and single resource as the unbound admin token reads it."""
    paths = [
        *LISTS,
        TOKENS,
        f"/api/admin/teams/{org.team}",
        f"/api/admin/providers/{org.provider}",
        f"/api/admin/routing-policies/{org.policy}",
        f"/api/admin/virtual-keys/{org.key_id}",
        f"/api/admin/budgets/{org.budget}",
        f"/api/admin/guardrails/{org.guardrail}",
        f"/api/admin/cache-rules/{org.cache_rule}",
    ]
    return {path: (await client.get(path, headers=ADMIN)).text for path in paths}


# --- a finance token changes nothing, whatever the route -----------------------------------------


@pytest.mark.parametrize("bound", [False, True], ids=["unbound", "bound-to-the-org"])
async def test_finance_token_is_forbidden_every_documented_mutation(
    client: Client, bound: bool
) -> None:
    org = await seed_org(client, "acme")
    body = {"name": "auditor", "role": "finance"} | ({"organization_id": org.id} if bound else {})
    finance = await create(client, TOKENS, body)
    spare = await create(client, TOKENS, {"name": "spare", "role": "finance"})
    ids = path_ids(org, spare["id"])
    writes = [(m, p) for m, p in await openapi_operations(client) if m.lower() in MUTATING]
    assert len(writes) >= 20, writes
    audit_before = await audit_log(client)
    state_before = await everything_readable(client, org)

    refused: dict[str, int] = {}
    for method, template in writes:
        response = await client.request(
            method, fill(template, ids), json={}, headers=bearer(finance["token"])
        )
        refused[f"{method} {template}"] = response.status_code
        if response.status_code == 403:
            assert_contract_error(response, 403, "forbidden")

    assert refused == dict.fromkeys(refused, 403)
    assert await audit_log(client) == audit_before
    assert await everything_readable(client, org) == state_before


# --- credentials and secrets are shown once, or never -------------------------------------------


async def test_provider_credentials_keys_and_tokens_never_come_back_from_any_read(
    client: Client, internal: Internal
) -> None:
    provider = {
        "name": "openai",
        "kind": "openai",
        "api_key": API_KEY_SECRET,
        "headers": {"X-Org-Secret": HEADER_SECRET},
    }
    org = await seed_org(client, "acme", provider)
    created_provider = await client.get(f"/api/admin/providers/{org.provider}", headers=ADMIN)
    assert created_provider.json()["has_api_key"] is True
    assert created_provider.json()["header_names"] == ["X-Org-Secret"]
    patched = await client.patch(
        f"/api/admin/providers/{org.provider}", json={"api_key": ROTATED_SECRET}, headers=ADMIN
    )
    assert patched.status_code == 200
    rotated = await client.post(
        f"/api/admin/virtual-keys/{org.key_id}/rotate", json={"grace_seconds": 0}, headers=ADMIN
    )
    assert rotated.status_code == 200
    admin_token = await create(client, TOKENS, {"name": "ops", "role": "admin"})
    finance = await create(client, TOKENS, {"name": "auditor", "role": "finance"})
    never = [
        API_KEY_SECRET,
        HEADER_SECRET,
        ROTATED_SECRET,
        org.key,
        rotated.json()["key"],
        admin_token["token"],
        finance["token"],
        ADMIN_TOKEN,
    ]
    # Answers to the writes that carried a credential in do not echo it.
    for answer in (patched.text, rotated.text.replace(rotated.json()["key"], "")):
        assert not [s for s in never if s in answer]

    ids = path_ids(org, admin_token["id"])
    reads = [p for m, p in await openapi_operations(client) if m == "GET"]
    assert len(reads) >= 15, reads
    variants: list[dict[str, str]] = [
        {"limit": "1000"},
        {"organization_id": org.id, "limit": "1000"},
        {"organization_id": org.id, "limit": "1000", "format": "csv"},
    ]
    seen = 0
    for template in reads:
        path = fill(template, ids)
        for caller in (ADMIN, bearer(admin_token["token"]), bearer(finance["token"])):
            for params in variants:
                response = await client.get(path, params=params, headers=caller)
                # 403: finance listing tokens; 422: spend without an organization.
                assert response.status_code in (200, 403, 422), (path, response.text)
                seen += response.status_code == 200
                shown = response.text + json.dumps(dict(response.headers))
                assert not [s for s in never if s in shown], path
    assert seen >= 2 * 2 * len(reads)

    # The proxy's bundle carries the credential, so only a signed request gets it: the admin
    # token alone does not.
    config = f"/api/internal/gateway/config/{org.key_id}"
    bundle = await internal.call("GET", config)
    assert bundle.status_code == 200 and ROTATED_SECRET in bundle.text
    for caller in (ADMIN, bearer(admin_token["token"])):
        refused = await client.get(config, headers=caller)
        assert_contract_error(refused, 401, "bad_signature")
        assert ROTATED_SECRET not in refused.text


async def test_a_virtual_key_and_an_admin_token_are_shown_only_in_their_creation(
    client: Client, world: World
) -> None:
    token = await create(client, TOKENS, {"name": "ops", "role": "admin"})
    listings = [
        await client.get("/api/admin/virtual-keys", headers=ADMIN),
        await client.get(f"/api/admin/virtual-keys/{world.key_id}", headers=ADMIN),
        await client.get(TOKENS, headers=ADMIN),
        await client.get(AUDIT, headers=ADMIN),
    ]
    assert all(r.status_code == 200 for r in listings)
    for response in listings:
        assert world.key not in response.text
        assert token["token"] not in response.text
    # The prefix shown afterwards is only a prefix: too short to be the secret.
    [row] = (await client.get(TOKENS, headers=ADMIN)).json()["data"]
    assert token["token"].startswith(row["prefix"]) and len(row["prefix"]) < 16


# --- an organization-bound token stays inside its organization ---------------------------------


@dataclass
class Scoped:
    client: Client
    a: Org
    b: Org
    token: dict[str, Any]

    @property
    def headers(self) -> dict[str, str]:
        return bearer(self.token["token"])


@pytest.fixture
async def scoped(client: Client) -> Scoped:
    a = await seed_org(client, "acme")
    b = await seed_org(client, "globex")
    token = await create(
        client, TOKENS, {"name": "acme-ops", "role": "admin", "organization_id": a.id}
    )
    return Scoped(client, a, b, token)


def same_refusal(theirs: httpx.Response, missing: httpx.Response, ident: str) -> None:
    """`theirs` (naming another organization's `ident`) answers as `missing` (naming an id
    that does not exist) does: same status, code, type and param; the message differs only
    by the id it names."""
    assert theirs.status_code == missing.status_code, (theirs.text, missing.text)
    a, b = theirs.json()["error"], missing.json()["error"]
    assert {**a, "message": None} == {**b, "message": None}
    assert a["message"].replace(ident, "<id>") == re.sub(r"'[^']*_missing'", "'<id>'", b["message"])


MISSING = "nope_missing"

# (method, path template, the `Org` field naming the resource, body) of every route that names
# one resource in its path: {id} becomes the other organization's, or an id that exists nowhere.
SINGLE_RESOURCE: list[tuple[str, str, str, dict[str, Any] | None]] = [
    ("GET", "/api/admin/organizations/{id}", "id", None),
    ("GET", "/api/admin/teams/{id}", "team", None),
    ("PATCH", "/api/admin/teams/{id}", "team", {"name": "taken-over"}),
    ("GET", "/api/admin/projects/{id}", "project", None),
    ("GET", "/api/admin/providers/{id}", "provider", None),
    ("PATCH", "/api/admin/providers/{id}", "provider", {"name": "taken-over"}),
    ("DELETE", "/api/admin/providers/{id}", "provider", None),
    ("GET", "/api/admin/routing-policies/{id}", "policy", None),
    ("PATCH", "/api/admin/routing-policies/{id}", "policy", {"name": "taken-over"}),
    ("DELETE", "/api/admin/routing-policies/{id}", "policy", None),
    ("GET", "/api/admin/virtual-keys/{id}", "key_id", None),
    ("PATCH", "/api/admin/virtual-keys/{id}", "key_id", {"name": "taken-over"}),
    ("POST", "/api/admin/virtual-keys/{id}/rotate", "key_id", {"grace_seconds": 0}),
    ("POST", "/api/admin/virtual-keys/{id}/revoke", "key_id", None),
    ("POST", "/api/admin/virtual-keys/{id}/disable", "key_id", None),
    ("POST", "/api/admin/virtual-keys/{id}/enable", "key_id", None),
    ("GET", "/api/admin/budgets/{id}", "budget", None),
    ("PATCH", "/api/admin/budgets/{id}", "budget", {"limit_usd": "1"}),
    ("DELETE", "/api/admin/budgets/{id}", "budget", None),
]


async def test_another_organizations_resources_answer_as_missing_ones_and_stay_unchanged(
    scoped: Scoped,
) -> None:
    client, b = scoped.client, scoped.b
    before = await everything_readable(client, b)
    audit_before = await audit_log(client)

    for method, template, field, body in SINGLE_RESOURCE:
        ident = getattr(b, field)
        theirs = await client.request(
            method, template.format(id=ident), json=body, headers=scoped.headers
        )
        missing = await client.request(
            method, template.format(id=MISSING), json=body, headers=scoped.headers
        )
        assert_contract_error(theirs, 404, "not_found")
        same_refusal(theirs, missing, ident)

    assert await everything_readable(client, b) == before
    assert await audit_log(client) == audit_before


def creations(a: Org, b: Org) -> list[tuple[str, str, dict[str, Any], str, str]]:
    """(method, path, body, the other organization's id it names, the param refused)."""
    budget = {"organization_id": a.id, "scope": {"kind": "organization"}, "window": "day"}
    return [
        (
            "POST",
            "/api/admin/teams",
            {"organization_id": b.id, "name": "t"},
            b.id,
            "organization_id",
        ),
        (
            "POST",
            "/api/admin/projects",
            {"organization_id": b.id, "name": "p"},
            b.id,
            "organization_id",
        ),
        (
            "POST",
            "/api/admin/projects",
            {"organization_id": a.id, "name": "p", "team_id": b.team},
            b.team,
            "team_id",
        ),
        (
            "POST",
            "/api/admin/providers",
            {"organization_id": b.id, "name": "p", "kind": "mock"},
            b.id,
            "organization_id",
        ),
        (
            "POST",
            "/api/admin/routing-policies",
            {
                "organization_id": b.id,
                "name": "r",
                "aliases": {"x": [{"provider_id": a.provider, "model": "m"}]},
            },
            b.id,
            "organization_id",
        ),
        (
            "POST",
            "/api/admin/routing-policies",
            {
                "organization_id": a.id,
                "name": "r",
                "aliases": {"x": [{"provider_id": b.provider, "model": "m"}]},
            },
            b.provider,
            "aliases.x[0].provider_id",
        ),
        (
            "PATCH",
            f"/api/admin/routing-policies/{a.policy}",
            {"aliases": {"fast": [{"provider_id": b.provider, "model": "m"}]}},
            b.provider,
            "aliases.fast[0].provider_id",
        ),
        (
            "POST",
            "/api/admin/virtual-keys",
            {"project_id": b.project, "name": "k", "routing_policy_id": a.policy},
            b.project,
            "project_id",
        ),
        (
            "POST",
            "/api/admin/virtual-keys",
            {"project_id": a.project, "name": "k", "routing_policy_id": b.policy},
            b.policy,
            "routing_policy_id",
        ),
        (
            "PATCH",
            f"/api/admin/virtual-keys/{a.key_id}",
            {"routing_policy_id": b.policy},
            b.policy,
            "routing_policy_id",
        ),
        (
            "POST",
            "/api/admin/budgets",
            {**budget, "organization_id": b.id, "limit_usd": "1"},
            b.id,
            "organization_id",
        ),
        (
            "POST",
            "/api/admin/budgets",
            {**budget, "scope": {"kind": "team", "id": b.team}, "limit_usd": "1"},
            b.team,
            "scope.id",
        ),
        (
            "POST",
            "/api/admin/budgets",
            {**budget, "scope": {"kind": "virtual_key", "id": b.key_id}, "limit_usd": "1"},
            b.key_id,
            "scope.id",
        ),
        (
            "POST",
            "/api/admin/budgets",
            {**budget, "provider_id": b.provider, "limit_usd": "1"},
            b.provider,
            "provider_id",
        ),
        (
            "POST",
            "/api/admin/guardrails",
            {"organization_id": b.id, "name": "g", "kind": "pii"},
            b.id,
            "organization_id",
        ),
        (
            "POST",
            "/api/admin/guardrails",
            {
                "organization_id": a.id,
                "name": "g",
                "kind": "pii",
                "scope": {"kind": "project", "id": b.project},
            },
            b.project,
            "scope.id",
        ),
        (
            "POST",
            "/api/admin/guardrails",
            {
                "organization_id": a.id,
                "name": "g",
                "kind": "moderation",
                "config": {"provider_id": b.provider},
            },
            b.provider,
            "config.provider_id",
        ),
        (
            "PATCH",
            f"/api/admin/budgets/{a.budget}",
            {"provider_id": b.provider},
            b.provider,
            "provider_id",
        ),
    ]


async def test_a_write_naming_another_organizations_id_is_refused_as_if_it_did_not_exist(
    scoped: Scoped,
) -> None:
    client = scoped.client
    audit_before = await audit_log(client)
    for method, path, body, ident, param in creations(scoped.a, scoped.b):
        theirs = await client.request(method, path, json=body, headers=scoped.headers)
        error = assert_contract_error(theirs, 404, "not_found")
        assert error["param"] == param, (path, body, error)
        as_missing = json.loads(json.dumps(body).replace(ident, MISSING))
        missing = await client.request(method, path, json=as_missing, headers=scoped.headers)
        same_refusal(theirs, missing, ident)
    assert await audit_log(client) == audit_before


@pytest.mark.parametrize("role", ["admin", "finance"])
async def test_lists_and_the_audit_log_show_only_the_tokens_organization(
    client: Client, role: str
) -> None:
    a = await seed_org(client, "acme")
    b = await seed_org(client, "globex")
    token = await create(client, TOKENS, {"name": "t", "role": role, "organization_id": a.id})
    for path in LISTS:
        response = await client.get(path, params={"limit": "1000"}, headers=bearer(token["token"]))
        assert response.status_code == 200, response.text
        rows = response.json()["data"]
        assert rows, path
        owners = {row.get("organization_id", row["id"]) for row in rows}
        assert owners == {a.id}, path
        assert b.id not in response.text
        if path == "/api/admin/organizations":
            continue  # no filter there: the token's own organization is all it lists
        narrowed = await client.get(
            path, params={"organization_id": b.id}, headers=bearer(token["token"])
        )
        assert narrowed.status_code == 200 and narrowed.json()["data"] == [], path


async def test_spend_reads_are_limited_to_the_tokens_organization(
    scoped: Scoped, clock: ManualClock, internal: Internal
) -> None:
    client, a, b = scoped.client, scoped.a, scoped.b
    for org in (a, b):
        records = served(org, clock, "small", "mock", 10, 5)
        shipped = await internal.call("POST", SPEND_COMMANDS, msgspec.to_builtins(segment(records)))
        assert shipped.status_code == 200, shipped.text

    for route in ("/api/spend/report", "/api/spend/ledger"):
        own = await client.get(route, headers=scoped.headers)
        assert own.status_code == 200, own.text
        explicit = await client.get(route, params={"organization_id": a.id}, headers=scoped.headers)
        assert own.json() == explicit.json()
        assert b.id not in own.text and b.key_id not in own.text
        theirs = await client.get(route, params={"organization_id": b.id}, headers=scoped.headers)
        missing = await client.get(
            route, params={"organization_id": MISSING}, headers=scoped.headers
        )
        assert_contract_error(theirs, 404, "not_found")
        same_refusal(theirs, missing, b.id)
    rows = (await client.get("/api/spend/ledger", headers=scoped.headers)).json()["data"]
    assert rows and {r["organization_id"] for r in rows} == {a.id}
    # An unbound token still has to say which organization.
    unbound = await client.get("/api/spend/report", headers=ADMIN)
    error = assert_contract_error(unbound, 422, "validation_error")
    assert error["param"] == "organization_id"


async def test_a_bound_token_cannot_make_organizations_or_touch_admin_tokens(
    scoped: Scoped,
) -> None:
    client = scoped.client
    other = await create(client, TOKENS, {"name": "other", "role": "finance"})
    attempts = [
        ("POST", "/api/admin/organizations", {"name": "initech"}),
        ("GET", TOKENS, None),
        ("POST", TOKENS, {"name": "escalate", "role": "admin"}),
        ("POST", TOKENS, {"name": "sibling", "role": "admin", "organization_id": scoped.a.id}),
        ("POST", f"{TOKENS}/{other['id']}/revoke", None),
        ("POST", f"{TOKENS}/{scoped.token['id']}/revoke", None),
    ]
    audit_before = await audit_log(client)
    for method, path, body in attempts:
        response = await client.request(method, path, json=body, headers=scoped.headers)
        assert_contract_error(response, 403, "forbidden")
    assert await audit_log(client) == audit_before
    listed = await client.get(TOKENS, headers=ADMIN)
    assert {t["name"] for t in listed.json()["data"]} == {"acme-ops", "other"}
    assert all(t["revoked_at"] is None for t in listed.json()["data"])


# --- the internal API: signatures bind method, path, body and time --------------------------------


async def test_a_signature_for_one_keys_bundle_does_not_fetch_another(
    scoped: Scoped, clock: ManualClock
) -> None:
    client = scoped.client
    signed_for_a = signing.signed_headers(
        INTERNAL_SECRET,
        "GET",
        f"/api/internal/gateway/config/{scoped.a.key_id}",
        b"",
        clock.time(),
    )
    own = await client.get(f"/api/internal/gateway/config/{scoped.a.key_id}", headers=signed_for_a)
    assert own.status_code == 200
    other = await client.get(
        f"/api/internal/gateway/config/{scoped.b.key_id}", headers=signed_for_a
    )
    assert_contract_error(other, 401, "bad_signature")
    assert scoped.b.key_id not in other.text


def served(
    world: World, clock: ManualClock, model: str, kind: str, tokens_in: int, tokens_out: int
) -> list[SpendRecord]:
    """The records of one request of `world`'s key, served by its provider now."""
    return request(
        clock.now(),
        organization_id=world.org,
        team_id=world.team,
        project_id=world.project,
        virtual_key_id=world.key_id,
        model="fast",
        upstream_model=model,
        served_model=model,
        provider_id=world.provider,
        provider_kind=kind,
        input_tokens=tokens_in,
        output_tokens=tokens_out,
    )


def spend_segment(world: World, clock: ManualClock) -> bytes:
    return msgspec.json.encode(segment(served(world, clock, "gpt-4o-mini", "openai", 100, 20)))


def signed_upload(
    body: bytes, clock: ManualClock, *, secret: str = INTERNAL_SECRET, ago_s: float = 0.0
) -> dict[str, str]:
    """The headers a proxy sends the spend segment `body` with, signed with `secret` `ago_s`
    seconds ago."""
    at = clock.time() - ago_s
    headers = signing.signed_headers(secret, "POST", SPEND_COMMANDS, body, at)
    return {**headers, "content-type": "application/json"}


async def test_a_captured_spend_upload_replayed_changes_nothing_and_is_refused_once_stale(
    client: Client, world: World, clock: ManualClock
) -> None:
    body = spend_segment(world, clock)
    captured = signed_upload(body, clock)
    first = await client.post(SPEND_COMMANDS, content=body, headers=captured)
    assert first.status_code == 200, first.text
    accepted = msgspec.json.decode(first.content, type=SpendAck).accepted
    rows = await ledger_rows(client, world.org)
    assert accepted > 0 and rows

    clock.advance(240)  # inside the 300 s window: the same bytes, the same headers
    replayed = await client.post(SPEND_COMMANDS, content=body, headers=captured)
    assert replayed.status_code == 200, replayed.text
    ack = msgspec.json.decode(replayed.content, type=SpendAck)
    assert (ack.accepted, ack.duplicates) == (0, accepted)
    assert await ledger_rows(client, world.org) == rows

    clock.advance(61)  # now 301 s after signing
    stale = await client.post(SPEND_COMMANDS, content=body, headers=captured)
    assert_contract_error(stale, 401, "bad_signature")
    assert "skew" in stale.json()["error"]["message"]
    assert await ledger_rows(client, world.org) == rows


async def test_a_captured_signature_does_not_carry_another_body_or_route(
    client: Client, world: World, clock: ManualClock
) -> None:
    body = spend_segment(world, clock)
    captured = signed_upload(body, clock)
    other_body = spend_segment(world, clock)
    altered = await client.post(SPEND_COMMANDS, content=other_body, headers=captured)
    assert_contract_error(altered, 401, "bad_signature")
    elsewhere = await client.post(
        "/api/internal/gateway/resolve-key", content=body, headers=captured
    )
    assert_contract_error(elsewhere, 401, "bad_signature")
    other_secret = signed_upload(body, clock, secret="another-secret-of-32-characters-or-more")
    forged = await client.post(SPEND_COMMANDS, content=body, headers=other_secret)
    assert_contract_error(forged, 401, "bad_signature")
    assert await ledger_rows(client, world.org) == []
    health = await signed_get(client, clock, "/api/internal/gateway/health")
    assert health.status_code == 200


# --- admin tokens are looked up by their peppered hash, never by their text ------------------------


async def test_an_admin_token_is_stored_and_looked_up_only_by_its_hash(
    client: Client, clean_database: Database
) -> None:
    token = await create(client, TOKENS, {"name": "ops", "role": "finance"})
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        statements.append(f"{statement} {parameters!r}")

    engine = clean_database.engine.sync_engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        response = await client.get("/api/admin/organizations", headers=bearer(token["token"]))
    finally:
        event.remove(engine, "before_cursor_execute", seen)

    assert response.status_code == 200
    async with clean_database.transaction() as session:
        row = (await session.scalars(select(AdminToken))).one()
    assert token["token"] not in json.dumps(
        {c.name: str(getattr(row, c.key)) for c in AdminToken.__mapper__.columns}
    )
    assert any(row.token_hash in s for s in statements)
    assert not [s for s in statements if token["token"] in s]


# --- failed admin authentication: logged once an episode, throttled per address ------------------

LIMIT = 3


@pytest.fixture
def logged() -> Iterator[Captured]:
    with controlplane_logs() as captured:
        yield captured


@pytest.fixture
def strict_app(
    settings: ControlPlaneSettings, clock: ManualClock, clean_database: Database
) -> Litestar:
    clock.freeze()
    tight = dataclasses.replace(settings, admin_auth_failures_per_minute=LIMIT)
    return create_app(tight, clock=clock, database=clean_database)


@pytest.fixture
async def strict(strict_app: Litestar) -> AsyncIterator[Client]:
    async with serve_in_loop(strict_app, "http://controlplane.test") as http:
        yield http


def from_address(app: Litestar, host: str) -> Client:
    """Another client of the running `app`, as seen from `host`."""
    transport = httpx.ASGITransport(app=app, client=(host, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://controlplane.test")


WRONG = bearer("vka-wrong-token-guess-0123456789abcdefghijk")


async def test_an_address_failing_too_often_gets_429_until_its_minute_is_over(
    strict_app: Litestar, strict: Client, clock: ManualClock, logged: Captured
) -> None:
    hasher = strict_app.state["vk"].hasher
    for _ in range(LIMIT):
        error_of(await strict.get("/api/admin/organizations", headers=WRONG), 401, "unauthorized")

    lookups: list[str] = []
    real = hasher.of_secret
    hasher.of_secret = lambda presented: lookups.append(presented) or real(presented)
    throttled = [
        await strict.get("/api/admin/organizations", headers=WRONG),
        await strict.get("/api/admin/organizations", headers=ADMIN),
        await strict.post("/api/admin/organizations", json={"name": "x"}, headers=ADMIN),
    ]
    for response in throttled:
        error = assert_contract_error(response, 429, "rate_limited")
        assert response.headers["retry-after"] == "60"
        assert ADMIN_TOKEN not in error["message"]
    assert lookups == []  # refused before any token was hashed or looked up

    async with from_address(strict_app, "192.0.2.7") as elsewhere:
        assert (await elsewhere.get("/api/admin/organizations", headers=ADMIN)).status_code == 200

    clock.elapse(59)
    late = await strict.get("/api/admin/organizations", headers=ADMIN)
    assert_contract_error(late, 429, "rate_limited")
    assert late.headers["retry-after"] == "1"
    clock.elapse(1)
    assert (await strict.get("/api/admin/organizations", headers=ADMIN)).status_code == 200
    # A new minute: the address again has its whole allowance of failures.
    for _ in range(LIMIT):
        error_of(await strict.get("/api/admin/organizations", headers=WRONG), 401, "unauthorized")
    assert_contract_error(
        await strict.get("/api/admin/organizations", headers=ADMIN), 429, "rate_limited"
    )

    # Only the 401s count as failures: a throttled request's token was never looked at.
    metrics = (await strict.get("/metrics")).text
    assert "vkgate_controlplane_admin_auth_failures_total 6.0" in metrics


async def test_failed_authentication_is_logged_once_an_episode_with_the_address_only(
    strict_app: Litestar, strict: Client, clock: ManualClock, logged: Captured
) -> None:
    for _ in range(LIMIT + 2):
        await strict.get("/api/admin/organizations", headers=WRONG)
    await strict.get("/api/admin/organizations")
    async with from_address(strict_app, "192.0.2.7") as elsewhere:
        await elsewhere.get("/api/admin/organizations", headers=WRONG)
    clock.elapse(60)
    await strict.get("/api/admin/organizations", headers={"Authorization": "Basic eDp5"})

    failed = logged.events("admin_auth_failed")
    assert [(e["address"], e["reason"]) for e in failed] == [
        ("127.0.0.1", "invalid"),
        ("192.0.2.7", "invalid"),
        ("127.0.0.1", "missing"),
    ]
    [throttled] = logged.events("admin_auth_throttled")
    assert throttled["address"] == "127.0.0.1" and throttled["level"] == "warning"
    text = logged.stream.getvalue()
    assert WRONG["Authorization"].removeprefix("Bearer ") not in text
    assert "eDp5" not in text


async def test_a_revoked_token_counts_as_a_failure(strict: Client, logged: Captured) -> None:
    token = await create(strict, TOKENS, {"name": "ops", "role": "admin"})
    revoked = await strict.post(f"{TOKENS}/{token['id']}/revoke", headers=ADMIN)
    assert revoked.status_code == 200
    for _ in range(LIMIT):
        error_of(
            await strict.get("/api/admin/organizations", headers=bearer(token["token"])),
            401,
            "unauthorized",
        )
    assert_contract_error(
        await strict.get("/api/admin/organizations", headers=ADMIN), 429, "rate_limited"
    )
    assert [e["reason"] for e in logged.events("admin_auth_failed")] == ["revoked"]


async def test_forbidden_and_successful_requests_never_throttle(strict: Client) -> None:
    finance = await create(strict, TOKENS, {"name": "auditor", "role": "finance"})
    for _ in range(LIMIT * 2):
        refused = await strict.post(
            "/api/admin/organizations", json={"name": "x"}, headers=bearer(finance["token"])
        )
        assert_contract_error(refused, 403, "forbidden")
        assert (await strict.get("/api/admin/teams", headers=ADMIN)).status_code == 200
    assert (
        await strict.get("/api/admin/teams", headers=bearer(finance["token"]))
    ).status_code == 200


async def test_behind_a_trusted_ingress_each_client_is_throttled_apart(
    settings: ControlPlaneSettings, clock: ManualClock, clean_database: Database
) -> None:
    clock.freeze()
    behind = dataclasses.replace(
        settings,
        admin_auth_failures_per_minute=LIMIT,
        trusted_proxy_cidrs=("10.0.0.0/8",),
    )
    app = create_app(behind, clock=clock, database=clean_database)
    async with (
        serve_in_loop(app, "http://controlplane.test"),
        from_address(app, "10.1.2.3") as ingress,
    ):

        def via(client: str, token: dict[str, str]) -> dict[str, str]:
            return {**token, "X-Forwarded-For": client}

        for _ in range(LIMIT):
            guess = await ingress.get("/api/admin/organizations", headers=via("203.0.113.9", WRONG))
            error_of(guess, 401, "unauthorized")
        refused = await ingress.get("/api/admin/organizations", headers=via("203.0.113.9", ADMIN))
        assert_contract_error(refused, 429, "rate_limited")
        # The guesser is held back; the admin behind the same ingress is not.
        served = await ingress.get("/api/admin/organizations", headers=via("198.51.100.4", ADMIN))
        assert served.status_code == 200
        # A header from an untrusted peer names nobody: the peer itself is counted.
        async with from_address(app, "192.0.2.50") as direct:
            for _ in range(LIMIT):
                spoofed = via(f"198.51.100.{_}", WRONG)
                error_of(
                    await direct.get("/api/admin/organizations", headers=spoofed),
                    401,
                    "unauthorized",
                )
            last = await direct.get("/api/admin/organizations", headers=via("198.51.100.99", ADMIN))
            assert_contract_error(last, 429, "rate_limited")


def test_the_throttle_setting_is_validated_and_known() -> None:
    base = secrets_env("sqlite:///unused.db")
    default = ControlPlaneSettings.from_env(base)
    assert default.admin_auth_failures_per_minute == 30
    chosen = {**base, "VKGATE_ADMIN_AUTH_FAILURES_PER_MINUTE": "5"}
    assert ControlPlaneSettings.from_env(chosen).admin_auth_failures_per_minute == 5
    for bad in ("0", "-1", "many"):
        with pytest.raises(SettingError, match="VKGATE_ADMIN_AUTH_FAILURES_PER_MINUTE"):
            ControlPlaneSettings.from_env({**base, "VKGATE_ADMIN_AUTH_FAILURES_PER_MINUTE": bad})
    behind = {**base, "VKGATE_TRUSTED_PROXY_CIDRS": "10.0.0.0/8, 2001:db8::1"}
    assert ControlPlaneSettings.from_env(behind).trusted_proxy_cidrs == (
        "10.0.0.0/8",
        "2001:db8::1/128",
    )
    with pytest.raises(SettingError, match="VKGATE_TRUSTED_PROXY_CIDRS"):
        ControlPlaneSettings.from_env({**base, "VKGATE_TRUSTED_PROXY_CIDRS": "10.0.0.0/33"})


REFUSED_PROVIDER_BODIES: dict[str, dict[str, Any]] = {
    "mock-with-a-key": {"kind": "mock", "api_key": API_KEY_SECRET},
    "key-too-long": {"kind": "openai", "api_key": API_KEY_SECRET * 300},
    "key-not-text": {"kind": "openai", "api_key": {"value": API_KEY_SECRET}},
    "key-in-a-list": {"kind": "openai", "api_key": [API_KEY_SECRET]},
    "header-value-not-text": {
        "kind": "openai",
        "api_key": "sk-x",
        "headers": {"X-Secret": [HEADER_SECRET]},
    },
    "header-value-empty-secret-name": {
        "kind": "openai",
        "api_key": "sk-x",
        "headers": {f"{HEADER_SECRET} bad": "v"},
    },
    "unknown-field": {"kind": "openai", "api_key": API_KEY_SECRET, "api-key": API_KEY_SECRET},
    "name-taken": {"kind": "openai", "api_key": API_KEY_SECRET, "name": "taken"},
}


@pytest.mark.parametrize("case", list(REFUSED_PROVIDER_BODIES))
async def test_a_refused_provider_write_never_echoes_its_credential(
    client: Client, world: World, case: str
) -> None:
    await create(
        client,
        "/api/admin/providers",
        {"organization_id": world.org, "name": "taken", "kind": "mock"},
    )
    body = {"organization_id": world.org, "name": "new", **REFUSED_PROVIDER_BODIES[case]}
    created = await client.post("/api/admin/providers", json=body, headers=ADMIN)
    patch_body = {k: v for k, v in body.items() if k not in {"organization_id", "kind"}}
    patched = await client.patch(
        f"/api/admin/providers/{world.provider}", json=patch_body, headers=ADMIN
    )
    assert 400 <= created.status_code < 500, created.text
    for response in (created, patched):
        assert API_KEY_SECRET not in response.text
        assert HEADER_SECRET not in response.text


@pytest.mark.parametrize(
    "base_url",
    [
        f"https://gateway:{API_KEY_SECRET}@llm.example/v1",
        f"https://{API_KEY_SECRET}@llm.example/v1",
        f"http://user:{API_KEY_SECRET}@10.0.0.5:8000/v1",
    ],
    ids=["user-and-password", "token-as-user", "with-port"],
)
async def test_a_base_url_carrying_credentials_is_refused_and_never_shown(
    client: Client, world: World, base_url: str
) -> None:
    body = {
        "organization_id": world.org,
        "name": "compatible",
        "kind": "openai_compatible",
        "base_url": base_url,
    }
    created = await client.post("/api/admin/providers", json=body, headers=ADMIN)
    error = assert_contract_error(created, 422, "validation_error")
    assert error["param"] == "base_url"
    path = f"/api/admin/providers/{world.provider}"
    patched = await client.patch(path, json={"base_url": base_url}, headers=ADMIN)
    assert assert_contract_error(patched, 422, "validation_error")["param"] == "base_url"
    listed = await client.get("/api/admin/providers", headers=ADMIN)
    for response in (created, patched, listed):
        assert API_KEY_SECRET not in response.text
    assert [p["id"] for p in listed.json()["data"]] == [world.provider]
    # An @ in the path is no credential: that URL is kept.
    fine = await create(
        client, "/api/admin/providers", {**body, "base_url": "https://llm.example/v1/@team"}
    )
    assert fine["base_url"] == "https://llm.example/v1/@team"


async def test_a_base_url_that_cannot_be_read_is_a_422_not_a_500(
    client: Client, world: World
) -> None:
    body = {
        "organization_id": world.org,
        "name": "unreadable",
        "kind": "openai_compatible",
        "base_url": "http://[abc/v1",
    }
    created = await client.post("/api/admin/providers", json=body, headers=ADMIN)
    assert assert_contract_error(created, 422, "validation_error")["param"] == "base_url"


class Tripwire:
    """A request body that records whether anyone read it."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.read = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.read = True
        yield self.body


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {signing.TIMESTAMP_HEADER: "soon", signing.SIGNATURE_HEADER: "0" * 64},
        "stale",
    ],
    ids=["unsigned", "malformed", "stale"],
)
async def test_an_unsigned_or_stale_upload_is_refused_before_its_body_is_read(
    client: Client, world: World, clock: ManualClock, headers: dict[str, str] | str
) -> None:
    body = spend_segment(world, clock)
    if headers == "stale":
        headers = signed_upload(body, clock, ago_s=301)
    assert isinstance(headers, dict)
    tripwire = Tripwire(body)
    response = await client.post(
        SPEND_COMMANDS, content=tripwire, headers={**headers, "content-type": "application/json"}
    )
    assert_contract_error(response, 401, "bad_signature")
    assert tripwire.read is False
    assert await ledger_rows(client, world.org) == []


async def test_a_signature_over_an_empty_body_does_not_admit_a_body(
    client: Client, world: World, clock: ManualClock
) -> None:
    empty = signed_upload(b"", clock)
    response = await client.post(SPEND_COMMANDS, content=spend_segment(world, clock), headers=empty)
    assert_contract_error(response, 401, "bad_signature")
    assert await ledger_rows(client, world.org) == []
