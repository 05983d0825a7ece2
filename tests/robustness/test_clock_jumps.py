"""Clock jumps: the wall clock stepped back and forth under a running deployment (as an NTP step
does), and a proxy whose clock is minutes ahead of its control plane's. Limits keep holding,
keys keep being served, and the ledger ends up with every answered request once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
from litestar import Litestar

from proxy.app import Running
from tests.proxy.conftest import (
    CHAT_ALIAS,
    RunningProxy,
    Tenant,
    add_key,
    fake_openai,
    proxy_settings,
    serve_proxy,
    tenant,
)
from tests.support.api import ADMIN
from tests.support.clock import ManualClock
from vkgate.signing import MAX_SKEW_SECONDS

__all__ = ["fake_openai", "tenant"]  # fixtures, used by name

HELLO: Any = [{"role": "user", "content": "hello"}]


async def status_of(proxy: RunningProxy, key: str) -> int:
    async with proxy.http() as http:
        response = await http.post(
            "/v1/chat/completions",
            json={"model": CHAT_ALIAS, "messages": HELLO},
            headers={"Authorization": f"Bearer {key}"},
        )
    return response.status_code


async def ship_everything(proxy: RunningProxy) -> bool:
    running: Running = proxy.app.state["running"]
    assert running.spool is not None and running.drainer is not None
    await running.spool.seal_async()
    return await running.drainer.ship_ready()


async def totals(client: httpx.AsyncClient, org: str) -> dict[str, Any]:
    response = await client.get("/api/spend/report", params={"organization_id": org}, headers=ADMIN)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()["totals"]
    return found


async def test_the_wall_clock_stepping_back_and_forth_refills_nothing_early_and_loses_nothing(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, tenant: Tenant
) -> None:
    _, key = await add_key(client, tenant, limits={"rpm": 3})
    settings = proxy_settings(spend_flush_interval_s=3600)
    async with serve_proxy(app, clock, settings) as proxy:
        assert [await status_of(proxy, key) for _ in range(4)] == [200, 200, 200, 429]
        start = clock.now()

        clock.set(start - timedelta(hours=1))  # a step back: a clock behind refills nothing
        assert await status_of(proxy, key) == 429
        clock.set(start + timedelta(seconds=1))
        assert await status_of(proxy, key) == 429, "no refill for the hour it went back"

        clock.set(start + timedelta(seconds=61))  # a minute after the bucket emptied
        assert await status_of(proxy, key) == 200
        clock.set(start + timedelta(days=1))  # a step forward: the next day
        assert await status_of(proxy, key) == 200

        assert await ship_everything(proxy)
    found = await totals(client, tenant.org)
    assert (found["requests"], found["refused"]) == (5, 3)


async def test_a_proxy_clock_minutes_ahead_serves_cached_keys_and_ships_once_in_step_again(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, tenant: Tenant
) -> None:
    proxy_clock = ManualClock(clock.now())
    settings = proxy_settings(spend_flush_interval_s=3600)
    async with serve_proxy(app, proxy_clock, settings) as proxy:
        await proxy.following_changes()
        assert [await status_of(proxy, tenant.key) for _ in range(2)] == [200, 200]

        # The proxy's clock steps ten minutes ahead: the control plane refuses its signatures.
        proxy_clock.advance(2 * MAX_SKEW_SECONDS)
        _, unseen = await add_key(client, tenant)
        assert await status_of(proxy, unseen) == 503, "a key it cannot check is refused"
        assert [await status_of(proxy, tenant.key) for _ in range(3)] == [200, 200, 200]
        assert not await ship_everything(proxy), "the control plane refused the segment"
        running: Running = proxy.app.state["running"]
        assert running.spool is not None and running.spool.pending_segments()

        clock.advance(2 * MAX_SKEW_SECONDS)  # in step again
        assert await ship_everything(proxy)
        assert running.spool.pending_segments() == []
    found = await totals(client, tenant.org)
    assert (found["requests"], found["refused"]) == (5, 0)
