"""Spend survives faults: the control plane down or losing its answers, and a proxy killed with
SIGKILL in the middle of a load. Nothing answered is lost, nothing is counted twice."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar import Litestar

from proxy.app import Running
from tests.proxy.conftest import (
    CHAT_ALIAS,
    RunningProxy,
    TappedTransport,
    Tenant,
    proxy_settings,
    serve_proxy,
)
from tests.proxy.test_processes import make_tenant, new_key, proxy_env
from tests.support.api import ADMIN
from tests.support.clock import ManualClock
from tests.support.outcomes import ledger_rows
from tests.support.processes import (
    Service,
    free_port,
    running,
    sqlite_controlplane,
    start,
    stop,
    wait_until_healthy,
)

HELLO: Any = [{"role": "user", "content": "hello"}]
LEDGER_WAIT_S = 30.0
"""Bound on waiting for a restarted proxy's drainer to ship what its predecessor left."""


class AckLosingTransport(TappedTransport):
    """Delivers spend segments to the control plane, then loses its answer while told to."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        super().__init__(inner)
        self.lose_acks = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if self.lose_acks and request.url.path.endswith("/spend-commands"):
            await response.aread()
            raise httpx.ReadError("connection reset after the request was sent", request=request)
        return response


async def requests_in_report(client: httpx.AsyncClient, org: str) -> dict[str, Any]:
    response = await client.get("/api/spend/report", params={"organization_id": org}, headers=ADMIN)
    assert response.status_code == 200, response.text
    totals: dict[str, Any] = response.json()["totals"]
    return totals


async def chat(proxy: RunningProxy, key: str, n: int) -> None:
    async with proxy.openai(key) as sdk:
        for _ in range(n):
            await sdk.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)


@pytest.mark.parametrize(
    ("requests", "every_s"),
    [(5, 0.0), (15, 60.0)],  # a moment; a quarter of an hour, a request every minute
    ids=["briefly", "for-minutes"],
)
async def test_control_plane_away_keeps_cached_keys_served_and_loses_and_doubles_nothing(
    app: Litestar,
    client: httpx.AsyncClient,
    clock: ManualClock,
    tenant: Tenant,
    requests: int,
    every_s: float,
) -> None:
    road = AckLosingTransport(httpx.ASGITransport(app=app))
    # The drainer's own passes wait an hour: the test ships by hand, step by step.
    settings = proxy_settings(spend_flush_interval_s=3600)
    async with serve_proxy(None, clock, settings, control_transport=road) as proxy:
        running: Running = proxy.app.state["running"]
        assert running.spool is not None and running.drainer is not None
        assert running.cache is not None
        # Keys cached before the change feed has its starting point are dropped when it gets one.
        await proxy.following_changes()
        await chat(proxy, tenant.key, 1)  # the key is cached from here on
        road.cut = True
        for _ in range(requests):
            clock.elapse(every_s)
            await chat(proxy, tenant.key, 1)
        if every_s:
            assert running.cache.stale_serves > 0, "served past its confirmation, from the cache"
        await running.spool.seal_async()
        assert not await running.drainer.ship_ready(), "nothing can be shipped while it is down"
        assert running.spool.pending_segments(), "the segments wait on disk"
        road.cut = False
        assert await running.drainer.ship_ready()
        assert running.spool.pending_segments() == []
    totals = await requests_in_report(client, tenant.org)
    assert totals["requests"] == requests + 1


async def test_an_acknowledgement_lost_in_transit_ships_again_without_doubling(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, tenant: Tenant
) -> None:
    road = AckLosingTransport(httpx.ASGITransport(app=app))
    # The drainer's own passes wait an hour: the test ships by hand, step by step.
    settings = proxy_settings(spend_flush_interval_s=3600)
    async with serve_proxy(None, clock, settings, control_transport=road) as proxy:
        running: Running = proxy.app.state["running"]
        assert running.spool is not None and running.drainer is not None
        await chat(proxy, tenant.key, 3)
        await running.spool.seal_async()
        road.lose_acks = True
        assert not await running.drainer.ship_ready()
        assert (await requests_in_report(client, tenant.org))["requests"] == 3, "it was written"
        road.lose_acks = False
        assert await running.drainer.ship_ready()
    assert (await requests_in_report(client, tenant.org))["requests"] == 3


# -- a proxy killed with SIGKILL -----------------------------------------------------------------


@pytest.fixture(scope="module")
def controlplane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A control plane process with its own SQLite database and embedded ledger."""
    with sqlite_controlplane(tmp_path_factory.mktemp("spend-faults")) as service:
        yield service


async def load_until(proxy: Service, key: str, answered: list[str], enough: int) -> None:
    """Eight clients sending requests until the proxy stops answering; `answered` collects the
    request ids of every complete 200 answer."""
    reached = asyncio.Event()

    async def client() -> None:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=10) as http:
            while True:
                request_id = uuid.uuid4().hex
                try:
                    response = await http.post(
                        "/v1/chat/completions",
                        json={"model": CHAT_ALIAS, "messages": HELLO},
                        headers={"Authorization": f"Bearer {key}", "X-Request-ID": request_id},
                    )
                except httpx.TransportError:
                    return
                assert response.status_code == 200, response.text
                answered.append(request_id)
                if len(answered) >= enough:
                    reached.set()

    clients = [asyncio.create_task(client()) for _ in range(8)]
    await reached.wait()
    proxy.process.kill()  # SIGKILL, to our own child's PID: no shutdown, no last flush
    await asyncio.gather(*clients)


def ledger_request_ids(controlplane: Service, org: str) -> list[str]:
    rows = ledger_rows(controlplane, org)
    return [row["request_id"] for row in rows if row["kind"] == "confirm"]


async def test_a_proxy_killed_mid_load_loses_no_answered_request(
    controlplane: Service, tmp_path: Path
) -> None:
    tenant = make_tenant(controlplane)
    org, key = tenant.org, new_key(controlplane, tenant).key
    port = free_port()
    env = proxy_env(
        controlplane.url,
        port,
        VKGATE_SPOOL_DIR=str(tmp_path / "spool"),
        VKGATE_REPLICA_ID="replica-killed",
    )
    first = start(["proxy"], env=env, port=port, log=tmp_path / "first.log", cwd=tmp_path)
    try:
        wait_until_healthy(first)
        answered: list[str] = []
        await load_until(first, key, answered, enough=300)
    finally:
        stop(first.process)
    assert first.process.returncode == -9
    with running(
        ["proxy"], env=env, port=port, log=tmp_path / "second.log", cwd=tmp_path
    ) as second:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LEDGER_WAIT_S
        while True:
            in_ledger = Counter(ledger_request_ids(controlplane, org))
            missing = [r for r in answered if r not in in_ledger]
            if not missing:
                break
            assert loop.time() < deadline, (
                f"{len(missing)} answered requests never reached the ledger:\n{second.output()}"
            )
            await asyncio.sleep(0.2)
    assert all(in_ledger[r] == 1 for r in answered), "an answered request is in the ledger twice"
    assert max(in_ledger.values()) == 1, "no request is in the ledger twice"
