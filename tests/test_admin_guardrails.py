"""Admin API and CLI: guardrails, checked on the way in, their webhook secrets sealed and never
shown, carried to the keys in their scope with a change-feed event for every change."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from controlplane.models import Guardrail
from tests.conftest import Internal, World
from tests.support.api import ADMIN, create, error_of

GUARDRAILS = "/api/admin/guardrails"
SECRET = "whsec-0123456789abcdef-not-shown"


def guardrail(world: World, **fields: Any) -> dict[str, Any]:
    return {"organization_id": world.org, "name": "pii", "kind": "pii", **fields}


async def bundle_guardrails(internal: Internal, vk_id: str) -> list[dict[str, Any]]:
    response = await internal.call("GET", f"/api/internal/gateway/config/{vk_id}")
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["guardrails"]
    return found


async def test_a_guardrail_is_created_read_listed_and_reaches_its_keys(
    client: httpx.AsyncClient, world: World, internal: Internal
) -> None:
    created = await create(
        client,
        GUARDRAILS,
        guardrail(world, config={"entities": ["email", "credit_card"]}, action="redact"),
    )
    assert created["scope"] == {"kind": "organization", "id": world.org}
    assert (created["stage"], created["on_error"], created["timeout_ms"]) == ("both", "allow", 1000)
    assert created["config"] == {"entities": ["email", "credit_card"]}
    assert created["has_secret"] is False
    assert (await client.get(f"{GUARDRAILS}/{created['id']}", headers=ADMIN)).json() == created
    listed = await client.get(GUARDRAILS, params={"organization_id": world.org}, headers=ADMIN)
    assert [g["id"] for g in listed.json()["data"]] == [created["id"]]
    [spec] = await bundle_guardrails(internal, world.key_id)
    assert (spec["id"], spec["kind"], spec["action"]) == (created["id"], "pii", "redact")
    feed = await internal.call("GET", "/api/internal/gateway/changes?since=0&timeout_s=0")
    kinds = [(e["kind"], e["entity_id"]) for e in feed.json()["events"]]
    assert ("GUARDRAIL_CREATED", created["id"]) in kinds


async def test_update_disable_and_delete_each_append_an_event(
    client: httpx.AsyncClient, world: World, internal: Internal
) -> None:
    created = await create(client, GUARDRAILS, guardrail(world))
    ident = created["id"]
    changed = await client.patch(
        f"{GUARDRAILS}/{ident}", json={"action": "warn", "stage": "request"}, headers=ADMIN
    )
    assert (changed.json()["action"], changed.json()["stage"]) == ("warn", "request")
    off = await client.patch(f"{GUARDRAILS}/{ident}", json={"enabled": False}, headers=ADMIN)
    assert off.json()["enabled"] is False
    assert await bundle_guardrails(internal, world.key_id) == []
    assert (await client.delete(f"{GUARDRAILS}/{ident}", headers=ADMIN)).status_code == 204
    assert (await client.get(f"{GUARDRAILS}/{ident}", headers=ADMIN)).status_code == 404
    feed = await internal.call("GET", "/api/internal/gateway/changes?since=0&timeout_s=0")
    kinds = [e["kind"] for e in feed.json()["events"] if e["entity_id"] == ident]
    assert kinds == [
        "GUARDRAIL_CREATED",
        "GUARDRAIL_UPDATED",
        "GUARDRAIL_UPDATED",
        "GUARDRAIL_DELETED",
    ]


async def test_a_scoped_guardrail_reaches_only_the_keys_in_its_scope(
    client: httpx.AsyncClient, world: World, internal: Internal
) -> None:
    other = await create(
        client, "/api/admin/projects", {"organization_id": world.org, "name": "other"}
    )
    await create(
        client,
        GUARDRAILS,
        guardrail(world, name="elsewhere", scope={"kind": "project", "id": other["id"]}),
    )
    await create(
        client,
        GUARDRAILS,
        guardrail(world, name="here", scope={"kind": "virtual_key", "id": world.key_id}),
    )
    await create(
        client, GUARDRAILS, guardrail(world, name="team", scope={"kind": "team", "id": world.team})
    )
    names = [g["name"] for g in await bundle_guardrails(internal, world.key_id)]
    assert sorted(names) == ["here", "team"]


async def test_a_webhook_secret_is_sealed_and_never_returned(
    client: httpx.AsyncClient, world: World, internal: Internal, app: Any
) -> None:
    body = guardrail(
        world,
        name="hook",
        kind="webhook",
        config={"url": "https://guard.example.com/check"},
        secret=SECRET,
    )
    created = await create(client, GUARDRAILS, body)
    assert created["has_secret"] is True
    assert SECRET not in str(created)
    listed = await client.get(GUARDRAILS, headers=ADMIN)
    assert SECRET not in listed.text
    audit = await client.get("/api/admin/audit-log", headers=ADMIN)
    assert SECRET not in audit.text
    [spec] = await bundle_guardrails(internal, world.key_id)
    assert spec["secret"] == SECRET, "the proxy gets it opened, over the signed internal API"
    state = app.state["vk"]
    async with state.read() as tx:
        row = await tx.session.get(Guardrail, created["id"])
    assert row is not None and row.secret_encrypted is not None
    assert SECRET.encode() not in row.secret_encrypted


async def test_a_moderation_guardrail_carries_its_providers_credential(
    client: httpx.AsyncClient, world: World, internal: Internal
) -> None:
    await create(
        client,
        GUARDRAILS,
        guardrail(
            world,
            name="mod",
            kind="moderation",
            config={"provider_id": world.provider, "thresholds": {"violence": 0.5}},
        ),
    )
    [spec] = await bundle_guardrails(internal, world.key_id)
    assert spec["target"]["provider_id"] == world.provider
    assert spec["target"]["model"] == "omni-moderation-latest"
    assert spec["target"]["api_key"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"kind": "regex", "config": {"patterns": {"x": "("}}}, "config.patterns.x"),
        ({"kind": "regex", "config": {}}, "config"),
        ({"kind": "pii", "config": {"entities": ["shoe_size"]}}, "config.entities"),
        ({"kind": "secrets", "config": {"kinds": ["aws_access_key"], "x": 1}}, "config"),
        (
            {"kind": "webhook", "config": {"url": "http://guard.example.com/"}, "secret": SECRET},
            "config.url",
        ),
        ({"kind": "webhook", "config": {"url": "https://guard.example.com/"}}, "secret"),
        ({"kind": "pii", "secret": SECRET}, "secret"),
        ({"kind": "moderation", "config": {"provider_id": "nope"}}, "config.provider_id"),
        ({"kind": "moderation", "config": {"provider_id": "P"}, "action": "redact"}, "action"),
        ({"kind": "pii", "action": "shout"}, "action"),
        ({"kind": "pii", "timeout_ms": 0}, "timeout_ms"),
        ({"kind": "pii", "scope": {"kind": "project"}}, "scope.id"),
        ({"kind": "pii", "scope": {"kind": "project", "id": "missing"}}, "scope.id"),
    ],
)
async def test_a_malformed_guardrail_is_refused_naming_the_field(
    client: httpx.AsyncClient, world: World, fields: dict[str, Any], param: str
) -> None:
    if fields.get("config", {}).get("provider_id") == "P":
        fields["config"]["provider_id"] = world.provider
    response = await client.post(GUARDRAILS, json=guardrail(world, **fields), headers=ADMIN)
    assert response.status_code in (404, 422), response.text
    error = response.json()["error"]
    assert error["param"] is not None and error["param"].startswith(param), error
    assert SECRET not in response.text


async def test_a_name_is_unique_in_its_organization(
    client: httpx.AsyncClient, world: World
) -> None:
    await create(client, GUARDRAILS, guardrail(world))
    again = await client.post(GUARDRAILS, json=guardrail(world), headers=ADMIN)
    error_of(again, 409, "conflict", "name")


async def test_a_provider_a_moderation_guardrail_names_cannot_be_deleted_under_it(
    client: httpx.AsyncClient, world: World
) -> None:
    moderator = await create(
        client,
        "/api/admin/providers",
        {"organization_id": world.org, "name": "moderator", "kind": "openai", "api_key": "sk-m"},
    )
    made = await create(
        client,
        GUARDRAILS,
        guardrail(world, name="mod", kind="moderation", config={"provider_id": moderator["id"]}),
    )
    refused = await client.delete(f"/api/admin/providers/{moderator['id']}", headers=ADMIN)
    assert "moderates for 1 guardrail" in error_of(refused, 409, "conflict")["message"]
    gone = await client.delete(f"{GUARDRAILS}/{made['id']}", headers=ADMIN)
    assert gone.status_code == 204, gone.text
    deleted = await client.delete(f"/api/admin/providers/{moderator['id']}", headers=ADMIN)
    assert deleted.status_code == 204, deleted.text
