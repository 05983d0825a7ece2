"""Admission control: a proxy process serves a bounded number of requests at once."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from litestar import Litestar

from proxy.pace import pace_of
from tests.proxy.conftest import CHAT_ALIAS, Tenant, openai_error, proxy_settings, serve_proxy
from tests.support.clock import ManualClock
from tests.support.fake_openai import FakeOpenAI

HELLO: Any = [{"role": "user", "content": "hello"}]


async def test_a_process_at_its_in_flight_limit_refuses_with_gateway_busy_until_one_finishes(
    app: Litestar,
    client: httpx.AsyncClient,
    clock: ManualClock,
    tenant: Tenant,
    fake_openai: FakeOpenAI,
) -> None:
    body = {"model": CHAT_ALIAS, "messages": HELLO}
    headers = {"Authorization": f"Bearer {tenant.key}"}
    fake_openai.hold = asyncio.Event()
    async with serve_proxy(app, clock, proxy_settings(max_in_flight=2)) as proxy:
        gateway = proxy.app.state["running"].gateway
        async with proxy.http() as http:
            held = [
                asyncio.ensure_future(http.post("/v1/chat/completions", json=body, headers=headers))
                for _ in range(2)
            ]
            while len(fake_openai.received) < 2:
                await asyncio.sleep(0.01)
            pace = pace_of(asyncio.get_running_loop())
            held_pace = (pace.in_flight, pace.busy)
            busy = await http.post("/v1/chat/completions", json=body, headers=headers)
            fake_openai.hold.set()
            assert [(await h).status_code for h in held] == [200, 200]
            again = await http.post("/v1/chat/completions", json=body, headers=headers)
    openai_error(busy, 503, "gateway_busy")
    assert held_pace == (2, True)  # the loop's writes waited for its next turn meanwhile
    assert busy.headers["retry-after"] == "1"
    assert len(fake_openai.received) == 3, "the refused request reached no provider"
    assert again.status_code == 200
    assert gateway.in_flight == pace.in_flight == 0
