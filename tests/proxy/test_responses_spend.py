"""Responses API spend, from request to ledger: passed through and translated, plain and
streamed, each response lands once with the provider's token counts (cached and reasoning
kept apart) and the price genai-prices gives them."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import httpx
from genai_prices import Usage, calc_price

from tests.proxy.conftest import RunningProxy, Tenant
from tests.proxy.test_spend_ledger import CLAUDE_MODEL, GPT_MODEL, NANO, drained, report
from tests.proxy.test_spend_ledger import spending as spending  # the fixture
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_openai import RESPONSES_USAGE, FakeOpenAI


def nanos(model: str, provider: str, usage: Usage) -> int:
    price = calc_price(usage, model_ref=model, provider_id=provider).total_price
    return int((price * NANO).quantize(Decimal(1), rounding=ROUND_HALF_UP))


async def test_every_response_lands_in_the_ledger_once_priced_with_cached_and_reasoning_tokens(
    spending: tuple[RunningProxy, Tenant],
    client: httpx.AsyncClient,
    fake_openai: FakeOpenAI,
    fake_anthropic: FakeAnthropic,
) -> None:
    proxy, tenant = spending
    async with proxy.openai(tenant.key) as sdk:
        for model in ("gpt", "claude"):
            await sdk.responses.create(model=model, input="hello", max_output_tokens=64)
            stream = await sdk.responses.create(model=model, input="hello", stream=True)
            async for _ in stream:
                pass
    assert [r.path for r in fake_openai.received] == ["/v1/responses"] * 2
    assert [r.path for r in fake_anthropic.received] == ["/v1/messages"] * 2

    await drained(proxy, records=2 * 4)
    gpt = Usage(
        input_tokens=RESPONSES_USAGE["input_tokens"],
        output_tokens=RESPONSES_USAGE["output_tokens"],
        cache_read_tokens=RESPONSES_USAGE["input_tokens_details"]["cached_tokens"],  # type: ignore[index]
    )
    claude = Usage(
        input_tokens=fake_anthropic.input_tokens, output_tokens=fake_anthropic.output_tokens
    )
    by_model = {row["model"]: row for row in (await report(client, tenant.org, "model"))["rows"]}
    assert by_model["gpt"]["requests"] == by_model["claude"]["requests"] == 2
    assert by_model["gpt"]["input_tokens"] == 2 * 13
    assert by_model["gpt"]["output_tokens"] == 2 * 9
    assert by_model["gpt"]["cache_read_tokens"] == 2 * 5
    assert by_model["gpt"]["reasoning_tokens"] == 2 * 2
    assert by_model["claude"]["input_tokens"] == 2 * fake_anthropic.input_tokens
    assert by_model["claude"]["output_tokens"] == 2 * fake_anthropic.output_tokens
    expected = {
        "gpt": 2 * nanos(GPT_MODEL, "openai", gpt),
        "claude": 2 * nanos(CLAUDE_MODEL, "anthropic", claude),
    }
    for model, cost in expected.items():
        assert Decimal(by_model[model]["cost_usd"]) * NANO == cost, model
    assert all(cost > 0 for cost in expected.values())


async def test_a_refused_response_is_recorded_and_reaches_no_provider(
    spending: tuple[RunningProxy, Tenant],
    client: httpx.AsyncClient,
    fake_openai: FakeOpenAI,
) -> None:
    proxy, tenant = spending
    async with proxy.http() as http:
        answer = await http.post(
            "/v1/responses",
            headers={"Authorization": f"Bearer {tenant.key}"},
            json={"model": "gpt", "input": "hello", "background": True},
        )
    assert answer.status_code == 400
    assert fake_openai.received == []
    await drained(proxy, records=2)
    totals = (await report(client, tenant.org))["totals"]
    assert (totals["requests"], totals["refused"], totals["cost_usd"]) == (0, 1, "0")
