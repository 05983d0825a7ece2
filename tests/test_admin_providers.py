"""Admin API: model providers, their per-kind rules, and credentials that go in but never out."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import select

from controlplane.db import Database
from controlplane.models import Provider
from controlplane.providers.service import open_api_key, open_headers
from controlplane.security import Cipher
from controlplane.settings import ControlPlaneSettings
from tests.conftest import Internal, World
from tests.support.api import ADMIN, create, error_of, walk_pages
from tests.support.clock import ManualClock

Client = httpx.AsyncClient
PROVIDERS = "/api/admin/providers"
POLICIES = "/api/admin/routing-policies"
BUDGETS = "/api/admin/budgets"
WORLD_CREDENTIAL = "sk-test-provider-credential-7d1f"
CREDENTIAL = "sk-providers-test-credential-51c9"
HEADER_VALUE = "hdr-providers-test-value-0e44"


def provider_body(org: str, **fields: Any) -> dict[str, Any]:
    """An openai provider with a credential, changed by `fields` (None drops a field)."""
    body = {"organization_id": org, "name": "primary", "kind": "openai", "api_key": CREDENTIAL}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not None}


async def get_provider(client: Client, provider_id: str) -> dict[str, Any]:
    response = await client.get(f"{PROVIDERS}/{provider_id}", headers=ADMIN)
    assert response.status_code == 200, response.text
    provider: dict[str, Any] = response.json()
    return provider


async def stored(database: Database, provider_id: str) -> Provider:
    async with database.transaction() as session:
        row = await session.scalar(select(Provider).where(Provider.id == provider_id))
    assert row is not None
    return row


async def chain_of(internal: Internal, world: World, alias: str = "fast") -> list[dict[str, Any]]:
    """The credential chain a proxy would receive for the world's key."""
    response = await internal.call("GET", f"/api/internal/gateway/config/{world.key_id}")
    assert response.status_code == 200, response.text
    chain: list[dict[str, Any]] = response.json()["aliases"][alias]
    return chain


@pytest.fixture
def cipher(settings: ControlPlaneSettings) -> Cipher:
    return Cipher(settings.encryption_key)


# Create and read


async def test_openai_provider_gets_the_default_base_url_and_hides_its_key(
    client: Client, world: World, clock: ManualClock
) -> None:
    response = await client.post(PROVIDERS, json=provider_body(world.org), headers=ADMIN)
    assert response.status_code == 201, response.text
    assert CREDENTIAL not in response.text
    created = response.json()
    assert created["id"].startswith("prov_")
    assert created["organization_id"] == world.org
    assert created["kind"] == "openai"
    assert created["base_url"] == "https://api.openai.com/v1"
    assert created["api_version"] is None
    assert created["has_api_key"] is True
    assert created["header_names"] == []
    assert created["price_overrides"] == {}
    assert created["created_at"] == created["updated_at"] == "2026-03-10T12:00:00Z"
    assert "api_key" not in created
    assert "headers" not in created


async def test_anthropic_provider_gets_the_api_root_as_default_base_url(
    client: Client, world: World
) -> None:
    created = await create(client, PROVIDERS, provider_body(world.org, kind="anthropic"))
    assert created["base_url"] == "https://api.anthropic.com"


async def test_explicit_base_url_is_kept_without_its_trailing_slash(
    client: Client, world: World
) -> None:
    created = await create(
        client, PROVIDERS, provider_body(world.org, base_url="https://eu.openai.example/v1/")
    )
    assert created["base_url"] == "https://eu.openai.example/v1"


@pytest.mark.parametrize("kind", ["openai", "anthropic", "azure_openai"])
async def test_kinds_that_need_a_credential_refuse_to_be_created_without_one(
    client: Client, world: World, kind: str
) -> None:
    body = provider_body(
        world.org,
        kind=kind,
        api_key=None,
        base_url="https://res.openai.azure.com",
        api_version="2024-10-21",
    )
    response = await client.post(PROVIDERS, json=body, headers=ADMIN)
    error_of(response, 422, "validation_error", param="api_key")


async def test_azure_openai_needs_base_url_api_key_and_api_version(
    client: Client, world: World
) -> None:
    full = provider_body(
        world.org,
        kind="azure_openai",
        base_url="https://acme.openai.azure.com",
        api_version="2024-10-21",
    )
    for missing in ("base_url", "api_key", "api_version"):
        response = await client.post(PROVIDERS, json={**full, missing: None}, headers=ADMIN)
        error_of(response, 422, "validation_error", param=missing)
    created = await create(client, PROVIDERS, full)
    assert created["base_url"] == "https://acme.openai.azure.com"
    assert created["api_version"] == "2024-10-21"
    assert created["has_api_key"] is True


async def test_openai_compatible_needs_a_base_url_but_no_credential(
    client: Client, world: World
) -> None:
    body = provider_body(world.org, kind="openai_compatible", api_key=None)
    response = await client.post(PROVIDERS, json=body, headers=ADMIN)
    error_of(response, 422, "validation_error", param="base_url")
    created = await create(client, PROVIDERS, {**body, "base_url": "http://vllm.internal:8000/v1"})
    assert created["base_url"] == "http://vllm.internal:8000/v1"
    assert created["has_api_key"] is False


async def test_mock_provider_takes_neither_base_url_nor_credential(
    client: Client, world: World
) -> None:
    created = await create(client, PROVIDERS, provider_body(world.org, kind="mock", api_key=None))
    assert created["base_url"] is None
    assert created["has_api_key"] is False


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"base_url": "https://mock.example/v1"}, "base_url"), ({"api_key": CREDENTIAL}, "api_key")],
    ids=["base_url", "api_key"],
)
async def test_mock_provider_with_base_url_or_credential_is_refused_naming_it(
    client: Client, world: World, extra: dict[str, str], param: str
) -> None:
    body = {**provider_body(world.org, kind="mock", api_key=None), **extra}
    response = await client.post(PROVIDERS, json=body, headers=ADMIN)
    error_of(response, 422, "validation_error", param=param)
    assert CREDENTIAL not in response.text


async def test_headers_are_stored_but_only_their_names_are_shown(
    client: Client, world: World, database: Database, cipher: Cipher
) -> None:
    body = provider_body(world.org, headers={"X-Tenant": HEADER_VALUE, "OpenAI-Project": "p1"})
    response = await client.post(PROVIDERS, json=body, headers=ADMIN)
    assert response.status_code == 201
    assert HEADER_VALUE not in response.text
    created = response.json()
    assert created["header_names"] == ["OpenAI-Project", "X-Tenant"]
    row = await stored(database, created["id"])
    assert open_headers(cipher, row) == {"X-Tenant": HEADER_VALUE, "OpenAI-Project": "p1"}
    assert open_api_key(cipher, row) == CREDENTIAL


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"api_key": CREDENTIAL + "\n"}, "api_key"),
        ({"api_key": "sk-a\r\nX-Injected: 1"}, "api_key"),
        ({"headers": {"X-Tenant": HEADER_VALUE + "\r\n"}}, "headers.X-Tenant"),
        ({"headers": {"X-Tenant": "a\x00b"}}, "headers.X-Tenant"),
    ],
    ids=["trailing-newline", "crlf", "header-crlf", "header-nul"],
)
async def test_a_credential_that_cannot_go_in_a_header_is_refused_unechoed(
    client: Client, world: World, fields: dict[str, Any], param: str
) -> None:
    created = await client.post(PROVIDERS, json=provider_body(world.org, **fields), headers=ADMIN)
    error = error_of(created, 422, "validation_error", param=param)
    assert "line break" in error["message"]
    patched = await client.patch(f"{PROVIDERS}/{world.provider}", json=fields, headers=ADMIN)
    error_of(patched, 422, "validation_error", param=param)
    for response in (created, patched):
        assert CREDENTIAL not in response.text and HEADER_VALUE not in response.text


async def test_price_overrides_round_trip_omitting_absent_cache_prices(
    client: Client, world: World
) -> None:
    prices = {
        "gpt-4o-mini": {"input_per_mtok": "0.15", "output_per_mtok": "0.6"},
        "ft:gpt-4o:acme": {
            "input_per_mtok": "3.75",
            "output_per_mtok": "15",
            "cache_read_per_mtok": "1.875",
            "cache_write_per_mtok": "0",
        },
    }
    created = await create(client, PROVIDERS, provider_body(world.org, price_overrides=prices))
    assert created["price_overrides"] == prices
    assert (await get_provider(client, created["id"]))["price_overrides"] == prices


async def test_price_overrides_take_per_image_per_second_and_per_character_prices(
    client: Client, world: World
) -> None:
    prices = {
        "dall-e-3": {"per_image": {"1024x1024": "0.04", "1024x1024/hd": "0.08", "*/hd": "0.12"}},
        "whisper-1": {"per_second": "0.0001"},
        "tts-1": {"per_character": "0.000015"},
        "gpt-image-1": {
            "input_per_mtok": "5",
            "output_per_mtok": "40",
            "input_image_per_mtok": "10",
        },
    }
    created = await create(client, PROVIDERS, provider_body(world.org, price_overrides=prices))
    assert created["price_overrides"] == prices


@pytest.mark.parametrize(
    ("override", "param", "words"),
    [
        ({}, "price_overrides.m", "needs a price"),
        ({"input_per_mtok": "1"}, "price_overrides.m", "output_per_mtok is missing"),
        ({"cache_read_per_mtok": "1", "per_second": "1"}, "price_overrides.m", "cache rate"),
        ({"per_second": "-1"}, "price_overrides[...].per_second", "matching regex"),
        ({"per_image": {"huge": "1"}}, "price_overrides[...].per_image", "matching regex"),
        ({"per_image": {"1024x1024/": "1"}}, "price_overrides[...].per_image", "matching regex"),
        (
            {"per_image": {"1024x1024": "x"}},
            "price_overrides[...].per_image[...]",
            "matching regex",
        ),
        ({"per_pixel": "1"}, "price_overrides[...].per_pixel", "unknown field"),
    ],
)
async def test_a_price_override_that_prices_nothing_or_badly_is_a_422_naming_it(
    client: Client, world: World, override: dict[str, Any], param: str, words: str
) -> None:
    response = await client.post(
        PROVIDERS, json=provider_body(world.org, price_overrides={"m": override}), headers=ADMIN
    )
    error = error_of(response, 422, "validation_error")
    assert words in error["message"], error
    assert error["param"] == param, error


async def test_get_returns_what_create_answered(client: Client, world: World) -> None:
    created = await create(client, PROVIDERS, provider_body(world.org, headers={"X-A": "b"}))
    assert await get_provider(client, created["id"]) == created


async def test_unknown_provider_is_not_found(client: Client) -> None:
    response = await client.get(f"{PROVIDERS}/prov_missing", headers=ADMIN)
    error_of(response, 404, "not_found", param=None)


async def test_provider_of_unknown_organization_is_not_found_naming_organization_id(
    client: Client,
) -> None:
    response = await client.post(PROVIDERS, json=provider_body("org_missing"), headers=ADMIN)
    error_of(response, 404, "not_found", param="organization_id")


async def test_provider_name_is_unique_within_an_organization_only(
    client: Client, world: World
) -> None:
    body = provider_body(world.org, name="openai-main")
    error_of(await client.post(PROVIDERS, json=body, headers=ADMIN), 409, "conflict", param="name")
    other = await create(client, "/api/admin/organizations", {"name": "globex"})
    await create(client, PROVIDERS, {**body, "organization_id": other["id"]})


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"organization_id": None}, "organization_id"),
        ({"name": None}, "name"),
        ({"kind": None}, "kind"),
        ({"name": ""}, "name"),
        ({"kind": "watsonx"}, "kind"),
        ({"kind": 1}, "kind"),
        ({"base_url": "ftp://files.example"}, "base_url"),
        ({"base_url": "not a url"}, "base_url"),
        ({"base_url": ""}, "base_url"),
        ({"api_key": ""}, "api_key"),
        ({"api_key": 1234}, "api_key"),
        ({"api_version": ""}, "api_version"),
        ({"headers": ["X-A"]}, "headers"),
        ({"headers": {"X-A": 5}}, "headers[...]"),
        ({"headers": {"bad header": "v"}}, "headers"),
        ({"timeout": 30}, "timeout"),
    ],
    ids=[
        "no-org",
        "no-name",
        "no-kind",
        "empty-name",
        "unknown-kind",
        "kind-number",
        "ftp-url",
        "not-a-url",
        "empty-url",
        "empty-key",
        "key-number",
        "empty-api-version",
        "headers-list",
        "header-value-number",
        "header-name-with-space",
        "unknown-field",
    ],
)
async def test_invalid_provider_body_is_refused_naming_the_field(
    client: Client, world: World, change: dict[str, Any], param: str
) -> None:
    body = {**provider_body(world.org), **change}
    body = {k: v for k, v in body.items() if v is not None}
    response = await client.post(PROVIDERS, json=body, headers=ADMIN)
    error_of(response, 422, "validation_error", param=param)


@pytest.mark.parametrize(
    "prices",
    [
        {"m": {"input_per_mtok": "x", "output_per_mtok": "1"}},
        {"m": {"input_per_mtok": "-1", "output_per_mtok": "1"}},
        {"m": {"input_per_mtok": 0.15, "output_per_mtok": "1"}},
        {"m": {"input_per_mtok": "1.0000000001", "output_per_mtok": "1"}},
        {"m": {"input_per_mtok": "1"}},
        {"m": {"input_per_mtok": "1", "output_per_mtok": "1", "batch_per_mtok": "1"}},
        {"": {"input_per_mtok": "1", "output_per_mtok": "1"}},
    ],
    ids=["not-decimal", "negative", "number", "too-precise", "no-output", "unknown", "no-model"],
)
async def test_invalid_price_override_is_refused_naming_price_overrides(
    client: Client, world: World, prices: dict[str, Any]
) -> None:
    response = await client.post(
        PROVIDERS, json=provider_body(world.org, price_overrides=prices), headers=ADMIN
    )
    error = error_of(response, 422, "validation_error")
    assert error["param"].startswith("price_overrides")


async def test_provider_list_filters_by_organization_and_pages(
    client: Client, world: World
) -> None:
    ids = {world.provider}
    for i in range(3):
        ids.add((await create(client, PROVIDERS, provider_body(world.org, name=f"p{i}")))["id"])
    other = await create(client, "/api/admin/organizations", {"name": "globex"})
    foreign = await create(client, PROVIDERS, provider_body(other["id"]))

    listed = await walk_pages(client, PROVIDERS, organization_id=world.org)
    assert WORLD_CREDENTIAL not in repr(listed) and CREDENTIAL not in repr(listed)
    seen = [p["id"] for p in listed]
    assert sorted(seen) == seen
    assert set(seen) == ids and len(seen) == 4

    response = await client.get(PROVIDERS, params={"organization_id": other["id"]}, headers=ADMIN)
    assert [p["id"] for p in response.json()["data"]] == [foreign["id"]]
    response = await client.get(PROVIDERS, headers=ADMIN)
    assert len(response.json()["data"]) == 5


# Update


async def test_patch_replaces_the_credential_a_proxy_receives(
    client: Client, world: World, internal: Internal
) -> None:
    assert (await chain_of(internal, world))[0]["api_key"] == WORLD_CREDENTIAL
    response = await client.patch(
        f"{PROVIDERS}/{world.provider}", json={"api_key": CREDENTIAL}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    assert CREDENTIAL not in response.text
    assert response.json()["has_api_key"] is True
    assert (await chain_of(internal, world))[0]["api_key"] == CREDENTIAL


async def test_patch_null_clears_an_optional_credential(
    client: Client, world: World, database: Database
) -> None:
    created = await create(
        client,
        PROVIDERS,
        provider_body(world.org, kind="openai_compatible", base_url="http://vllm:8000/v1"),
    )
    assert created["has_api_key"] is True
    response = await client.patch(
        f"{PROVIDERS}/{created['id']}", json={"api_key": None}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    assert response.json()["has_api_key"] is False
    assert (await stored(database, created["id"])).api_key_encrypted is None


async def test_patch_cannot_clear_the_credential_of_a_kind_that_needs_one(
    client: Client, world: World, internal: Internal
) -> None:
    response = await client.patch(
        f"{PROVIDERS}/{world.provider}", json={"api_key": None}, headers=ADMIN
    )
    error_of(response, 422, "validation_error", param="api_key")
    assert (await get_provider(client, world.provider))["has_api_key"] is True
    assert (await chain_of(internal, world))[0]["api_key"] == WORLD_CREDENTIAL


async def test_patch_headers_replaces_them_and_null_clears_them(
    client: Client, world: World, internal: Internal
) -> None:
    path = f"{PROVIDERS}/{world.provider}"
    first = await client.patch(path, json={"headers": {"X-Old": "1", "X-Keep": "2"}}, headers=ADMIN)
    assert first.json()["header_names"] == ["X-Keep", "X-Old"]
    second = await client.patch(path, json={"headers": {"X-New": HEADER_VALUE}}, headers=ADMIN)
    assert second.status_code == 200
    assert HEADER_VALUE not in second.text
    assert second.json()["header_names"] == ["X-New"]
    assert (await chain_of(internal, world))[0]["headers"] == {"X-New": HEADER_VALUE}
    cleared = await client.patch(path, json={"headers": None}, headers=ADMIN)
    assert cleared.json()["header_names"] == []
    assert (await chain_of(internal, world))[0]["headers"] == {}


async def test_patch_leaves_fields_it_does_not_name_unchanged(
    client: Client, world: World, clock: ManualClock, internal: Internal
) -> None:
    before = await get_provider(client, world.provider)
    clock.advance(60)
    response = await client.patch(
        f"{PROVIDERS}/{world.provider}", json={"name": "openai-renamed"}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    after = response.json()
    assert after["name"] == "openai-renamed"
    assert after["updated_at"] == "2026-03-10T12:01:00Z"
    unchanged = {k: v for k, v in after.items() if k not in {"name", "updated_at"}}
    assert unchanged == {k: v for k, v in before.items() if k not in {"name", "updated_at"}}
    assert (await chain_of(internal, world))[0]["api_key"] == WORLD_CREDENTIAL


async def test_patch_base_url_null_restores_the_kind_default(client: Client, world: World) -> None:
    path = f"{PROVIDERS}/{world.provider}"
    moved = await client.patch(path, json={"base_url": "https://proxy.example/v1"}, headers=ADMIN)
    assert moved.json()["base_url"] == "https://proxy.example/v1"
    restored = await client.patch(path, json={"base_url": None}, headers=ADMIN)
    assert restored.json()["base_url"] == "https://api.openai.com/v1"


async def test_patch_cannot_clear_the_base_url_of_a_kind_that_needs_one(
    client: Client, world: World
) -> None:
    created = await create(
        client,
        PROVIDERS,
        provider_body(world.org, kind="openai_compatible", base_url="http://vllm:8000/v1"),
    )
    response = await client.patch(
        f"{PROVIDERS}/{created['id']}", json={"base_url": None}, headers=ADMIN
    )
    error_of(response, 422, "validation_error", param="base_url")
    assert (await get_provider(client, created["id"]))["base_url"] == "http://vllm:8000/v1"


async def test_patch_cannot_give_a_mock_provider_a_credential(client: Client, world: World) -> None:
    mock = await create(client, PROVIDERS, provider_body(world.org, kind="mock", api_key=None))
    response = await client.patch(
        f"{PROVIDERS}/{mock['id']}", json={"api_key": CREDENTIAL}, headers=ADMIN
    )
    error_of(response, 422, "validation_error", param="api_key")
    assert (await get_provider(client, mock["id"]))["has_api_key"] is False


async def test_patch_price_overrides_replaces_and_null_clears(client: Client, world: World) -> None:
    path = f"{PROVIDERS}/{world.provider}"
    prices = {"gpt-4o-mini": {"input_per_mtok": "0.1", "output_per_mtok": "0.4"}}
    set_ = await client.patch(path, json={"price_overrides": prices}, headers=ADMIN)
    assert set_.json()["price_overrides"] == prices
    cleared = await client.patch(path, json={"price_overrides": None}, headers=ADMIN)
    assert cleared.json()["price_overrides"] == {}


async def test_openai_format_providers_serve_the_responses_api_unless_told_not_to(
    client: Client, world: World, internal: Internal
) -> None:
    assert (await get_provider(client, world.provider))["responses_api"] is True
    assert (await chain_of(internal, world))[0]["responses_api"] is True
    compatible = await create(
        client,
        PROVIDERS,
        provider_body(
            world.org,
            name="vllm",
            kind="openai_compatible",
            base_url="http://vllm:8000/v1",
            responses_api=False,
        ),
    )
    assert compatible["responses_api"] is False
    path = f"{PROVIDERS}/{world.provider}"
    patched = await client.patch(path, json={"responses_api": False}, headers=ADMIN)
    assert patched.status_code == 200, patched.text
    assert patched.json()["responses_api"] is False
    # A proxy learns it with the credential chain, and translates for it from then on.
    assert (await chain_of(internal, world))[0]["responses_api"] is False


@pytest.mark.parametrize("kind", ["anthropic", "mock"])
async def test_responses_api_is_refused_for_kinds_the_proxy_always_translates_for(
    client: Client, world: World, kind: str
) -> None:
    api_key = None if kind == "mock" else CREDENTIAL
    refused = await client.post(
        PROVIDERS,
        json=provider_body(world.org, kind=kind, api_key=api_key, responses_api=True),
        headers=ADMIN,
    )
    error_of(refused, 422, "validation_error", param="responses_api")
    created = await create(client, PROVIDERS, provider_body(world.org, kind=kind, api_key=api_key))
    assert created["responses_api"] is False
    response = await client.patch(
        f"{PROVIDERS}/{created['id']}", json={"responses_api": False}, headers=ADMIN
    )
    error_of(response, 422, "validation_error", param="responses_api")


async def test_patch_to_a_taken_name_conflicts(client: Client, world: World) -> None:
    second = await create(client, PROVIDERS, provider_body(world.org, name="second"))
    response = await client.patch(
        f"{PROVIDERS}/{second['id']}", json={"name": "openai-main"}, headers=ADMIN
    )
    error_of(response, 409, "conflict", param="name")
    same = await client.patch(f"{PROVIDERS}/{second['id']}", json={"name": "second"}, headers=ADMIN)
    assert same.status_code == 200


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"kind": "anthropic"}, "kind"),
        ({"organization_id": "org_x"}, "organization_id"),
        ({"name": ""}, "name"),
        ({"name": None}, "name"),
        ({"api_key": 5}, "api_key"),
        ({"base_url": "nope"}, "base_url"),
    ],
    ids=["kind", "organization_id", "empty-name", "null-name", "key-number", "bad-url"],
)
async def test_invalid_patch_is_refused_naming_the_field(
    client: Client, world: World, body: dict[str, Any], param: str
) -> None:
    response = await client.patch(f"{PROVIDERS}/{world.provider}", json=body, headers=ADMIN)
    error_of(response, 422, "validation_error", param=param)


async def test_patch_of_unknown_provider_is_not_found(client: Client) -> None:
    response = await client.patch(f"{PROVIDERS}/prov_missing", json={"name": "x"}, headers=ADMIN)
    error_of(response, 404, "not_found")


async def test_patch_with_malformed_json_is_an_invalid_request(
    client: Client, world: World
) -> None:
    response = await client.patch(
        f"{PROVIDERS}/{world.provider}",
        content=b'{"name": ',
        headers={**ADMIN, "content-type": "application/json"},
    )
    error_of(response, 400, "invalid_request")


# Delete


async def test_delete_conflicts_while_a_routing_policy_uses_the_provider(
    client: Client, world: World
) -> None:
    spare = await create(client, PROVIDERS, provider_body(world.org, name="spare"))
    response = await client.delete(f"{PROVIDERS}/{world.provider}", headers=ADMIN)
    error_of(response, 409, "conflict")
    await get_provider(client, world.provider)

    moved = await client.patch(
        f"{POLICIES}/{world.policy}",
        json={"aliases": {"fast": [{"provider_id": spare["id"], "model": "gpt-4o-mini"}]}},
        headers=ADMIN,
    )
    assert moved.status_code == 200, moved.text
    deleted = await client.delete(f"{PROVIDERS}/{world.provider}", headers=ADMIN)
    assert deleted.status_code == 204
    assert deleted.content == b""
    error_of(await client.get(f"{PROVIDERS}/{world.provider}", headers=ADMIN), 404, "not_found")


async def test_delete_conflicts_while_a_budget_filters_on_the_provider(
    client: Client, world: World
) -> None:
    spare = await create(client, PROVIDERS, provider_body(world.org, name="spare"))
    budget = await create(
        client,
        BUDGETS,
        {
            "organization_id": world.org,
            "scope": {"kind": "organization"},
            "window": "month",
            "limit_usd": "10",
            "provider_id": spare["id"],
        },
    )
    error_of(await client.delete(f"{PROVIDERS}/{spare['id']}", headers=ADMIN), 409, "conflict")

    unfiltered = await client.patch(
        f"{BUDGETS}/{budget['id']}", json={"provider_id": None}, headers=ADMIN
    )
    assert unfiltered.status_code == 200, unfiltered.text
    assert (await client.delete(f"{PROVIDERS}/{spare['id']}", headers=ADMIN)).status_code == 204


async def test_delete_of_unknown_provider_is_not_found(client: Client) -> None:
    error_of(await client.delete(f"{PROVIDERS}/prov_missing", headers=ADMIN), 404, "not_found")


# Change feed and audit


async def test_create_update_and_delete_each_append_model_provider_updated(
    client: Client, world: World, internal: Internal
) -> None:
    start = await internal.revision()
    created = await create(client, PROVIDERS, provider_body(world.org, name="spare"))
    path = f"{PROVIDERS}/{created['id']}"
    assert (await client.patch(path, json={"api_key": "sk-new"}, headers=ADMIN)).status_code == 200
    assert (await client.delete(path, headers=ADMIN)).status_code == 204
    assert (
        await internal.events_since(start)
        == [("MODEL_PROVIDER_UPDATED", "provider", created["id"])] * 3
    )


async def test_refused_changes_append_no_event(
    client: Client, world: World, internal: Internal
) -> None:
    start = await internal.revision()
    path = f"{PROVIDERS}/{world.provider}"
    assert (await client.delete(path, headers=ADMIN)).status_code == 409
    assert (await client.patch(path, json={"api_key": None}, headers=ADMIN)).status_code == 422
    duplicate = provider_body(world.org, name="openai-main")
    assert (await client.post(PROVIDERS, json=duplicate, headers=ADMIN)).status_code == 409
    assert await internal.events_since(start) == []


async def test_provider_changes_are_audited_without_credentials(
    client: Client, world: World
) -> None:
    path = f"{PROVIDERS}/{world.provider}"
    patch = {"api_key": CREDENTIAL, "headers": {"X-T": HEADER_VALUE}}
    assert (await client.patch(path, json=patch, headers=ADMIN)).status_code == 200
    response = await client.get(
        "/api/admin/audit-log", params={"resource_id": world.provider}, headers=ADMIN
    )
    assert CREDENTIAL not in response.text and HEADER_VALUE not in response.text
    entries = response.json()["data"]
    assert [e["action"] for e in entries] == ["provider.create", "provider.update"]
    assert entries[0]["details"] == {"name": "openai-main", "kind": "openai"}
    assert entries[1]["details"] == {"fields": ["api_key", "headers"]}
    assert {e["organization_id"] for e in entries} == {world.org}
