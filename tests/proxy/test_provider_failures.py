"""When the provider or the control plane fails: what the client gets, and when the chain falls
through to the next credential."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import openai
import pytest
from litestar import Litestar

from tests.proxy.conftest import (
    CHAT_ALIAS,
    UPSTREAM_CHAT_MODEL,
    Answer,
    RunningProxy,
    Tenant,
    add_key,
    add_policy,
    add_provider,
    openai_error,
    proxy_settings,
    refused_within,
    serve_proxy,
)
from tests.support.api import ADMIN
from tests.support.clock import ManualClock
from tests.support.fake_openai import REPLY, FakeOpenAI
from tests.support.processes import free_port

HELLO: Any = [{"role": "user", "content": "hello"}]


async def refusal(proxy: RunningProxy, key: str, *, stream: bool = False) -> Answer:
    async with proxy.openai(key) as client:
        with pytest.raises(openai.APIStatusError) as refused:
            if stream:
                await client.chat.completions.create(model=CHAT_ALIAS, messages=HELLO, stream=True)
            else:
                await client.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
    return refused.value.response


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


# -- a provider's answer -------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_provider_4xx_reaches_the_client_with_its_own_status_and_body(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI, status: int
) -> None:
    fake_openai.fail_next(status, "the provider's own words")
    response = await refusal(proxy, tenant.key)
    assert response.status_code == status
    assert response.json() == fake_openai_failure_body(status, "the provider's own words")
    assert response.headers["x-request-id"]
    assert response.headers["x-vkgate-provider"] == "fake-openai"
    assert len(fake_openai.received) == 1


def fake_openai_failure_body(status: int, message: str) -> dict[str, object]:
    kind = "rate_limit_error" if status == 429 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


async def test_provider_429_reaches_the_client_with_retry_after(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    fake_openai.fail_next(429, "slow down", **{"Retry-After": "7"})
    async with proxy.openai(tenant.key) as client:
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
    response = refused.value.response
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.json() == fake_openai_failure_body(429, "slow down")


async def test_provider_4xx_on_a_stream_reaches_the_client_as_is(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    fake_openai.fail_next(400, "bad stream")
    response = await refusal(proxy, tenant.key, stream=True)
    assert response.status_code == 400
    assert response.json() == fake_openai_failure_body(400, "bad stream")


async def test_provider_with_a_wrong_credential_is_its_401_not_a_5xx(
    proxy: RunningProxy, tenant: Tenant, client: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    provider = await add_provider(client, tenant.org, "wrong-credential", fake_openai.url, "sk-no")
    policy = await add_policy(client, tenant.org, {CHAT_ALIAS: [(provider, UPSTREAM_CHAT_MODEL)]})
    _, key = await add_key(client, tenant, policy=policy)
    response = await refusal(proxy, key)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert response.headers["x-vkgate-provider"] == "wrong-credential"


@pytest.mark.parametrize("status", [500, 502, 503])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_provider_5xx_is_502_provider_error(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI, status: int, stream: bool
) -> None:
    fake_openai.fail_next(status, "internal details the client need not see")
    response = await refusal(proxy, tenant.key, stream=stream)
    error = openai_error(response, 502, "provider_error")
    assert "internal details" not in error["message"]


# -- a provider that does not answer -------------------------------------------------------------


@pytest.fixture
async def impatient_proxy(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock
) -> AsyncIterator[RunningProxy]:
    async with serve_proxy(app, clock, proxy_settings(first_byte_timeout_s=0.2)) as running:
        yield running


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_provider_stalling_past_the_first_byte_timeout_is_504(
    impatient_proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI, stream: bool
) -> None:
    fake_openai.stall_s = 1.0
    response = await refusal(impatient_proxy, tenant.key, stream=stream)
    openai_error(response, 504, "provider_timeout")


async def test_unreachable_provider_is_502_provider_error(
    proxy: RunningProxy, tenant: Tenant, client: httpx.AsyncClient
) -> None:
    dead = await add_provider(client, tenant.org, "dead", closed_port_url())
    policy = await add_policy(client, tenant.org, {CHAT_ALIAS: [(dead, UPSTREAM_CHAT_MODEL)]})
    _, key = await add_key(client, tenant, policy=policy)
    for stream in (False, True):
        openai_error(await refusal(proxy, key, stream=stream), 502, "provider_error")


# -- the control plane ---------------------------------------------------------------------------


def refusing(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def failing(request: httpx.Request) -> httpx.Response:
    return httpx.Response(500, json={"error": {"message": "boom"}})


@pytest.mark.parametrize("answer", [refusing, failing], ids=["connect-error", "http-500"])
async def test_control_plane_unreachable_on_a_cache_miss_is_503(
    clock: ManualClock,
    fake_openai: FakeOpenAI,
    answer: Callable[[httpx.Request], httpx.Response],
) -> None:
    transport = httpx.MockTransport(answer)
    async with serve_proxy(None, clock, proxy_settings(), control_transport=transport) as proxy:
        response = await refusal(proxy, "vk-some-key-the-proxy-cannot-check")
    openai_error(response, 503, "auth_upstream_unavailable")
    assert fake_openai.received == []


# -- falling through the chain -------------------------------------------------------------------


async def two_credential_key(
    client: httpx.AsyncClient, tenant: Tenant, first_url: str, second_url: str
) -> tuple[str, str]:
    """A key (id, key) whose chat alias tries "primary", then "secondary"."""
    first = await add_provider(client, tenant.org, "primary", first_url)
    second = await add_provider(client, tenant.org, "secondary", second_url)
    chain = [(first, "primary-model"), (second, "secondary-model")]
    policy = await add_policy(client, tenant.org, {CHAT_ALIAS: chain})
    return await add_key(client, tenant, policy=policy)


async def attempt_held_at_the_first_provider(
    proxy: RunningProxy, key: str, fake_openai: FakeOpenAI
) -> asyncio.Task[Answer]:
    """A request of `key` (cached first) whose first provider holds its 500 until released."""
    async with proxy.openai(key) as sdk:
        await sdk.models.list()
    fake_openai.hold = asyncio.Event()
    fake_openai.fail_next(500)
    attempt = asyncio.create_task(refusal(proxy, key))
    while not fake_openai.received:
        assert not attempt.done()
        await asyncio.sleep(0.01)
    return attempt


@pytest.mark.parametrize("status", [500, 503, 429])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_chain_falls_through_a_failing_first_provider_to_the_second(
    proxy: RunningProxy,
    tenant: Tenant,
    client: httpx.AsyncClient,
    fake_openai: FakeOpenAI,
    status: int,
    stream: bool,
) -> None:
    _, key = await two_credential_key(client, tenant, fake_openai.url, fake_openai.url)
    fake_openai.fail_next(status)
    async with proxy.http() as http:
        response = await http.post(
            "/v1/chat/completions",
            json={"model": CHAT_ALIAS, "messages": HELLO, "stream": stream},
            headers={"Authorization": f"Bearer {key}"},
        )
    assert response.status_code == 200, response.text
    assert response.headers["x-vkgate-provider"] == "secondary"
    assert [r.json()["model"] for r in fake_openai.received] == ["primary-model", "secondary-model"]
    if stream:
        assert response.text.endswith("data: [DONE]\n\n")
    else:
        assert response.json()["model"] == "secondary-model"


async def test_chain_falls_through_an_unreachable_first_provider(
    proxy: RunningProxy, tenant: Tenant, client: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    _, key = await two_credential_key(client, tenant, closed_port_url(), fake_openai.url)
    async with proxy.openai(key) as sdk:
        reply = await sdk.chat.completions.with_raw_response.create(
            model=CHAT_ALIAS, messages=HELLO
        )
    assert reply.status_code == 200
    assert reply.headers["x-vkgate-provider"] == "secondary"
    assert reply.parse().choices[0].message.content == REPLY


async def test_chain_does_not_fall_through_a_provider_4xx(
    proxy: RunningProxy, tenant: Tenant, client: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    _, key = await two_credential_key(client, tenant, fake_openai.url, fake_openai.url)
    fake_openai.fail_next(400, "your request is wrong everywhere")
    response = await refusal(proxy, key)
    assert response.status_code == 400
    assert response.headers["x-vkgate-provider"] == "primary"
    assert len(fake_openai.received) == 1


async def test_chain_whose_every_provider_fails_is_502_chain_exhausted_naming_each(
    proxy: RunningProxy, tenant: Tenant, client: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    _, key = await two_credential_key(client, tenant, fake_openai.url, closed_port_url())
    fake_openai.fail_next(500)
    response = await refusal(proxy, key)
    error = openai_error(response, 502, "chain_exhausted")
    assert "primary" in error["message"] and "HTTP 500" in error["message"]
    assert "secondary" in error["message"]
    assert len(fake_openai.received) == 1


async def test_a_429_after_a_failure_is_part_of_an_exhausted_chain(
    proxy: RunningProxy, tenant: Tenant, client: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    _, key = await two_credential_key(client, tenant, fake_openai.url, fake_openai.url)
    fake_openai.fail_next(503)
    fake_openai.fail_next(429, "the second is busy too", **{"Retry-After": "3"})
    response = await refusal(proxy, key)
    error = openai_error(response, 502, "chain_exhausted")
    assert [(a["provider"], a["status"]) for a in error["attempts"]] == [
        ("primary", 503),
        ("secondary", 429),
    ]
    assert "x-vkgate-provider" not in response.headers


async def test_key_revoked_during_an_attempt_gets_no_further_paid_attempt(
    proxy: RunningProxy, tenant: Tenant, client: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    await proxy.following_changes()
    key_id, key = await two_credential_key(client, tenant, fake_openai.url, fake_openai.url)
    attempt = await attempt_held_at_the_first_provider(proxy, key, fake_openai)
    revoked = await client.post(f"/api/admin/virtual-keys/{key_id}/revoke", headers=ADMIN)
    assert revoked.status_code == 200, revoked.text
    await refused_within(proxy, key, 403)
    fake_openai.hold.set()  # the first provider now fails with its 500
    response = await asyncio.wait_for(attempt, 5)
    openai_error(response, 403, "virtual_key_revoked")
    assert [r.json()["model"] for r in fake_openai.received] == ["primary-model"]


async def test_model_taken_from_the_key_during_an_attempt_gets_no_further_paid_attempt(
    proxy: RunningProxy, tenant: Tenant, client: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    await proxy.following_changes()
    first = await add_provider(client, tenant.org, "primary", fake_openai.url)
    second = await add_provider(client, tenant.org, "secondary", fake_openai.url)
    chain = [(first, "primary-model"), (second, "secondary-model")]
    policy = await add_policy(client, tenant.org, {CHAT_ALIAS: chain, "other": chain[1:]})
    key_id, key = await add_key(client, tenant, policy=policy)
    attempt = await attempt_held_at_the_first_provider(proxy, key, fake_openai)
    changed = await client.patch(
        f"/api/admin/virtual-keys/{key_id}", json={"allowed_models": ["other"]}, headers=ADMIN
    )
    assert changed.status_code == 200, changed.text
    deadline = asyncio.get_running_loop().time() + 2.0
    async with proxy.openai(key) as sdk:
        while [m.id async for m in sdk.models.list()] != ["other"]:
            assert asyncio.get_running_loop().time() < deadline, "the change never arrived"
            await asyncio.sleep(0.01)
    fake_openai.hold.set()  # the first provider now fails with its 500
    response = await asyncio.wait_for(attempt, 5)
    openai_error(response, 403, "model_not_allowed")
    assert [r.json()["model"] for r in fake_openai.received] == ["primary-model"]
