"""Refusals before any provider is called: keys, policy, malformed requests, routes and size.

Each answer is checked for its status, OpenAI's error shape, its code (and `param` where one
field is to blame) and its X-Request-ID; none of them may reach the provider.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import openai
import pytest
from litestar import Litestar

from proxy import gateway
from tests.proxy.conftest import (
    CHAT_ALIAS,
    EMBEDDING_ALIAS,
    Answer,
    RunningProxy,
    Tenant,
    add_key,
    openai_error,
    proxy_settings,
    refused_within,
    serve_proxy,
)
from tests.support.api import ADMIN
from tests.support.clock import ManualClock
from tests.support.fake_openai import FakeOpenAI

HELLO: Any = [{"role": "user", "content": "hello"}]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def sdk_refusal(proxy: RunningProxy, key: str, model: str = CHAT_ALIAS) -> Answer:
    """The answer to an SDK chat call that must be refused."""
    async with proxy.openai(key) as client:
        with pytest.raises(openai.APIStatusError) as refused:
            await client.chat.completions.create(model=model, messages=HELLO)
    return refused.value.response


@pytest.fixture
async def http(proxy: RunningProxy) -> AsyncIterator[httpx.AsyncClient]:
    async with proxy.http() as client:
        yield client


# -- keys ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer"}, {"Authorization": "Basic dXNlcjpwYXNz"}],
    ids=["no-header", "empty-bearer", "basic-scheme"],
)
async def test_request_without_a_key_is_401_invalid_api_key(
    http: httpx.AsyncClient, fake_openai: FakeOpenAI, headers: dict[str, str]
) -> None:
    response = await http.post(
        "/v1/chat/completions", json={"model": CHAT_ALIAS, "messages": HELLO}, headers=headers
    )
    openai_error(response, 401, "invalid_api_key")
    assert fake_openai.received == []


async def test_unknown_key_is_401_invalid_api_key(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    response = await sdk_refusal(proxy, "vk-this-key-was-never-issued-0000")
    openai_error(response, 401, "invalid_api_key")
    assert fake_openai.received == []


async def test_key_is_read_from_x_api_key(proxy: RunningProxy, tenant: Tenant) -> None:
    async with proxy.http() as http:
        response = await http.get("/v1/models", headers={"x-api-key": tenant.key})
    assert response.status_code == 200, response.text


async def test_revoked_key_is_refused_403_within_two_seconds(
    proxy: RunningProxy, tenant: Tenant, client: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    await proxy.following_changes()
    async with proxy.openai(tenant.key) as sdk:
        await sdk.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)  # cached now
    revoked = await client.post(f"/api/admin/virtual-keys/{tenant.key_id}/revoke", headers=ADMIN)
    assert revoked.status_code == 200, revoked.text
    await refused_within(proxy, tenant.key, 403)
    openai_error(await sdk_refusal(proxy, tenant.key), 403, "virtual_key_revoked")
    assert len(fake_openai.received) == 1


async def test_disabled_key_is_refused_403_and_works_again_once_enabled(
    proxy: RunningProxy, tenant: Tenant, client: httpx.AsyncClient
) -> None:
    await proxy.following_changes()
    async with proxy.openai(tenant.key) as sdk:
        await sdk.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
    path = f"/api/admin/virtual-keys/{tenant.key_id}"
    assert (await client.post(f"{path}/disable", headers=ADMIN)).status_code == 200
    await refused_within(proxy, tenant.key, 403)
    openai_error(await sdk_refusal(proxy, tenant.key), 403, "virtual_key_disabled")
    assert (await client.post(f"{path}/enable", headers=ADMIN)).status_code == 200
    async with proxy.openai(tenant.key) as sdk:
        reply = await sdk.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
    assert reply.choices


async def test_expired_key_is_401_virtual_key_expired_cached_or_not(
    proxy: RunningProxy, tenant: Tenant, client: httpx.AsyncClient, clock: ManualClock
) -> None:
    expires_at = (clock.now() + timedelta(minutes=5)).isoformat()
    _, cached = await add_key(client, tenant, expires_at=expires_at)
    _, unused = await add_key(client, tenant, expires_at=expires_at)
    async with proxy.openai(cached) as sdk:
        await sdk.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
    clock.advance(6 * 60)
    openai_error(await sdk_refusal(proxy, cached), 401, "virtual_key_expired")
    openai_error(await sdk_refusal(proxy, unused), 401, "virtual_key_expired")


# -- policy ----------------------------------------------------------------------------------


async def test_model_that_is_not_an_alias_is_404_model_not_found(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    # The upstream model's own name is not an alias either: keys use aliases only.
    for model in ("gpt-5-ultra", "gpt-4o-mini-2024-07-18"):
        response = await sdk_refusal(proxy, tenant.key, model)
        openai_error(response, 404, "model_not_found", param="model")
    assert fake_openai.received == []


async def test_alias_outside_allowed_models_is_403_model_not_allowed(
    proxy: RunningProxy, tenant: Tenant, client: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    _, key = await add_key(client, tenant, allowed_models=[CHAT_ALIAS])
    async with proxy.openai(key) as sdk:
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await sdk.embeddings.create(model=EMBEDDING_ALIAS, input="x")
    openai_error(refused.value.response, 403, "model_not_allowed", param="model")
    assert refused.value.code == "model_not_allowed"
    assert fake_openai.received == []


# -- malformed requests ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "chat", "messages": [', None),
        (b"not json at all", None),
        (b"", None),
        (b'{"model": 5, "messages": [{"role": "user", "content": "hi"}]}', "model"),
        (b'{"model": "chat", "messages": "hi"}', "messages"),
        (
            b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}',
            "stream",
        ),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', "model"),
        (b'{"model": "chat"}', "messages"),
        (b'{"model": "chat", "messages": []}', "messages"),
        (b'{"model": "", "messages": [{"role": "user", "content": "hi"}]}', "model"),
        (b'["model", "chat"]', None),
    ],
    ids=[
        "truncated-json",
        "not-json",
        "empty-body",
        "model-is-a-number",
        "messages-is-a-string",
        "stream-is-a-string",
        "missing-model",
        "missing-messages",
        "empty-messages",
        "empty-model",
        "not-an-object",
    ],
)
async def test_malformed_chat_request_is_400_naming_the_field(
    http: httpx.AsyncClient,
    tenant: Tenant,
    fake_openai: FakeOpenAI,
    body: bytes,
    param: str | None,
) -> None:
    response = await http.post(
        "/v1/chat/completions",
        content=body,
        headers={**bearer(tenant.key), "Content-Type": "application/json"},
    )
    openai_error(response, 400, "invalid_request", param=param)
    assert fake_openai.received == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "embed"}', "input"),
        (b'{"model": "embed", "input": []}', "input"),
        (b'{"input": "text"}', "model"),
        (b'{"model": ["embed"], "input": "text"}', "model"),
    ],
    ids=["missing-input", "empty-input", "missing-model", "model-is-a-list"],
)
async def test_malformed_embeddings_request_is_400_naming_the_field(
    http: httpx.AsyncClient, tenant: Tenant, body: bytes, param: str
) -> None:
    response = await http.post("/v1/embeddings", content=body, headers=bearer(tenant.key))
    openai_error(response, 400, "invalid_request", param=param)


# -- size --------------------------------------------------------------------------------------


@pytest.fixture
async def small_proxy(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock
) -> AsyncIterator[RunningProxy]:
    async with serve_proxy(app, clock, proxy_settings(max_body_bytes=2048)) as running:
        yield running


async def test_body_over_the_limit_is_413_payload_too_large(
    small_proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with small_proxy.openai(tenant.key) as sdk:
        with pytest.raises(openai.APIStatusError) as refused:
            await sdk.chat.completions.create(
                model=CHAT_ALIAS, messages=[{"role": "user", "content": "x" * 4096}]
            )
        fits = await sdk.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
    openai_error(refused.value.response, 413, "payload_too_large")
    assert fits.choices
    assert len(fake_openai.received) == 1


async def test_chunked_body_over_the_limit_is_413_without_a_content_length(
    small_proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b'{"model": "chat", "messages": [{"role": "user", "content": "'
        for _ in range(8):
            yield b"x" * 512
        yield b'"}]}'

    async with small_proxy.http() as http:
        response = await http.post(
            "/v1/chat/completions", content=body(), headers=bearer(tenant.key)
        )
    assert "content-length" not in response.request.headers
    openai_error(response, 413, "payload_too_large")
    assert fake_openai.received == []


# -- routes ------------------------------------------------------------------------------------


async def test_unknown_v1_route_is_404(http: httpx.AsyncClient, tenant: Tenant) -> None:
    response = await http.post("/v1/nope", json={}, headers=bearer(tenant.key))
    openai_error(response, 404, "not_found")


async def test_unknown_route_outside_v1_is_404_in_the_same_shape(http: httpx.AsyncClient) -> None:
    openai_error(await http.get("/nope"), 404, "not_found")


@pytest.mark.parametrize("path", ["/v1", "/v1/", "/v1x/chat/completions", "/v10/models"])
async def test_only_v1_and_what_is_under_it_reach_the_gateway(
    http: httpx.AsyncClient, tenant: Tenant, path: str
) -> None:
    response = await http.post(path, json={}, headers=bearer(tenant.key))
    openai_error(response, 404, "not_found")
    # The gateway names the route it has not got; the health routes' app says only 404.
    reached_the_gateway = path in ("/v1", "/v1/")
    assert ("no route /v1" in response.json()["error"]["message"]) == reached_the_gateway


async def test_doubled_slashes_reach_the_route_they_name(
    http: httpx.AsyncClient, tenant: Tenant
) -> None:
    origin = str(http.base_url.copy_with(raw_path=b"/")).rstrip("/")
    response = await http.get(f"{origin}//v1//models", headers=bearer(tenant.key))
    assert response.request.url.raw_path == b"//v1//models"
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "list"


async def test_wrong_method_is_405_naming_the_allowed_one(
    http: httpx.AsyncClient, tenant: Tenant
) -> None:
    response = await http.get("/v1/chat/completions", headers=bearer(tenant.key))
    openai_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "POST"
    response = await http.post("/v1/models", headers=bearer(tenant.key))
    openai_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "GET"


# -- bugs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "anthropic"),
    [("GET", "/v1/models", False), ("POST", "/v1/messages", True)],
)
async def test_a_bug_is_a_500_in_the_routes_shape_and_logged_with_its_route(
    http: httpx.AsyncClient,
    tenant: Tenant,
    fake_openai: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    path: str,
    anthropic: bool,
) -> None:
    async def broken(*_: object) -> None:
        raise RuntimeError("a bug")

    # A failure outside the paid pipeline (/v1/models) and one inside it, once its request
    # is admitted (reading the body): the real pipeline runs up to it, and both reach
    # `__call__`'s last resort.
    if anthropic:
        monkeypatch.setattr(gateway, "read_body", broken)
    else:
        monkeypatch.setattr(gateway.Gateway, "_authenticate", broken)
    with caplog.at_level(logging.ERROR, logger="vkgate.proxy"):
        response = await http.request(
            method,
            path,
            json={"model": CHAT_ALIAS, "max_tokens": 8, "messages": HELLO},
            headers=bearer(tenant.key),
        )
    assert response.status_code == 500
    if anthropic:
        assert response.json()["error"]["type"] == "api_error"
        assert response.json()["type"] == "error"
    else:
        openai_error(response, 500, "internal_error")
    assert response.headers["x-request-id"]
    logged = [r.getMessage() for r in caplog.records if r.name == "vkgate.proxy"]
    assert f"unexpected error serving {path}" in logged
    assert fake_openai.received == []
