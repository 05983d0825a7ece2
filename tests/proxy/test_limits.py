"""Rate limits and budgets through the real proxy, in-process counters, with the test's clock.

Prices come from a provider override so every request's cost is known: the fake provider
answers a plain chat with 11 prompt and 7 completion tokens.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from litestar import Litestar

from tests.proxy.conftest import (
    CHAT_ALIAS,
    UPSTREAM_CHAT_MODEL,
    RunningProxy,
    Tenant,
    add_key,
    add_policy,
    add_provider,
    openai_error,
    proxy_settings,
    serve_proxy,
)
from tests.support.api import ADMIN, create
from tests.support.clock import ManualClock
from tests.support.fake_openai import FakeOpenAI, serve_fake_openai
from tests.support.processes import free_port

SHARED_REDIS_URL = "redis://127.0.0.1:6379/0"

HELLO: Any = [{"role": "user", "content": "hello"}]
# 0.1 USD a token: a plain answer (11 + 7 tokens) costs 1.8 USD.
PRICE = {"input_per_mtok": "100000", "output_per_mtok": "100000"}
COST_USD = 1.8


def chat(max_tokens: int = 10, **fields: Any) -> dict[str, Any]:
    return {"model": CHAT_ALIAS, "messages": HELLO, "max_tokens": max_tokens, **fields}


def bearer(key: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **headers}


@pytest.fixture
async def priced(client: httpx.AsyncClient, fake_openai: FakeOpenAI) -> Tenant:
    org = (await create(client, "/api/admin/organizations", {"name": "limited"}))["id"]
    team = (await create(client, "/api/admin/teams", {"organization_id": org, "name": "t"}))["id"]
    project = (
        await create(
            client, "/api/admin/projects", {"organization_id": org, "name": "p", "team_id": team}
        )
    )["id"]
    provider = await add_provider(
        client,
        org,
        "priced",
        fake_openai.url,
        fake_openai.api_key,
        price_overrides={UPSTREAM_CHAT_MODEL: PRICE},
    )
    policy = await add_policy(client, org, {CHAT_ALIAS: [(provider, UPSTREAM_CHAT_MODEL)]})
    return Tenant(org, project, provider, policy, "", "")


async def budget(client: httpx.AsyncClient, tenant: Tenant, **fields: Any) -> str:
    body = {"organization_id": tenant.org, "window": "day", "on_breach": "block", **fields}
    return str((await create(client, "/api/admin/budgets", body))["id"])


async def post(
    http: httpx.AsyncClient, key: str, body: dict[str, Any], **headers: str
) -> httpx.Response:
    return await http.post("/v1/chat/completions", json=body, headers=bearer(key, **headers))


# -- rate limits --------------------------------------------------------------------------------


async def test_rpm_burst_admits_exactly_the_limit_then_the_refill_rate(
    client: httpx.AsyncClient, priced: Tenant, proxy: RunningProxy, clock: ManualClock
) -> None:
    _, key = await add_key(client, priced, limits={"rpm": 3})
    async with proxy.http() as http:
        answers = [await post(http, key, chat()) for _ in range(5)]
        assert [a.status_code for a in answers] == [200, 200, 200, 429, 429]
        refused = openai_error(answers[3], 429, "rate_limited")
        assert "3 requests per minute" in refused["message"]
        # 3 a minute refill one every 20 s.
        assert answers[3].headers["retry-after"] == "20"
        assert answers[0].headers["x-ratelimit-limit-requests"] == "3"
        assert answers[0].headers["x-ratelimit-remaining-requests"] == "2"
        assert answers[2].headers["x-ratelimit-remaining-requests"] == "0"
        assert answers[3].headers["x-ratelimit-reset-requests"] == "1m0s"
        clock.advance(20)
        assert (await post(http, key, chat())).status_code == 200
        assert (await post(http, key, chat())).status_code == 429


async def test_a_key_without_limits_gets_no_rate_limit_headers(
    priced: Tenant, client: httpx.AsyncClient, proxy: RunningProxy
) -> None:
    _, key = await add_key(client, priced)
    async with proxy.http() as http:
        answer = await post(http, key, chat())
    assert answer.status_code == 200
    assert not [h for h in answer.headers if h.startswith("x-ratelimit")]


async def test_errors_of_a_limited_key_carry_its_rate_limit_headers(
    priced: Tenant, client: httpx.AsyncClient, proxy: RunningProxy
) -> None:
    _, key = await add_key(client, priced, limits={"rpm": 10})
    async with proxy.http() as http:
        answer = await post(http, key, {**chat(), "model": "nope"})
    openai_error(answer, 404, "model_not_found")
    assert answer.headers["x-ratelimit-remaining-requests"] == "9"


async def test_tpm_reserves_the_estimate_and_settles_on_actual_tokens(
    priced: Tenant, client: httpx.AsyncClient, proxy: RunningProxy, clock: ManualClock
) -> None:
    _, key = await add_key(client, priced, limits={"tpm": 100})
    async with proxy.http() as http:
        too_big = await post(http, key, chat(max_tokens=500))
        error = openai_error(too_big, 429, "rate_limited")
        assert "exceed" in error["message"]
        first = await post(http, key, chat(max_tokens=40))
        assert first.status_code == 200
        assert first.headers["x-ratelimit-limit-tokens"] == "100"
        # Settled on the 18 tokens used, not the estimate: 82 remain, enough for another 40.
        second = await post(http, key, chat(max_tokens=40))
        assert second.status_code == 200
        remaining = int(second.headers["x-ratelimit-remaining-tokens"])
        assert remaining < 82


async def test_team_limit_is_shared_by_the_keys_of_its_projects(
    priced: Tenant, client: httpx.AsyncClient, proxy: RunningProxy
) -> None:
    team = (await client.get(f"/api/admin/projects/{priced.project}", headers=ADMIN)).json()[
        "team_id"
    ]
    patched = await client.patch(
        f"/api/admin/teams/{team}", json={"limits": {"rpm": 2}}, headers=ADMIN
    )
    assert patched.status_code == 200, patched.text
    _, one = await add_key(client, priced)
    _, two = await add_key(client, priced)
    async with proxy.http() as http:
        assert (await post(http, one, chat())).status_code == 200
        assert (await post(http, two, chat())).status_code == 200
        refused = await post(http, one, chat())
    assert "this key's team" in openai_error(refused, 429, "rate_limited")["message"]


async def test_max_concurrency_refuses_the_request_over_the_limit(
    priced: Tenant, client: httpx.AsyncClient, proxy: RunningProxy, fake_openai: FakeOpenAI
) -> None:
    _, key = await add_key(client, priced, limits={"max_concurrency": 2})
    fake_openai.hold = asyncio.Event()
    # A client repeating its X-Request-ID gets no shared slot.
    same = {"X-Request-ID": "req-1"}
    async with proxy.http() as http:
        held = [asyncio.ensure_future(post(http, key, chat(), **same)) for _ in range(2)]
        while len(fake_openai.received) < 2:
            await asyncio.sleep(0.01)
        third = await post(http, key, chat(), **same)
        fake_openai.hold.set()
        assert [(await h).status_code for h in held] == [200, 200]
        assert "2 requests at once" in openai_error(third, 429, "rate_limited")["message"]
        # The slots are free again.
        assert (await post(http, key, chat())).status_code == 200


# -- budgets ------------------------------------------------------------------------------------


async def test_budget_refuses_before_the_provider_is_paid_and_names_itself(
    priced: Tenant, client: httpx.AsyncClient, proxy: RunningProxy, fake_openai: FakeOpenAI
) -> None:
    key_id, key = await add_key(client, priced)
    budget_id = await budget(
        client, priced, scope={"kind": "virtual_key", "id": key_id}, limit_usd="10"
    )
    async with proxy.http() as http:
        statuses = [(await post(http, key, chat())).status_code for _ in range(8)]
        refused = await post(http, key, chat())
    # The worst case is priced on a bound of the prompt and max_tokens (about 5 USD); each
    # request settles at 1.8 USD. Spend stays at or under the limit.
    served = statuses.count(200)
    assert served * COST_USD <= 10
    assert statuses[:served] == [200] * served and set(statuses[served:]) == {402}
    calls = len(fake_openai.received)
    assert refused.status_code == 402
    error = refused.json()["error"]
    assert error["code"] == "budget_exceeded" and error["type"] == "budget_exceeded"
    assert error["budget_id"] == budget_id
    assert error["budget_scope"] == "virtual_key"
    assert error["budget_window"] == "day"
    assert error["limit_usd"] == "10"
    assert float(error["remaining_usd"]) == pytest.approx(10 - served * COST_USD)
    assert budget_id in error["message"]
    assert len(fake_openai.received) == calls, "a refused request never reaches the provider"


async def test_a_new_window_brings_a_fresh_allowance(
    priced: Tenant, client: httpx.AsyncClient, proxy: RunningProxy, clock: ManualClock
) -> None:
    clock.set(datetime(2026, 3, 10, 23, 59, tzinfo=UTC))
    key_id, key = await add_key(client, priced)
    await budget(client, priced, scope={"kind": "virtual_key", "id": key_id}, limit_usd="6")
    async with proxy.http() as http:
        assert (await post(http, key, chat())).status_code == 200
        assert (await post(http, key, chat())).status_code == 402
        clock.set(datetime(2026, 3, 11, 0, 0, 1, tzinfo=UTC))
        assert (await post(http, key, chat())).status_code == 200
        assert (await post(http, key, chat())).status_code == 402
        clock.set(clock.now() + timedelta(days=1))
        assert (await post(http, key, chat())).status_code == 200


async def test_warn_budget_never_blocks_and_says_so_from_80_percent(
    priced: Tenant, client: httpx.AsyncClient, proxy: RunningProxy
) -> None:
    key_id, key = await add_key(client, priced)
    budget_id = await budget(
        client,
        priced,
        scope={"kind": "virtual_key", "id": key_id},
        limit_usd="5",
        on_breach="warn",
    )
    async with proxy.http() as http:
        answers = [await post(http, key, chat()) for _ in range(5)]
    assert [a.status_code for a in answers] == [200] * 5
    warnings = [a.headers.get("x-vkgate-budget-warning") for a in answers]
    assert warnings[-1] is not None and budget_id in warnings[-1]
    assert all(w is not None for w in warnings[2:])


async def test_provider_filtered_budget_removes_only_that_provider(
    priced: Tenant, client: httpx.AsyncClient, proxy: RunningProxy
) -> None:
    async with serve_fake_openai() as other:
        backup = await add_provider(
            client,
            priced.org,
            "backup",
            other.url,
            other.api_key,
            price_overrides={UPSTREAM_CHAT_MODEL: PRICE},
        )
        both = await add_policy(
            client,
            priced.org,
            {CHAT_ALIAS: [(priced.provider, UPSTREAM_CHAT_MODEL), (backup, UPSTREAM_CHAT_MODEL)]},
        )
        only = await add_policy(
            client, priced.org, {CHAT_ALIAS: [(priced.provider, UPSTREAM_CHAT_MODEL)]}
        )
        _, key = await add_key(client, priced, policy=both)
        _, single = await add_key(client, priced, policy=only)
        await budget(
            client,
            priced,
            scope={"kind": "organization"},
            provider_id=priced.provider,
            limit_usd="0.5",
        )
        async with proxy.http() as http:
            answer = await post(http, key, chat())
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-vkgate-provider"] == "backup"
            assert len(other.received) == 1
            refused = await post(http, single, chat())
    assert refused.status_code == 402
    assert refused.json()["error"]["budget_scope"] == "organization"


async def test_per_end_user_budget_gives_each_end_user_their_own_allowance(
    priced: Tenant, client: httpx.AsyncClient, proxy: RunningProxy
) -> None:
    _, key = await add_key(client, priced)
    await budget(client, priced, scope={"kind": "end_user"}, limit_usd="6.5")
    async with proxy.http() as http:
        anonymous = await post(http, key, chat())
        error = openai_error(anonymous, 400, "end_user_required")
        assert "X-Vkgate-End-User" in error["message"]
        assert (await post(http, key, chat(user="alice"))).status_code == 200
        assert (await post(http, key, chat(user="alice"))).status_code == 402
        # The header names the end user before the body's `user` does.
        assert (
            await post(http, key, chat(user="alice"), **{"X-Vkgate-End-User": "bob"})
        ).status_code == 200
        assert (await post(http, key, chat(), **{"X-Vkgate-End-User": "bob"})).status_code == 402


# -- Redis unreachable --------------------------------------------------------------------------


async def test_without_redis_a_replica_falls_back_to_its_own_counters_and_says_so(
    app: Litestar,
    client: httpx.AsyncClient,
    clock: ManualClock,
    priced: Tenant,
    caplog: pytest.LogCaptureFixture,
) -> None:
    closed = free_port()  # nothing listens there
    settings = proxy_settings(redis_url=f"redis://127.0.0.1:{closed}/0", redis_timeout_s=0.2)
    _, key = await add_key(client, priced, limits={"rpm": 2})
    # The proxy's own logging set-up does not propagate to the root logger caplog listens on.
    logger = logging.getLogger("vkgate.proxy.limits")
    logger.addHandler(caplog.handler)
    try:
        async with serve_proxy(app, clock, settings) as proxy, proxy.http() as http:
            statuses = [(await post(http, key, chat())).status_code for _ in range(3)]
            ready = (await http.get("/readyz")).json()
            degraded = proxy.metrics.registry.get_sample_value("vkgate_limits_redis_fallback")
    finally:
        logger.removeHandler(caplog.handler)
    # Limits still hold, per replica.
    assert statuses == [200, 200, 429]
    assert ready["limits"] == "in-process (redis unreachable)"
    assert degraded == 1
    assert any("limits_redis_unreachable" in r.getMessage() for r in caplog.records)


async def test_with_redis_requests_are_admitted_from_leased_slices_and_the_metrics_say_so(
    app: Litestar,
    client: httpx.AsyncClient,
    clock: ManualClock,
    priced: Tenant,
) -> None:
    settings = proxy_settings(redis_url=SHARED_REDIS_URL)
    _, key = await add_key(client, priced, limits={"rpm": 10_000})
    async with serve_proxy(app, clock, settings) as proxy, proxy.http() as http:
        statuses = [(await post(http, key, chat())).status_code for _ in range(20)]
        ready = (await http.get("/readyz")).json()
        sample = proxy.metrics.registry.get_sample_value
        taken = sample("vkgate_limits_leases_total", {"event": "taken"})
        local = sample("vkgate_limits_admissions_total", {"source": "lease"})
        synced = sample("vkgate_limits_admissions_total", {"source": "redis"})
        share = sample("vkgate_limits_served_without_redis_ratio")
    assert statuses == [200] * 20
    assert ready["limits"] == "redis"
    assert taken is not None and taken >= 1
    assert local is not None and synced is not None
    assert local + synced == 20 and local > synced, "most were served from a slice"
    assert share == local / 20
