"""Virtual keys through the admin API, observed the way a proxy sees them: resolve-key and the feed."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import httpx
import jwt
import pytest

from tests.conftest import Internal, World
from tests.support.api import ADMIN
from tests.support.clock import ManualClock
from tests.support.env import JWT_SECRET
from vkgate.clock import rfc3339
from vkgate.keys import key_sha256

KEYS = "/api/admin/virtual-keys"
RESOLVE = "/api/internal/gateway/resolve-key"
KEY_FORMAT = re.compile(r"^vk-[A-Za-z0-9_-]{43}$")
DAY = 86400


def error_code(response: httpx.Response) -> str:
    code: str = response.json()["error"]["code"]
    return code


async def resolve(internal: Internal, key: str) -> httpx.Response:
    return await internal.call("POST", RESOLVE, {"key_sha256": key_sha256(key)})


async def create_key(client: httpx.AsyncClient, world: World, **fields: Any) -> dict[str, Any]:
    body = {"project_id": world.project, "routing_policy_id": world.policy, **fields}
    response = await client.post(KEYS, json=body, headers=ADMIN)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


async def get_key(client: httpx.AsyncClient, vk_id: str) -> dict[str, Any]:
    response = await client.get(f"{KEYS}/{vk_id}", headers=ADMIN)
    assert response.status_code == 200, response.text
    read: dict[str, Any] = response.json()
    return read


async def act(
    client: httpx.AsyncClient, vk_id: str, action: str, body: Any = None
) -> httpx.Response:
    return await client.post(f"{KEYS}/{vk_id}/{action}", json=body, headers=ADMIN)


async def key_events(internal: Internal, vk_id: str) -> list[dict[str, Any]]:
    response = await internal.call("GET", "/api/internal/gateway/changes?since=0&timeout_s=0")
    assert response.status_code == 200, response.text
    return [e for e in response.json()["events"] if e["vk_id"] == vk_id]


def jwt_claims(token: str) -> dict[str, Any]:
    # The manual clock is not the wall clock, so expiry is checked against it by the tests.
    claims: dict[str, Any] = jwt.decode(
        token,
        JWT_SECRET,
        algorithms=["HS256"],
        issuer="vkgate-controlplane",
        options={"verify_exp": False, "verify_iat": False},
    )
    return claims


def at(moment: datetime) -> str:
    return rfc3339(moment)


# --- create, read, list -------------------------------------------------------------------------


async def test_create_answers_201_with_the_key_shown_once_and_its_prefix(
    client: httpx.AsyncClient, world: World, clock: ManualClock
) -> None:
    created = await create_key(client, world, name="billing", limits={"rpm": 60})
    assert KEY_FORMAT.match(created["key"])
    assert created["prefix"] == created["key"][:11]
    assert created["id"] != world.key_id
    assert created["status"] == "active"
    assert created["organization_id"] == world.org
    assert created["team_id"] == world.team
    assert created["limits"] == {"rpm": 60}
    assert created["created_at"] == at(clock.now())

    fetched = await get_key(client, created["id"])
    listed = (await client.get(KEYS, headers=ADMIN)).json()["data"]
    assert "key" not in fetched
    assert all("key" not in row for row in listed)
    assert fetched["prefix"] == created["prefix"]
    assert created["key"] not in (await client.get(KEYS, headers=ADMIN)).text


async def test_two_keys_never_share_a_secret(client: httpx.AsyncClient, world: World) -> None:
    other = await create_key(client, world, name="second")
    assert other["key"] != world.key
    assert KEY_FORMAT.match(world.key)


async def test_a_key_name_is_unique_within_its_project(
    client: httpx.AsyncClient, world: World
) -> None:
    response = await client.post(
        KEYS,
        json={"project_id": world.project, "name": "app", "routing_policy_id": world.policy},
        headers=ADMIN,
    )
    assert response.status_code == 409
    assert error_code(response) == "conflict"


async def test_list_filters_by_project_and_status(client: httpx.AsyncClient, world: World) -> None:
    other_project = (
        await client.post(
            "/api/admin/projects",
            json={"organization_id": world.org, "name": "batch"},
            headers=ADMIN,
        )
    ).json()["id"]
    elsewhere = await create_key(client, world, name="batch", project_id=other_project)
    assert (await act(client, elsewhere["id"], "disable")).status_code == 200

    by_project = (
        await client.get(KEYS, params={"project_id": world.project}, headers=ADMIN)
    ).json()
    disabled = (await client.get(KEYS, params={"status": "disabled"}, headers=ADMIN)).json()
    by_org = (await client.get(KEYS, params={"organization_id": world.org}, headers=ADMIN)).json()

    assert [k["id"] for k in by_project["data"]] == [world.key_id]
    assert [k["id"] for k in disabled["data"]] == [elsewhere["id"]]
    assert {k["id"] for k in by_org["data"]} == {world.key_id, elsewhere["id"]}


async def test_unknown_key_is_404_on_every_route(client: httpx.AsyncClient) -> None:
    missing = f"{KEYS}/vk_000000000000000000000000"
    responses = [
        await client.get(missing, headers=ADMIN),
        await client.patch(missing, json={"name": "x"}, headers=ADMIN),
        *[
            await client.post(f"{missing}/{action}", headers=ADMIN)
            for action in ("rotate", "revoke", "disable", "enable")
        ],
    ]
    assert [r.status_code for r in responses] == [404] * 6
    assert {error_code(r) for r in responses} == {"not_found"}


# --- PATCH: unset leaves alone, null clears -----------------------------------------------------


async def test_patch_changes_only_the_fields_it_names(
    client: httpx.AsyncClient, world: World, clock: ManualClock
) -> None:
    expires = at(clock.now() + timedelta(days=30))
    key = await create_key(
        client,
        world,
        name="full",
        allowed_models=["fast"],
        limits={"rpm": 10, "tpm": 1000},
        expires_at=expires,
        metadata={"owner": "ml"},
    )
    clock.advance(5)
    response = await client.patch(f"{KEYS}/{key['id']}", json={"name": "renamed"}, headers=ADMIN)
    assert response.status_code == 200, response.text
    patched = response.json()

    assert patched["name"] == "renamed"
    assert patched["allowed_models"] == ["fast"]
    assert patched["limits"] == {"rpm": 10, "tpm": 1000}
    assert patched["expires_at"] == expires
    assert patched["metadata"] == {"owner": "ml"}
    assert patched["updated_at"] == at(clock.now())
    assert patched["created_at"] == key["created_at"]
    assert await get_key(client, key["id"]) == patched


async def test_patch_that_changes_nothing_records_no_event_and_keeps_the_revision(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    key = await create_key(client, world, name="same", limits={"rpm": 10})
    for body in ({}, {"name": "same"}, {"limits": {"rpm": 10}}):
        response = await client.patch(f"{KEYS}/{key['id']}", json=body, headers=ADMIN)
        assert response.status_code == 200, response.text
        assert response.json()["revision"] == key["revision"]
    assert [e["kind"] for e in await key_events(internal, key["id"])] == ["VK_CREATED"]


async def test_patch_with_null_clears_allowed_models_limits_expiry_and_metadata(
    client: httpx.AsyncClient, world: World, clock: ManualClock
) -> None:
    key = await create_key(
        client,
        world,
        name="full",
        allowed_models=["fast"],
        limits={"rpm": 10},
        expires_at=at(clock.now() + timedelta(days=30)),
        metadata={"owner": "ml"},
    )
    response = await client.patch(
        f"{KEYS}/{key['id']}",
        json={"allowed_models": None, "limits": None, "expires_at": None, "metadata": None},
        headers=ADMIN,
    )
    assert response.status_code == 200, response.text
    cleared = response.json()
    assert cleared["allowed_models"] is None
    assert cleared["limits"] == {}
    assert cleared["expires_at"] is None
    assert cleared["metadata"] == {}
    assert cleared["name"] == "full"


@pytest.mark.parametrize("field", ["name", "routing_policy_id"])
async def test_patch_cannot_null_a_required_field(
    client: httpx.AsyncClient, world: World, field: str
) -> None:
    response = await client.patch(f"{KEYS}/{world.key_id}", json={field: None}, headers=ADMIN)
    assert response.status_code == 422
    assert error_code(response) == "validation_error"
    assert (await get_key(client, world.key_id))["routing_policy_id"] == world.policy


async def test_patch_refuses_unknown_fields(client: httpx.AsyncClient, world: World) -> None:
    response = await client.patch(f"{KEYS}/{world.key_id}", json={"status": "x"}, headers=ADMIN)
    assert response.status_code == 422
    assert response.json()["error"]["param"] == "status"


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [-1, 0], ids=["past", "now"])
async def test_expires_at_not_in_the_future_is_refused_on_create_and_patch(
    client: httpx.AsyncClient, world: World, clock: ManualClock, offset: int
) -> None:
    when = at(clock.now() + timedelta(seconds=offset))
    created = await client.post(
        KEYS,
        json={
            "project_id": world.project,
            "name": "late",
            "routing_policy_id": world.policy,
            "expires_at": when,
        },
        headers=ADMIN,
    )
    patched = await client.patch(f"{KEYS}/{world.key_id}", json={"expires_at": when}, headers=ADMIN)
    for response in (created, patched):
        assert response.status_code == 422, response.text
        assert error_code(response) == "validation_error"
        assert response.json()["error"]["param"] == "expires_at"
    assert (await get_key(client, world.key_id))["expires_at"] is None


async def test_expires_at_without_a_time_zone_is_refused(
    client: httpx.AsyncClient, world: World
) -> None:
    response = await client.patch(
        f"{KEYS}/{world.key_id}", json={"expires_at": "2030-01-01T00:00:00"}, headers=ADMIN
    )
    assert response.status_code == 422


async def test_allowed_models_must_be_aliases_of_the_routing_policy(
    client: httpx.AsyncClient, world: World
) -> None:
    created = await client.post(
        KEYS,
        json={
            "project_id": world.project,
            "name": "strict",
            "routing_policy_id": world.policy,
            "allowed_models": ["fast", "gpt-4o"],
        },
        headers=ADMIN,
    )
    patched = await client.patch(
        f"{KEYS}/{world.key_id}", json={"allowed_models": ["slow"]}, headers=ADMIN
    )
    for response in (created, patched):
        assert response.status_code == 422, response.text
        assert response.json()["error"]["param"] == "allowed_models"
    assert "gpt-4o" in created.json()["error"]["message"]


async def test_switching_to_a_policy_without_an_allowed_alias_is_refused(
    client: httpx.AsyncClient, world: World
) -> None:
    other_policy = (
        await client.post(
            "/api/admin/routing-policies",
            json={
                "organization_id": world.org,
                "name": "other",
                "aliases": {"smart": [{"provider_id": world.provider, "model": "gpt-4o"}]},
            },
            headers=ADMIN,
        )
    ).json()["id"]
    key = await create_key(client, world, name="strict", allowed_models=["fast"])

    refused = await client.patch(
        f"{KEYS}/{key['id']}", json={"routing_policy_id": other_policy}, headers=ADMIN
    )
    accepted = await client.patch(
        f"{KEYS}/{key['id']}",
        json={"routing_policy_id": other_policy, "allowed_models": ["smart"]},
        headers=ADMIN,
    )

    assert refused.status_code == 422
    assert refused.json()["error"]["param"] == "allowed_models"
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["routing_policy_id"] == other_policy


# --- rotate -------------------------------------------------------------------------------------


async def test_rotate_without_a_body_keeps_the_old_key_working_for_a_day(
    client: httpx.AsyncClient, internal: Internal, world: World, clock: ManualClock
) -> None:
    response = await act(client, world.key_id, "rotate")
    assert response.status_code == 200, response.text
    rotated = response.json()
    new_key = rotated["key"]
    assert KEY_FORMAT.match(new_key)
    assert new_key != world.key
    assert rotated["previous_key_valid_until"] == at(clock.now() + timedelta(seconds=DAY))
    assert (await get_key(client, world.key_id))["prefix"] == new_key[:11]

    clock.advance(DAY - 1)
    assert (await resolve(internal, world.key)).json()["vk_id"] == world.key_id
    assert (await resolve(internal, new_key)).json()["vk_id"] == world.key_id

    clock.advance(1)
    old = await resolve(internal, world.key)
    assert old.status_code == 401
    assert error_code(old) == "invalid_api_key"
    assert (await resolve(internal, new_key)).status_code == 200


async def test_rotate_with_zero_grace_stops_the_old_key_at_once(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    response = await act(client, world.key_id, "rotate", {"grace_seconds": 0})
    assert response.status_code == 200, response.text

    old = await resolve(internal, world.key)
    assert old.status_code == 401
    assert error_code(old) == "invalid_api_key"
    assert (await resolve(internal, response.json()["key"])).status_code == 200


async def test_a_custom_grace_ends_exactly_when_it_says(
    client: httpx.AsyncClient, internal: Internal, world: World, clock: ManualClock
) -> None:
    rotated = (await act(client, world.key_id, "rotate", {"grace_seconds": 600})).json()
    assert rotated["previous_key_valid_until"] == at(clock.now() + timedelta(seconds=600))

    clock.advance(599)
    assert (await resolve(internal, world.key)).status_code == 200
    clock.advance(1)
    assert error_code(await resolve(internal, world.key)) == "invalid_api_key"


async def test_a_later_rotation_never_extends_an_earlier_keys_grace(
    client: httpx.AsyncClient, internal: Internal, world: World, clock: ManualClock
) -> None:
    second = (await act(client, world.key_id, "rotate", {"grace_seconds": 60})).json()["key"]
    third = (await act(client, world.key_id, "rotate", {"grace_seconds": DAY})).json()["key"]

    clock.advance(60)
    assert error_code(await resolve(internal, world.key)) == "invalid_api_key"
    assert (await resolve(internal, second)).status_code == 200
    assert (await resolve(internal, third)).status_code == 200


async def test_a_shorter_later_grace_cuts_every_older_key_short(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    second = (await act(client, world.key_id, "rotate", {"grace_seconds": DAY})).json()["key"]
    third = (await act(client, world.key_id, "rotate", {"grace_seconds": 0})).json()["key"]

    assert error_code(await resolve(internal, world.key)) == "invalid_api_key"
    assert error_code(await resolve(internal, second)) == "invalid_api_key"
    assert (await resolve(internal, third)).status_code == 200


@pytest.mark.parametrize("grace", [-1, 90 * DAY + 1, "soon"])
async def test_rotate_refuses_a_grace_outside_zero_to_ninety_days(
    client: httpx.AsyncClient, internal: Internal, world: World, grace: object
) -> None:
    response = await act(client, world.key_id, "rotate", {"grace_seconds": grace})
    assert response.status_code == 422
    assert len(await key_events(internal, world.key_id)) == 1  # only VK_CREATED


async def test_old_key_jwt_expires_when_its_grace_ends(
    client: httpx.AsyncClient, internal: Internal, world: World, clock: ManualClock
) -> None:
    rotated = (await act(client, world.key_id, "rotate", {"grace_seconds": 120})).json()
    old = (await resolve(internal, world.key)).json()
    new = (await resolve(internal, rotated["key"])).json()

    grace_end = clock.now() + timedelta(seconds=120)
    assert jwt_claims(old["jwt"])["exp"] == int(grace_end.timestamp())
    assert old["expires_at"] == old["key_expires_at"] == at(grace_end)
    assert jwt_claims(new["jwt"])["exp"] == int((clock.now() + timedelta(minutes=15)).timestamp())
    assert new["key_expires_at"] is None


# --- revoke, disable, enable --------------------------------------------------------------------


async def test_a_revoked_key_resolves_to_403_virtual_key_revoked(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    rotated = (await act(client, world.key_id, "rotate")).json()
    response = await act(client, world.key_id, "revoke")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "revoked"

    for key in (world.key, rotated["key"]):  # the key in its grace is revoked with the rest
        refused = await resolve(internal, key)
        assert refused.status_code == 403
        assert error_code(refused) == "virtual_key_revoked"


async def test_revoking_twice_succeeds_and_changes_nothing(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    first = await act(client, world.key_id, "revoke")
    second = await act(client, world.key_id, "revoke")

    assert second.status_code == 200
    assert second.json() == first.json()
    kinds = [e["kind"] for e in await key_events(internal, world.key_id)]
    assert kinds == ["VK_CREATED", "VK_REVOKED"]


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("POST", "/enable", None),
        ("POST", "/disable", None),
        ("POST", "/rotate", {"grace_seconds": 0}),
        ("PATCH", "", {"name": "revived"}),
    ],
    ids=["enable", "disable", "rotate", "patch"],
)
async def test_a_revoked_key_cannot_be_changed_again(
    client: httpx.AsyncClient,
    internal: Internal,
    world: World,
    method: str,
    suffix: str,
    body: Any,
) -> None:
    await act(client, world.key_id, "revoke")
    response = await client.request(
        method, f"{KEYS}/{world.key_id}{suffix}", json=body, headers=ADMIN
    )

    assert response.status_code == 409, response.text
    assert error_code(response) == "conflict"
    assert (await get_key(client, world.key_id))["status"] == "revoked"
    assert error_code(await resolve(internal, world.key)) == "virtual_key_revoked"


async def test_a_disabled_key_is_refused_until_enabled(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    disabled = await act(client, world.key_id, "disable")
    assert disabled.status_code == 200
    assert disabled.json()["status"] == "disabled"
    refused = await resolve(internal, world.key)
    assert refused.status_code == 403
    assert error_code(refused) == "virtual_key_disabled"

    enabled = await act(client, world.key_id, "enable")
    assert enabled.json()["status"] == "active"
    assert (await resolve(internal, world.key)).json()["vk_id"] == world.key_id


async def test_a_disabled_key_can_still_be_rotated_and_patched(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    await act(client, world.key_id, "disable")
    rotated = await act(client, world.key_id, "rotate")
    patched = await client.patch(
        f"{KEYS}/{world.key_id}", json={"limits": {"rpm": 1}}, headers=ADMIN
    )

    assert rotated.status_code == 200
    assert patched.json()["status"] == "disabled"
    assert error_code(await resolve(internal, rotated.json()["key"])) == "virtual_key_disabled"


async def test_disable_and_enable_are_idempotent(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    already_active = await act(client, world.key_id, "enable")
    await act(client, world.key_id, "disable")
    again = await act(client, world.key_id, "disable")

    assert already_active.status_code == again.status_code == 200
    assert again.json()["status"] == "disabled"
    kinds = [e["kind"] for e in await key_events(internal, world.key_id)]
    assert kinds == ["VK_CREATED", "VK_DISABLED"]


# --- expiry and the resolve JWT -----------------------------------------------------------------


async def test_a_key_is_expired_once_the_clock_reaches_expires_at(
    client: httpx.AsyncClient, internal: Internal, world: World, clock: ManualClock
) -> None:
    key = await create_key(
        client, world, name="short", expires_at=at(clock.now() + timedelta(hours=1))
    )
    clock.advance(3599)
    assert (await resolve(internal, key["key"])).status_code == 200

    clock.advance(1)
    refused = await resolve(internal, key["key"])
    assert refused.status_code == 401
    assert error_code(refused) == "virtual_key_expired"


async def test_clearing_the_expiry_revives_an_expired_key(
    client: httpx.AsyncClient, internal: Internal, world: World, clock: ManualClock
) -> None:
    key = await create_key(
        client, world, name="short", expires_at=at(clock.now() + timedelta(days=1))
    )
    clock.advance(2 * DAY)
    assert error_code(await resolve(internal, key["key"])) == "virtual_key_expired"

    await client.patch(f"{KEYS}/{key['id']}", json={"expires_at": None}, headers=ADMIN)
    assert (await resolve(internal, key["key"])).status_code == 200


async def test_the_jwt_lives_fifteen_minutes_for_a_key_without_expiry(
    internal: Internal, world: World, clock: ManualClock
) -> None:
    answer = (await resolve(internal, world.key)).json()
    claims = jwt_claims(answer["jwt"])

    fifteen_minutes = clock.now() + timedelta(minutes=15)
    assert claims["exp"] == int(fifteen_minutes.timestamp())
    assert claims["iat"] == int(clock.time())
    assert answer["expires_at"] == at(fifteen_minutes)
    assert answer["key_expires_at"] is None
    assert claims["sub"] == answer["vk_id"] == world.key_id
    assert claims["org"] == answer["organization_id"] == world.org
    assert claims["project"] == world.project
    assert claims["rev"] == answer["revision"]


async def test_the_jwt_ends_at_the_keys_expiry_when_that_is_sooner(
    client: httpx.AsyncClient, internal: Internal, world: World, clock: ManualClock
) -> None:
    expires = clock.now() + timedelta(minutes=5)
    key = await create_key(client, world, name="short", expires_at=at(expires))
    answer = (await resolve(internal, key["key"])).json()

    assert jwt_claims(answer["jwt"])["exp"] == int(expires.timestamp())
    assert answer["expires_at"] == answer["key_expires_at"] == at(expires)


async def test_a_later_expiry_leaves_the_jwt_at_fifteen_minutes(
    client: httpx.AsyncClient, internal: Internal, world: World, clock: ManualClock
) -> None:
    expires = clock.now() + timedelta(hours=2)
    key = await create_key(client, world, name="later", expires_at=at(expires))
    answer = (await resolve(internal, key["key"])).json()

    assert answer["expires_at"] == at(clock.now() + timedelta(minutes=15))
    assert answer["key_expires_at"] == at(expires)


# --- revisions, events, audit -------------------------------------------------------------------


async def test_resolve_revision_is_the_keys_latest_event_and_rises_on_every_change(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    changes = [
        lambda: client.patch(f"{KEYS}/{world.key_id}", json={"limits": {"rpm": 5}}, headers=ADMIN),
        lambda: act(client, world.key_id, "disable"),
        lambda: act(client, world.key_id, "enable"),
        lambda: client.patch(
            f"{KEYS}/{world.key_id}", json={"metadata": {"a": "b"}}, headers=ADMIN
        ),
    ]
    seen = [(await resolve(internal, world.key)).json()["revision"]]
    for change in changes:
        assert (await change()).status_code == 200
        seen.append((await get_key(client, world.key_id))["revision"])
        events = await key_events(internal, world.key_id)
        assert seen[-1] == events[-1]["revision"]

    rotated = (await act(client, world.key_id, "rotate")).json()
    resolved = (await resolve(internal, rotated["key"])).json()
    assert resolved["revision"] == rotated["revision"] > seen[-1]
    assert resolved["revision"] == (await key_events(internal, world.key_id))[-1]["revision"]
    assert seen == sorted(set(seen))


async def test_lifecycle_events_appear_in_order_naming_the_key(
    client: httpx.AsyncClient, internal: Internal, world: World, clock: ManualClock
) -> None:
    await client.patch(f"{KEYS}/{world.key_id}", json={"name": "renamed"}, headers=ADMIN)
    await act(client, world.key_id, "rotate")
    await act(client, world.key_id, "disable")
    await act(client, world.key_id, "enable")
    clock.advance(30)
    await act(client, world.key_id, "revoke")

    events = await key_events(internal, world.key_id)
    assert [e["kind"] for e in events] == [
        "VK_CREATED",
        "VK_CONFIG_UPDATED",
        "VK_ROTATED",
        "VK_DISABLED",
        "VK_ENABLED",
        "VK_REVOKED",
    ]
    assert {e["entity_id"] for e in events} == {world.key_id}
    assert {e["entity_kind"] for e in events} == {"virtual_key"}
    assert {e["organization_id"] for e in events} == {world.org}
    assert events[-1]["at"] == at(clock.now())
    revisions = [e["revision"] for e in events]
    assert revisions == sorted(set(revisions))


async def test_every_key_change_is_audited_and_no_ops_are_not(
    client: httpx.AsyncClient, world: World
) -> None:
    await client.patch(f"{KEYS}/{world.key_id}", json={"limits": {"rpm": 5}}, headers=ADMIN)
    await act(client, world.key_id, "rotate", {"grace_seconds": 0})
    await act(client, world.key_id, "enable")  # already active: nothing to record
    await act(client, world.key_id, "disable")
    await act(client, world.key_id, "enable")
    await act(client, world.key_id, "revoke")
    await act(client, world.key_id, "revoke")

    response = await client.get(
        "/api/admin/audit-log", params={"resource_id": world.key_id}, headers=ADMIN
    )
    entries = response.json()["data"]
    assert [e["action"] for e in entries] == [
        "virtual_key.create",
        "virtual_key.update",
        "virtual_key.rotate",
        "virtual_key.disable",
        "virtual_key.enable",
        "virtual_key.revoke",
    ]
    assert {e["actor"] for e in entries} == {"env"}
    assert {e["organization_id"] for e in entries} == {world.org}
    assert entries[1]["details"] == {"fields": ["limits"]}
    assert entries[2]["details"] == {"grace_seconds": 0}
    assert world.key not in response.text
    assert key_sha256(world.key) not in response.text


async def test_list_refuses_an_unknown_status_filter(client: httpx.AsyncClient) -> None:
    response = await client.get(KEYS, params={"status": "sleeping"}, headers=ADMIN)
    assert response.status_code == 422
    assert response.json()["error"]["param"] == "status"
