"""From request to ledger: every request the proxy served, failed or refused lands in the ledger
once, with the provider's token counts and the price `genai-prices` gives."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import anthropic
import httpx
import pytest
from genai_prices import Usage, calc_price
from litestar import Litestar

from proxy.app import Running
from tests.proxy.conftest import (
    RunningProxy,
    Tenant,
    add_key,
    add_policy,
    add_provider,
    proxy_settings,
    serve_proxy,
)
from tests.support.api import ADMIN, create
from tests.support.clock import ManualClock
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_openai import FakeOpenAI

HELLO: Any = [{"role": "user", "content": "hello"}]
GPT_MODEL = "gpt-4o-mini"
CLAUDE_MODEL = "claude-3-5-haiku-latest"
NANO = Decimal("1e9")
SHIP_POLLS = 200
"""At 50 ms apart: 10 s for the drainer's own shipment to be acknowledged."""


async def drained(proxy: RunningProxy, records: int) -> None:
    """Seal and ship every record (as the drainer does every second), after checking that all
    `records` were written: a request's outcome is on disk before its client has the answer."""
    running: Running = proxy.app.state["running"]
    assert running.spool is not None and running.drainer is not None
    assert running.spool.seq == records
    await running.spool.seal_async()
    assert await running.drainer.ship_ready(), "the control plane acknowledged every segment"
    # The drainer's own loop may be shipping a segment still (ship_ready passes over one in
    # flight): wait for it to be acknowledged, within a bound.
    for _ in range(SHIP_POLLS):
        if running.spool.pending_segments() == []:
            break
        await asyncio.sleep(0.05)
    assert running.spool.pending_segments() == []


async def report(client: httpx.AsyncClient, org: str, group_by: str = "") -> dict[str, Any]:
    params = {"organization_id": org}
    if group_by:
        params["group_by"] = group_by
    response = await client.get("/api/spend/report", params=params, headers=ADMIN)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def priced_nanos(model: str, provider: str, usage: dict[str, int]) -> int:
    price = calc_price(
        Usage(input_tokens=usage["input"], output_tokens=usage["output"]),
        model_ref=model,
        provider_id=provider,
    ).total_price
    return int((price * NANO).quantize(Decimal(1), rounding=ROUND_HALF_UP))


@pytest.fixture
async def spending(
    client: httpx.AsyncClient,
    app: Litestar,
    clock: ManualClock,
    fake_openai: FakeOpenAI,
    fake_anthropic: FakeAnthropic,
) -> AsyncIterator[tuple[RunningProxy, Tenant]]:
    org = (await create(client, "/api/admin/organizations", {"name": "spender"}))["id"]
    project = (await create(client, "/api/admin/projects", {"organization_id": org, "name": "p"}))[
        "id"
    ]
    gpt = await add_provider(
        client, org, "gpt", fake_openai.url, fake_openai.api_key, kind="openai"
    )
    claude = await add_provider(
        client, org, "claude", fake_anthropic.url, fake_anthropic.api_key, kind="anthropic"
    )
    policy = await add_policy(
        client,
        org,
        {"gpt": [(gpt, GPT_MODEL)], "claude": [(claude, CLAUDE_MODEL)], "embed": [(gpt, "e")]},
    )
    tenant = Tenant(org, project, gpt, policy, "", "")
    tenant.key_id, tenant.key = await add_key(client, tenant)
    async with serve_proxy(app, clock, proxy_settings()) as proxy:
        yield proxy, tenant


async def test_every_request_lands_in_the_ledger_once_priced(
    spending: tuple[RunningProxy, Tenant],
    client: httpx.AsyncClient,
    fake_openai: FakeOpenAI,
    fake_anthropic: FakeAnthropic,
) -> None:
    proxy, tenant = spending
    usages: list[tuple[str, str, dict[str, int]]] = []
    async with proxy.openai(tenant.key) as sdk:
        for _ in range(3):
            reply = await sdk.chat.completions.create(model="gpt", messages=HELLO)
            assert reply.usage is not None
            usages.append(
                (
                    GPT_MODEL,
                    "openai",
                    {"input": reply.usage.prompt_tokens, "output": reply.usage.completion_tokens},
                )
            )
        for include_usage in (True, False):
            stream = await sdk.chat.completions.create(
                model="gpt",
                messages=HELLO,
                stream=True,
                stream_options={"include_usage": include_usage},
            )
            async for _ in stream:
                pass
        # What the provider reported for both streams, whether or not the client saw it.
        for event in fake_openai.streamed:
            payload = event.removeprefix(b"data: ").strip()
            if payload.startswith(b"{") and b'"usage": {' in payload:
                counted = json.loads(payload)["usage"]
                usages.append(
                    (
                        GPT_MODEL,
                        "openai",
                        {"input": counted["prompt_tokens"], "output": counted["completion_tokens"]},
                    )
                )
        fake_openai.fail_next(400, "bad")
        fake_openai.fail_next(500, "down")
        for _ in range(2):
            with pytest.raises(Exception, match="Error code"):
                await sdk.chat.completions.create(model="gpt", messages=HELLO)
        with pytest.raises(Exception, match="404"):
            await sdk.chat.completions.create(model="nope", messages=HELLO)
    async with anthropic.AsyncAnthropic(
        base_url=proxy.url.removesuffix("/v1"), api_key=tenant.key, max_retries=0
    ) as claude:
        message = await claude.messages.create(model="claude", max_tokens=32, messages=HELLO)
        async with claude.messages.stream(model="claude", max_tokens=32, messages=HELLO) as s:
            await s.get_final_message()
    for _ in range(2):
        usages.append(
            (
                CLAUDE_MODEL,
                "anthropic",
                {"input": message.usage.input_tokens, "output": message.usage.output_tokens},
            )
        )
    assert len(usages) == 7

    await drained(proxy, records=2 * 10)
    totals = (await report(client, tenant.org))["totals"]
    assert totals["requests"] == 7
    assert totals["failed"] == 2
    assert totals["refused"] == 1
    assert totals["input_tokens"] == sum(u["input"] for _, _, u in usages)
    assert totals["output_tokens"] == sum(u["output"] for _, _, u in usages)
    expected = sum(priced_nanos(model, provider, u) for model, provider, u in usages)
    assert Decimal(totals["cost_usd"]) * NANO == expected

    by_model = {row["model"]: row for row in (await report(client, tenant.org, "model"))["rows"]}
    assert by_model["gpt"]["requests"] == 5 and by_model["claude"]["requests"] == 2


async def test_shipping_the_same_spool_twice_changes_nothing(
    spending: tuple[RunningProxy, Tenant], client: httpx.AsyncClient
) -> None:
    proxy, tenant = spending
    async with proxy.openai(tenant.key) as sdk:
        await sdk.chat.completions.create(model="gpt", messages=HELLO)
    running: Running = proxy.app.state["running"]
    assert running.spool is not None and running.control is not None
    await running.spool.seal_async()
    segment = running.spool.next_segment()
    assert segment is not None
    loaded = running.spool.load(segment)
    first = await running.control.ship_spend(loaded.body)
    # The control plane's answers say it takes gzip: the second goes compressed.
    assert running.control.gzip_segments
    again = await running.control.ship_spend(loaded.body)
    # The drainer may have sealed the admit apart from the confirm, or shipped this segment
    # before us: each record is taken once either way, and a segment sent again adds nothing.
    assert first.accepted + first.duplicates == loaded.records > 0
    assert (again.accepted, again.duplicates) == (0, loaded.records)
    await drained(proxy, records=2)
    assert (await report(client, tenant.org))["totals"]["requests"] == 1
