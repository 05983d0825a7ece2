"""Spend through the cloud kinds: every request to Bedrock, AI Studio and Vertex AI (translated or
through `/v1beta`) lands in the ledger once, with the provider's token counts (cache and
thoughts included) and genai-prices' price of each under its provider id."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import httpx
from genai_prices import Usage, calc_price
from google import genai
from google.genai import types
from litestar import Litestar

from tests.proxy.cloud_support import (
    BEDROCK,
    BEDROCK_MODEL,
    COHERE,
    GEMINI,
    GEMINI_MODEL,
    HELLO,
    TITAN,
    VERTEX,
    make_clouds,
)
from tests.proxy.conftest import proxy_settings, serve_proxy
from tests.proxy.test_spend_ledger import NANO, drained, report
from tests.support.api import ADMIN
from tests.support.clock import ManualClock
from tests.support.fake_bedrock import FakeBedrock
from tests.support.fake_gemini import FakeGemini


def nanos(provider: str, model: str, tokens: dict[str, int]) -> int:
    price = calc_price(
        Usage(
            input_tokens=tokens["input"],
            output_tokens=tokens["output"],
            cache_read_tokens=tokens.get("cache_read", 0),
            cache_write_tokens=tokens.get("cache_write", 0),
        ),
        model_ref=model,
        provider_id=provider,
    ).total_price
    return int((price * NANO).quantize(Decimal(1), rounding=ROUND_HALF_UP))


async def test_every_cloud_request_lands_in_the_ledger_priced_by_its_provider(
    client: httpx.AsyncClient,
    app: Litestar,
    clock: ManualClock,
    fake_bedrock: FakeBedrock,
    fake_gemini: FakeGemini,
) -> None:
    fake_bedrock.cache_read_tokens, fake_bedrock.cache_write_tokens = 40, 5
    fake_gemini.thoughts_tokens, fake_gemini.cached_tokens = 6, 4
    async with serve_proxy(app, clock, proxy_settings()) as proxy:
        clouds = await make_clouds(client, proxy, fake_bedrock, fake_gemini)
        async with clouds.openai() as sdk:
            await sdk.chat.completions.create(model=BEDROCK, messages=HELLO)
            stream = await sdk.chat.completions.create(model=BEDROCK, messages=HELLO, stream=True)
            async for _ in stream:
                pass
            await sdk.chat.completions.create(model=GEMINI, messages=HELLO)
            await sdk.embeddings.create(model=TITAN, input="three words here")
        async with (
            clouds.anthropic() as claude,
            claude.messages.stream(model=VERTEX, max_tokens=32, messages=HELLO) as streamed,
        ):
            await streamed.get_final_message()
        google = genai.Client(
            api_key=clouds.key,
            http_options=types.HttpOptions(
                base_url=proxy.url.removesuffix("/v1"),
                retry_options=types.HttpRetryOptions(attempts=1),
            ),
        )
        async with google.aio as gemini:
            await gemini.models.generate_content(model=GEMINI, contents="hello")
            async for _ in await gemini.models.generate_content_stream(model=VERTEX, contents="hi"):
                pass
            await gemini.models.count_tokens(model=GEMINI, contents="free of charge")
        await drained(proxy, records=2 * 8)

    converse = {
        "input": 13 + 40 + 5,  # Converse counts cached input apart: the ledger counts it in
        "output": 8,
        "cache_read": 40,
        "cache_write": 5,
    }
    gemini_tokens = {"input": 12, "output": 9 + 6, "cache_read": 4, "reasoning": 6}
    expected: dict[str, tuple[int, list[tuple[str, str, dict[str, int]]]]] = {
        "bedrock": (
            3,
            [("aws", BEDROCK_MODEL, converse)] * 2
            + [("aws", "amazon.titan-embed-text-v2:0", {"input": 3, "output": 0})],
        ),
        "gemini": (
            3,
            [("google", GEMINI_MODEL, gemini_tokens)] * 2
            + [("google", GEMINI_MODEL, {"input": 0, "output": 0})],
        ),
        "vertex_ai": (2, [("google", GEMINI_MODEL, gemini_tokens)] * 2),
    }
    rows = {
        row["provider_id"]: row
        for row in (await report(client, clouds.tenant.org, "provider"))["rows"]
    }
    for kind, (requests, calls) in expected.items():
        row: dict[str, Any] = rows[clouds.providers[kind]]
        assert row["requests"] == requests, kind
        assert row["failed"] == 0 and row["refused"] == 0
        for field, name in (
            ("input_tokens", "input"),
            ("output_tokens", "output"),
            ("cache_read_tokens", "cache_read"),
            ("cache_write_tokens", "cache_write"),
            ("reasoning_tokens", "reasoning"),
        ):
            assert row[field] == sum(tokens.get(name, 0) for _, _, tokens in calls), (kind, field)
        cost = sum(
            nanos(provider, model, tokens) for provider, model, tokens in calls if tokens["input"]
        )
        assert Decimal(row["cost_usd"]) * NANO == cost, kind


COHERE_PRICE = {"input_per_mtok": "0.1", "output_per_mtok": "0"}
"""genai-prices has no Cohere embedding model on AWS: a negotiated rate prices it."""


async def test_titan_and_cohere_embeddings_are_priced_on_the_tokens_bedrock_counted(
    client: httpx.AsyncClient,
    app: Litestar,
    clock: ManualClock,
    fake_bedrock: FakeBedrock,
    fake_gemini: FakeGemini,
) -> None:
    async with serve_proxy(app, clock, proxy_settings()) as proxy:
        clouds = await make_clouds(client, proxy, fake_bedrock, fake_gemini)
        bedrock = clouds.providers["bedrock"]
        patched = await client.patch(
            f"/api/admin/providers/{bedrock}",
            json={"price_overrides": {"cohere.embed-english-v3": COHERE_PRICE}},
            headers=ADMIN,
        )
        assert patched.status_code == 200, patched.text
        async with clouds.openai() as sdk:
            titan = await sdk.embeddings.create(model=TITAN, input="three words here")
            # Words the estimate from text would not count as the header does.
            cohere = await sdk.embeddings.create(
                model=COHERE, input=["one two three four", "five six seven eight nine"]
            )
        await drained(proxy, records=2 * 2)
    assert titan.usage.prompt_tokens == 3
    assert cohere.usage.prompt_tokens == 9  # X-Amzn-Bedrock-Input-Token-Count
    rows = {row["model"]: row for row in (await report(client, clouds.tenant.org, "model"))["rows"]}
    assert rows[TITAN]["input_tokens"] == 3
    assert Decimal(rows[TITAN]["cost_usd"]) * NANO == nanos(
        "aws", "amazon.titan-embed-text-v2:0", {"input": 3, "output": 0}
    )
    assert rows[COHERE]["input_tokens"] == 9
    assert rows[COHERE]["unpriced"] == 0
    assert Decimal(rows[COHERE]["cost_usd"]) == Decimal("0.1") * 9 / 1_000_000
