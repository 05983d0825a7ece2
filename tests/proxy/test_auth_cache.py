"""The auth cache seen from outside: a hit asks the control plane nothing, and a cached key is
served while the control plane is down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from litestar import Litestar

from tests.proxy.conftest import (
    CHAT_ALIAS,
    RunningProxy,
    TappedTransport,
    Tenant,
    proxy_settings,
    serve_proxy,
)
from tests.support.clock import ManualClock
from tests.support.fake_openai import REPLY

HELLO: Any = [{"role": "user", "content": "hello"}]


@pytest.fixture
def tap(app: Litestar) -> TappedTransport:
    return TappedTransport(httpx.ASGITransport(app=app))


# Tests ask for `tenant` before `tapped_proxy`: the proxy starts following the change feed
# after the tenant was made, so no change event reaches its cache (and refreshes it) meanwhile.
@pytest.fixture
async def tapped_proxy(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, tap: TappedTransport
) -> AsyncIterator[RunningProxy]:
    async with serve_proxy(app, clock, proxy_settings(), control_transport=tap) as running:
        # The feed's first answer drops every key cached before it: a test that counted lookups
        # while it came in (on a slow machine) would count the same key twice.
        await running.following_changes()
        yield running


async def test_cache_hit_makes_no_control_plane_call(
    tenant: Tenant, tapped_proxy: RunningProxy, tap: TappedTransport
) -> None:
    async with tapped_proxy.openai(tenant.key) as client:
        await client.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
        first = tap.key_lookups()
        # One round trip for the miss: the resolution brings the key's bundle along.
        assert [path.rsplit("/", 1)[-1] for path in first] == ["resolve-key"]
        await client.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
        await client.models.list()
    assert tap.key_lookups() == first


async def test_concurrent_misses_of_one_key_share_one_resolution(
    tenant: Tenant, tapped_proxy: RunningProxy, tap: TappedTransport
) -> None:
    async with tapped_proxy.openai(tenant.key) as client:
        pages = await asyncio.gather(*(client.models.list() for _ in range(10)))
    assert all(page.data for page in pages)
    assert [path for path in tap.key_lookups() if path.endswith("/resolve-key")] == [
        "/api/internal/gateway/resolve-key"
    ]


async def test_cached_key_keeps_working_while_the_control_plane_is_down(
    tenant: Tenant, tapped_proxy: RunningProxy, tap: TappedTransport
) -> None:
    async with tapped_proxy.openai(tenant.key) as client:
        await client.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
        tap.cut = True
        reply = await client.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
    assert reply.choices[0].message.content == REPLY


async def test_a_bearer_token_that_is_no_virtual_key_is_refused_without_asking(
    tenant: Tenant, tapped_proxy: RunningProxy, tap: TappedTransport
) -> None:
    async with tapped_proxy.http() as http:
        response = await http.get("/v1/models", headers={"Authorization": "Bearer sk-not-ours"})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert tap.key_lookups() == []
