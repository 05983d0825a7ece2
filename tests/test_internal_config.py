"""`GET config/{vk_id}`: the materialised bundle a proxy serves a key from, with its ETag."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import genai_prices
import httpx
import pytest
from genai_prices import Usage

from tests.conftest import Internal, World
from tests.support.api import ADMIN
from tests.support.clock import ManualClock
from vkgate.clock import rfc3339

CONFIG = "/api/internal/gateway/config"
PROVIDER_KEY = "sk-test-provider-credential-7d1f"  # what the `world` fixture sealed


async def admin(
    client: httpx.AsyncClient, method: str, path: str, body: dict[str, Any]
) -> dict[str, Any]:
    response = await client.request(method, path, json=body, headers=ADMIN)
    assert response.status_code in (200, 201), response.text
    answer: dict[str, Any] = response.json()
    return answer


async def config(internal: Internal, vk_id: str, etag: str | None = None) -> httpx.Response:
    headers = {"If-None-Match": etag} if etag else None
    return await internal.call("GET", f"{CONFIG}/{vk_id}", headers=headers)


async def bundle(internal: Internal, vk_id: str) -> dict[str, Any]:
    response = await config(internal, vk_id)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def add_budget(
    client: httpx.AsyncClient,
    org: str,
    kind: str,
    scope_id: str | None,
    window: str,
    limit: str = "10",
) -> str:
    scope = {"kind": kind} if scope_id is None else {"kind": kind, "id": scope_id}
    created = await admin(
        client,
        "POST",
        "/api/admin/budgets",
        {"organization_id": org, "scope": scope, "window": window, "limit_usd": limit},
    )
    budget_id: str = created["id"]
    return budget_id


# --- contents -----------------------------------------------------------------------------------


async def test_bundle_carries_limits_allowed_models_and_every_alias_chain(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    vllm = await admin(
        client,
        "POST",
        "/api/admin/providers",
        {
            "organization_id": world.org,
            "name": "vllm",
            "kind": "openai_compatible",
            "base_url": "http://vllm.internal:8000/v1/",
            "headers": {"X-Tenant": "acme"},
        },
    )
    await admin(
        client,
        "PATCH",
        f"/api/admin/providers/{world.provider}",
        {"price_overrides": {"gpt-4o-mini": {"input_per_mtok": "0.15", "output_per_mtok": "0.6"}}},
    )
    await admin(
        client,
        "PATCH",
        f"/api/admin/routing-policies/{world.policy}",
        {
            "aliases": {
                "fast": [
                    {"provider_id": world.provider, "model": "gpt-4o-mini"},
                    {"provider_id": vllm["id"], "model": "llama-3.1-8b"},
                ],
                "smart": [{"provider_id": world.provider, "model": "gpt-4o"}],
            }
        },
    )
    key = await admin(
        client,
        "PATCH",
        f"/api/admin/virtual-keys/{world.key_id}",
        {"allowed_models": ["fast"], "limits": {"rpm": 60, "tpm": 10000}},
    )

    got = await bundle(internal, world.key_id)

    assert got["vk_id"] == world.key_id
    assert got["organization_id"] == world.org
    assert got["project_id"] == world.project
    assert got["team_id"] == world.team
    assert got["status"] == "active"
    assert got["revision"] == key["revision"]
    assert got["limits"] == {"rpm": 60, "tpm": 10000}
    assert got["allowed_models"] == ["fast"]
    assert got["expires_at"] is None
    assert list(got["aliases"]) == ["fast", "smart"]
    assert got["aliases"]["fast"] == [
        {
            "provider_id": world.provider,
            "provider_name": "openai-main",
            "kind": "openai",
            "base_url": "https://api.openai.com/v1",
            "model": "gpt-4o-mini",
            "api_key": PROVIDER_KEY,
            "api_version": None,
            "headers": {},
            "price": {"input_per_mtok": "0.15", "output_per_mtok": "0.6"},
            "max_output_tokens": context_window("openai", "gpt-4o-mini"),
            "unit_price": None,
            "responses_api": True,
            "settings": {},
            "credentials": {},
        },
        {
            "provider_id": vllm["id"],
            "provider_name": "vllm",
            "kind": "openai_compatible",
            "base_url": "http://vllm.internal:8000/v1",
            "model": "llama-3.1-8b",
            "api_key": None,
            "api_version": None,
            "headers": {"X-Tenant": "acme"},
            "price": None,
            "max_output_tokens": None,
            "unit_price": None,
            "responses_api": True,
            "settings": {},
            "credentials": {},
        },
    ]
    # A price override is per upstream model: gpt-4o has none, so genai-prices' price is sent.
    assert got["aliases"]["smart"][0]["model"] == "gpt-4o"
    assert got["aliases"]["smart"][0]["price"] == genai_price("openai", "gpt-4o")
    assert got["team_limits"] == {}


async def test_bundle_carries_unit_prices_from_overrides_and_genai_prices(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    overrides = {
        "dall-e-3": {"per_image": {"1024x1024": "0.04", "*/hd": "0.12"}},
        "gpt-image-1": {
            "input_per_mtok": "5",
            "output_per_mtok": "40",
            "input_image_per_mtok": "10",
        },
    }
    await admin(
        client, "PATCH", f"/api/admin/providers/{world.provider}", {"price_overrides": overrides}
    )
    aliases = {"dalle": "dall-e-3", "image": "gpt-image-1", "whisper": "whisper-1", "tts": "tts-1"}
    await admin(
        client,
        "PATCH",
        f"/api/admin/routing-policies/{world.policy}",
        {
            "aliases": {
                alias: [{"provider_id": world.provider, "model": model}]
                for alias, model in aliases.items()
            }
        },
    )
    got = await bundle(internal, world.key_id)
    [dalle], [image], [whisper], [tts] = (
        got["aliases"][a] for a in ("dalle", "image", "whisper", "tts")
    )
    assert (dalle["price"], dalle["unit_price"]) == (
        None,
        {"per_image": overrides["dall-e-3"]["per_image"]},
    )
    assert image["price"] == {"input_per_mtok": "5", "output_per_mtok": "40"}
    assert image["unit_price"] == {"input_image_per_mtok": "10"}
    # genai-prices: whisper-1 by the second, tts-1 by the character, and no token price.
    assert (whisper["price"], whisper["unit_price"]) == (None, {"per_second": "0.0001"})
    assert (tts["price"], tts["unit_price"]) == (None, {"per_character": "0.000015"})


async def test_bundle_carries_the_keys_expiry_and_metadata(
    client: httpx.AsyncClient, internal: Internal, world: World, clock: ManualClock
) -> None:
    expires = rfc3339(clock.now() + timedelta(days=7))
    await admin(
        client,
        "PATCH",
        f"/api/admin/virtual-keys/{world.key_id}",
        {"expires_at": expires, "metadata": {"cost_center": "42"}},
    )
    got = await bundle(internal, world.key_id)
    assert got["expires_at"] == expires
    assert got["metadata"] == {"cost_center": "42"}
    assert got["limits"] == {}
    assert got["allowed_models"] is None


async def test_bundle_lists_exactly_the_budgets_whose_scope_covers_the_key(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    other_team = (
        await admin(
            client, "POST", "/api/admin/teams", {"organization_id": world.org, "name": "ops"}
        )
    )["id"]
    other_project = (
        await admin(
            client,
            "POST",
            "/api/admin/projects",
            {"organization_id": world.org, "team_id": other_team, "name": "batch"},
        )
    )["id"]
    other_key = (
        await admin(
            client,
            "POST",
            "/api/admin/virtual-keys",
            {"project_id": world.project, "name": "other", "routing_policy_id": world.policy},
        )
    )["id"]
    other_org = (await admin(client, "POST", "/api/admin/organizations", {"name": "globex"}))["id"]

    covering = {
        await add_budget(client, world.org, "organization", None, "month"),
        await add_budget(client, world.org, "team", world.team, "week"),
        await add_budget(client, world.org, "project", world.project, "day"),
        await add_budget(client, world.org, "virtual_key", world.key_id, "total"),
        await add_budget(client, world.org, "end_user", None, "day"),
    }
    await add_budget(client, world.org, "team", other_team, "week")
    await add_budget(client, world.org, "project", other_project, "day")
    await add_budget(client, world.org, "virtual_key", other_key, "total")
    await add_budget(client, other_org, "organization", None, "month")

    budgets = (await bundle(internal, world.key_id))["budgets"]

    assert {b["budget_id"] for b in budgets} == covering
    scopes = {(b["scope_kind"], b["scope_id"]) for b in budgets}
    assert scopes == {
        ("organization", world.org),
        ("team", world.team),
        ("project", world.project),
        ("virtual_key", world.key_id),
        ("end_user", None),
    }


async def test_a_project_without_a_team_gets_no_team_budgets(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    loose = (
        await admin(
            client, "POST", "/api/admin/projects", {"organization_id": world.org, "name": "loose"}
        )
    )["id"]
    key = await admin(
        client,
        "POST",
        "/api/admin/virtual-keys",
        {"project_id": loose, "name": "loose", "routing_policy_id": world.policy},
    )
    await add_budget(client, world.org, "team", world.team, "week")
    org_budget = await add_budget(client, world.org, "organization", None, "month")

    got = await bundle(internal, key["id"])
    assert got["team_id"] is None
    assert [b["budget_id"] for b in got["budgets"]] == [org_budget]


async def test_budget_state_names_its_limit_and_current_calendar_window(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    # The manual clock starts on Tuesday 2026-03-10 12:00 UTC.
    ids = {
        window: await add_budget(client, world.org, "organization", None, window, "12.5")
        for window in ("day", "week", "month", "total")
    }
    states = {b["budget_id"]: b for b in (await bundle(internal, world.key_id))["budgets"]}

    windows = {
        window: (states[i]["window_start"], states[i]["window_end"]) for window, i in ids.items()
    }
    assert windows == {
        "day": ("2026-03-10T00:00:00Z", "2026-03-11T00:00:00Z"),
        "week": ("2026-03-09T00:00:00Z", "2026-03-16T00:00:00Z"),
        "month": ("2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z"),
        "total": (None, None),
    }
    day = states[ids["day"]]
    assert day["limit_usd"] == "12.5"
    assert day["on_breach"] == "block"
    assert day["spent_usd"] == "0"
    assert day["window"] == "day"
    assert day["provider_id"] is None


async def test_budget_windows_roll_over_the_year_end(
    client: httpx.AsyncClient, internal: Internal, world: World, clock: ManualClock
) -> None:
    ids = {
        window: await add_budget(client, world.org, "organization", None, window)
        for window in ("day", "week", "month")
    }
    clock.set(datetime(2026, 12, 31, 23, 30, tzinfo=UTC))  # a Thursday
    states = {b["budget_id"]: b for b in (await bundle(internal, world.key_id))["budgets"]}

    assert states[ids["day"]]["window_end"] == "2027-01-01T00:00:00Z"
    assert states[ids["week"]]["window_start"] == "2026-12-28T00:00:00Z"
    assert states[ids["week"]]["window_end"] == "2027-01-04T00:00:00Z"
    assert states[ids["month"]]["window_start"] == "2026-12-01T00:00:00Z"
    assert states[ids["month"]]["window_end"] == "2027-01-01T00:00:00Z"


# --- prices ------------------------------------------------------------------------------------


def _usd_per_mtok(provider_id: str, model: str, usage: Usage) -> str:
    """What genai-prices charges for `usage` (a thousand tokens of one kind), per million tokens:
    worked out from its price calculation, not from the sheet the control plane reads."""
    calculated = genai_prices.calc_price(usage, model_ref=model, provider_id=provider_id)
    return format((calculated.total_price * 1000).normalize(), "f")


def genai_price(provider_id: str, model: str) -> dict[str, str]:
    """The bundle's price of a genai-prices model with a cache-read rate and no cache-write one."""
    return {
        "input_per_mtok": _usd_per_mtok(provider_id, model, Usage(input_tokens=1000)),
        "output_per_mtok": _usd_per_mtok(provider_id, model, Usage(output_tokens=1000)),
        "cache_read_per_mtok": _usd_per_mtok(
            provider_id, model, Usage(input_tokens=1000, cache_read_tokens=1000)
        ),
    }


def context_window(provider_id: str, model: str) -> int:
    found = genai_prices.calc_price(Usage(), model_ref=model, provider_id=provider_id)
    window = found.model.context_window
    assert window is not None
    return window


async def add_provider(client: httpx.AsyncClient, org: str, name: str, kind: str) -> str:
    body: dict[str, Any] = {"organization_id": org, "name": name, "kind": kind}
    if kind != "mock":
        body["api_key"] = "sk-test-other-provider"
    if kind == "azure_openai":
        body["base_url"] = "https://acme.openai.azure.com"
        body["api_version"] = "2024-10-21"
    created = await admin(client, "POST", "/api/admin/providers", body)
    provider_id: str = created["id"]
    return provider_id


async def route(client: httpx.AsyncClient, world: World, chain: list[tuple[str, str]]) -> None:
    """The policy's `fast` alias becomes `chain` of (provider id, upstream model)."""
    await admin(
        client,
        "PATCH",
        f"/api/admin/routing-policies/{world.policy}",
        {"aliases": {"fast": [{"provider_id": p, "model": m} for p, m in chain]}},
    )


async def test_a_target_without_an_override_carries_genai_prices_price_and_output_cap(
    internal: Internal, world: World
) -> None:
    [target] = (await bundle(internal, world.key_id))["aliases"]["fast"]
    assert target["model"] == "gpt-4o-mini"
    assert target["price"] == genai_price("openai", "gpt-4o-mini")
    assert Decimal(target["price"]["input_per_mtok"]) > 0
    assert target["max_output_tokens"] == context_window("openai", "gpt-4o-mini")


async def test_an_override_wins_over_genai_prices_and_the_cap_still_comes_from_it(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    override = {
        "input_per_mtok": "0.1",
        "output_per_mtok": "0.4",
        "cache_read_per_mtok": "0.05",
        "cache_write_per_mtok": "0.125",
    }
    await admin(
        client,
        "PATCH",
        f"/api/admin/providers/{world.provider}",
        {"price_overrides": {"gpt-4o-mini": override}},
    )
    [target] = (await bundle(internal, world.key_id))["aliases"]["fast"]
    assert target["price"] == override
    assert target["max_output_tokens"] == context_window("openai", "gpt-4o-mini")


async def test_an_override_prices_a_model_genai_prices_does_not_know(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    await admin(
        client,
        "PATCH",
        f"/api/admin/providers/{world.provider}",
        {"price_overrides": {"ft:acme-1": {"input_per_mtok": "3", "output_per_mtok": "12"}}},
    )
    await route(client, world, [(world.provider, "ft:acme-1")])
    [target] = (await bundle(internal, world.key_id))["aliases"]["fast"]
    assert target["price"] == {"input_per_mtok": "3", "output_per_mtok": "12"}
    assert target["max_output_tokens"] is None


async def test_a_mock_provider_and_an_unknown_model_have_no_price_and_no_cap(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    mock = await add_provider(client, world.org, "offline", "mock")
    # The mock provider costs nothing, whatever model name it is asked to play.
    await route(client, world, [(mock, "gpt-4o-mini"), (world.provider, "acme-unreleased-9")])
    chain = (await bundle(internal, world.key_id))["aliases"]["fast"]
    assert [(t["kind"], t["price"], t["max_output_tokens"]) for t in chain] == [
        ("mock", None, None),
        ("openai", None, None),
    ]


async def test_a_tiered_price_is_sent_as_its_base_rates(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    anthropic = await add_provider(client, world.org, "anthropic", "anthropic")
    await route(client, world, [(anthropic, "claude-sonnet-4-5")])
    [target] = (await bundle(internal, world.key_id))["aliases"]["fast"]
    # A thousand tokens are below every tier: genai-prices charges the base rate for them.
    assert target["price"] == {
        **genai_price("anthropic", "claude-sonnet-4-5"),
        "cache_write_per_mtok": _usd_per_mtok(
            "anthropic", "claude-sonnet-4-5", Usage(input_tokens=1000, cache_write_tokens=1000)
        ),
    }
    assert target["max_output_tokens"] == context_window("anthropic", "claude-sonnet-4-5")


async def test_an_azure_deployment_is_priced_as_azure_sells_the_model(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    azure = await add_provider(client, world.org, "azure", "azure_openai")
    await route(client, world, [(azure, "gpt-4o")])
    [target] = (await bundle(internal, world.key_id))["aliases"]["fast"]
    assert target["price"] == genai_price("azure", "gpt-4o")


# --- ETag ---------------------------------------------------------------------------------------


async def test_bundle_has_a_stable_etag_and_is_not_cached_by_intermediaries(
    internal: Internal, world: World
) -> None:
    first = await config(internal, world.key_id)
    second = await config(internal, world.key_id)

    assert first.headers["etag"].startswith('"')
    assert first.headers["etag"] == second.headers["etag"]
    assert first.headers["cache-control"] == "no-store"
    assert PROVIDER_KEY not in first.headers["etag"]


async def test_the_etag_of_a_priced_bundle_holds_as_time_passes(
    internal: Internal, world: World, clock: ManualClock
) -> None:
    first = await config(internal, world.key_id)
    assert first.json()["aliases"]["fast"][0]["price"] is not None
    clock.advance(3 * 3600)
    later = await config(internal, world.key_id, first.headers["etag"])
    assert later.status_code == 304


async def test_if_none_match_with_the_current_etag_is_304_without_a_body(
    internal: Internal, world: World
) -> None:
    etag = (await config(internal, world.key_id)).headers["etag"]
    response = await config(internal, world.key_id, etag)

    assert response.status_code == 304
    assert response.content == b""
    assert response.headers["etag"] == etag


async def test_if_none_match_with_another_etag_gets_the_full_bundle(
    internal: Internal, world: World
) -> None:
    response = await config(internal, world.key_id, '"0123456789abcdef0123456789abcdef"')
    assert response.status_code == 200
    assert response.json()["vk_id"] == world.key_id


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/admin/providers/{provider}", {"api_key": "sk-test-rotated-credential-99"}),
        ("/api/admin/virtual-keys/{key}", {"limits": {"rpm": 1}}),
        (
            "/api/admin/routing-policies/{policy}",
            {"aliases": {"fast": [{"provider_id": "{provider}", "model": "gpt-4o"}]}},
        ),
    ],
    ids=["provider-credential", "key-limits", "policy-chain"],
)
async def test_a_change_the_bundle_shows_gives_a_new_etag(
    client: httpx.AsyncClient,
    internal: Internal,
    world: World,
    path: str,
    body: dict[str, Any],
) -> None:
    ids = {"provider": world.provider, "key": world.key_id, "policy": world.policy}
    before = await config(internal, world.key_id)
    filled = _fill(body, ids)
    await admin(client, "PATCH", path.format(**ids), filled)

    after = await config(internal, world.key_id, before.headers["etag"])

    assert after.status_code == 200
    assert after.headers["etag"] != before.headers["etag"]
    assert after.json() != before.json()


async def test_a_new_budget_gives_a_new_etag(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    before = (await config(internal, world.key_id)).headers["etag"]
    await add_budget(client, world.org, "organization", None, "month")
    after = await config(internal, world.key_id, before)

    assert after.status_code == 200
    assert after.headers["etag"] != before
    assert len(after.json()["budgets"]) == 1


async def test_the_rotated_credential_is_what_the_new_bundle_carries(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    await admin(
        client, "PATCH", f"/api/admin/providers/{world.provider}", {"api_key": "sk-test-new-1"}
    )
    chain = (await bundle(internal, world.key_id))["aliases"]["fast"]
    assert chain[0]["api_key"] == "sk-test-new-1"


def _fill(body: Any, ids: dict[str, str]) -> Any:
    if isinstance(body, dict):
        return {k: _fill(v, ids) for k, v in body.items()}
    if isinstance(body, list):
        return [_fill(v, ids) for v in body]
    if isinstance(body, str):
        return body.format(**ids)
    return body


# --- refusals -----------------------------------------------------------------------------------


async def test_an_unknown_key_id_is_404(internal: Internal, world: World) -> None:
    response = await config(internal, "vk_000000000000000000000000")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("action", "status", "code"),
    [("revoke", 403, "virtual_key_revoked"), ("disable", 403, "virtual_key_disabled")],
)
async def test_a_revoked_or_disabled_key_has_no_bundle(
    client: httpx.AsyncClient,
    internal: Internal,
    world: World,
    action: str,
    status: int,
    code: str,
) -> None:
    etag = (await config(internal, world.key_id)).headers["etag"]
    await admin(client, "POST", f"/api/admin/virtual-keys/{world.key_id}/{action}", {})

    for response in (
        await config(internal, world.key_id),
        await config(internal, world.key_id, etag),
    ):
        assert response.status_code == status
        assert response.json()["error"]["code"] == code


async def test_an_expired_key_has_no_bundle(
    client: httpx.AsyncClient, internal: Internal, world: World, clock: ManualClock
) -> None:
    await admin(
        client,
        "PATCH",
        f"/api/admin/virtual-keys/{world.key_id}",
        {"expires_at": rfc3339(clock.now() + timedelta(minutes=1))},
    )
    clock.advance(60)
    response = await config(internal, world.key_id)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "virtual_key_expired"
