"""The response cache through the official SDKs: a hit is served without a provider call,
plain as stored or replayed as a stream in the client's format with everything the answer had
(reasoning, text, tool calls, refusal, finish reason, usage); `Cache-Control` refreshes or
bypasses it; an entry never leaves the scope that stored it; Redis shares it between proxies,
and a Redis that cannot answer is a miss."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
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
from tests.proxy.test_spend_ledger import report
from tests.support.api import ADMIN, create
from tests.support.clock import ManualClock
from tests.support.fake_openai import FakeOpenAI
from tests.support.fake_reasoning import (
    API_KEY,
    REASONING,
    REFUSAL,
    SIGNATURE,
    TEXT,
    FakeReasoning,
    serve_fake_reasoning,
)
from tests.support.processes import free_port
from tests.support.redis_servers import redis_cluster, redis_server

REDIS_URL = "redis://127.0.0.1:6379/0"
HELLO: Any = [{"role": "user", "content": "hello"}]
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
PRICE = {"input_per_mtok": "2.5", "output_per_mtok": "10"}
"""The chat model's price: 120 input and 80 output tokens cost $0.0011."""
CHAT_COST = Decimal("0.0011")


async def drained(proxy: RunningProxy, records: int, within_s: float = 30.0) -> None:
    """Every record written, sealed and in the ledger: shipped here, or by the drainer's own
    pass if it got there first."""
    running: Running = proxy.app.state["running"]
    assert running.spool is not None and running.drainer is not None
    assert running.spool.seq == records
    await running.spool.seal_async()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while running.spool.pending_segments():
        assert loop.time() < deadline, "the spool was not shipped"
        await running.drainer.ship_ready()
        await asyncio.sleep(0.05)


@dataclass
class Cached:
    tenant: Tenant
    other_project_key: str
    """A key of another project of the same organization, on the same policy."""
    fake: FakeReasoning


@pytest.fixture
async def fake_reasoning() -> AsyncIterator[FakeReasoning]:
    async with serve_fake_reasoning() as fake:
        yield fake


async def cache_rule(
    client: httpx.AsyncClient, org: str, scope: dict[str, Any], **fields: Any
) -> dict[str, Any]:
    body = {
        "organization_id": org,
        "name": f"cache-{scope['kind']}",
        "scope": scope,
        "models": ["chat", "claude*"],
        "ttl_seconds": 300,
        **fields,
    }
    return await create(client, "/api/admin/cache-rules", body)


async def cached_tenant(
    client: httpx.AsyncClient, fake: FakeReasoning, name: str = "cached"
) -> Cached:
    org = (await create(client, "/api/admin/organizations", {"name": name}))["id"]
    projects = [
        (await create(client, "/api/admin/projects", {"organization_id": org, "name": p}))["id"]
        for p in ("one", "two")
    ]
    chat = await add_provider(
        client, org, "reasoning", f"{fake.url}/v1", API_KEY, price_overrides={"r1": PRICE}
    )
    claude = await add_provider(
        client, org, "claude", fake.url, API_KEY, kind="anthropic", price_overrides={"c1": PRICE}
    )
    policy = await add_policy(
        client, org, {"chat": [(chat, "r1")], "claude": [(claude, "c1")], "plain": [(chat, "r1")]}
    )
    tenant = Tenant(org, projects[0], chat, policy, "", "")
    tenant.key_id, tenant.key = await add_key(client, tenant)
    other = Tenant(org, projects[1], chat, policy, "", "")
    _, other_key = await add_key(client, other)
    return Cached(tenant, other_key, fake)


@pytest.fixture
async def cached(client: httpx.AsyncClient, fake_reasoning: FakeReasoning) -> Cached:
    setup = await cached_tenant(client, fake_reasoning)
    await cache_rule(client, setup.tenant.org, {"kind": "organization"})
    return setup


@pytest.fixture
async def proxy(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock
) -> AsyncIterator[RunningProxy]:
    async with serve_proxy(app, clock, proxy_settings()) as running:
        yield running


async def chat(
    sdk: openai.AsyncOpenAI,
    model: str = "chat",
    headers: dict[str, str] | None = None,
    **fields: Any,
) -> tuple[str | None, Any]:
    """One plain call: the `X-Vkgate-Cache` header and the completion."""
    raw = await sdk.chat.completions.with_raw_response.create(
        model=model,
        messages=fields.pop("messages", HELLO),
        tools=TOOLS,
        extra_headers=headers,
        **fields,
    )
    return raw.headers.get("x-vkgate-cache"), raw.parse()


async def chat_stream(
    sdk: openai.AsyncOpenAI, *, include_usage: bool, headers: dict[str, str] | None = None
) -> tuple[str | None, list[Any]]:
    raw = await sdk.chat.completions.with_raw_response.create(
        model="chat",
        messages=HELLO,
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": include_usage},
        extra_headers=headers,
    )
    chunks = [chunk async for chunk in raw.parse()]
    return raw.headers.get("x-vkgate-cache"), chunks


def added_up(chunks: list[Any]) -> dict[str, Any]:
    """What a client reading the stream ends up with."""
    text, reasoning, refusal, arguments = [], [], [], []
    calls: dict[int, dict[str, Any]] = {}
    finish, usage = None, None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage.model_dump(exclude_none=True)
        for choice in chunk.choices:
            delta = choice.delta
            text.append(delta.content or "")
            refusal.append(delta.refusal or "")
            reasoning.append((delta.model_extra or {}).get("reasoning_content") or "")
            for call in delta.tool_calls or ():
                known = calls.setdefault(call.index, {"id": None, "name": ""})
                known["id"] = call.id or known["id"]
                if call.function is not None:
                    known["name"] += call.function.name or ""
                    arguments.append(call.function.arguments or "")
            finish = choice.finish_reason or finish
    return {
        "content": "".join(text) or None,
        "refusal": "".join(refusal) or None,
        "reasoning_content": "".join(reasoning) or None,
        "tool_calls": [(c["id"], c["name"]) for c in calls.values()],
        "arguments": "".join(arguments),
        "finish_reason": finish,
        "usage": usage,
    }


def whole(completion: Any) -> dict[str, Any]:
    """The same facts, of a plain completion."""
    choice = completion.choices[0]
    message = choice.message
    return {
        "content": message.content,
        "refusal": message.refusal,
        "reasoning_content": (message.model_extra or {}).get("reasoning_content"),
        "tool_calls": [(c.id, c.function.name) for c in message.tool_calls or ()],
        "arguments": "".join(c.function.arguments for c in message.tool_calls or ()),
        "finish_reason": choice.finish_reason,
        "usage": completion.usage.model_dump(exclude_none=True) if completion.usage else None,
    }


async def test_a_repeated_chat_is_answered_from_the_cache_without_a_provider_call(
    proxy: RunningProxy, cached: Cached
) -> None:
    async with proxy.openai(cached.tenant.key) as sdk:
        first_header, first = await chat(sdk)
        second_header, second = await chat(sdk)
        # Key order and whitespace do not matter, nor `user`: the same request.
        raw = await sdk.chat.completions.with_raw_response.create(
            tools=TOOLS, messages=HELLO, model="chat", user="someone-else"
        )
    assert (first_header, second_header, raw.headers["x-vkgate-cache"]) == ("miss", "hit", "hit")
    assert len(cached.fake.calls) == 1
    assert second.model_dump() == first.model_dump()
    assert whole(second)["reasoning_content"] == "".join(REASONING)
    assert int(raw.headers["age"]) >= 0
    metrics = proxy.metrics.render().decode()
    assert 'vkgate_response_cache_lookups_total{result="hit"} 2.0' in metrics
    assert 'vkgate_response_cache_lookups_total{result="miss"} 1.0' in metrics
    assert 'vkgate_response_cache_stores_total{result="stored"} 1.0' in metrics
    assert "vkgate_response_cache_entries 1.0" in metrics


async def test_a_stream_is_replayed_from_a_plain_entry_with_everything_the_answer_had(
    proxy: RunningProxy, cached: Cached
) -> None:
    async with proxy.openai(cached.tenant.key) as sdk:
        header, plain = await chat(sdk)
        assert header == "miss"
        hit, chunks = await chat_stream(sdk, include_usage=True)
        bare_hit, bare = await chat_stream(sdk, include_usage=False)
    assert (hit, bare_hit) == ("hit", "hit")
    assert len(cached.fake.calls) == 1
    replayed = added_up(chunks)
    assert replayed == whole(plain)
    assert replayed["reasoning_content"] == "".join(REASONING)
    assert replayed["content"] == "".join(TEXT)
    assert replayed["tool_calls"] == [("call_weather_1", "weather")]
    assert replayed["arguments"] == '{"city": "Paris"}'
    assert replayed["finish_reason"] == "tool_calls"
    assert replayed["usage"]["completion_tokens_details"]["reasoning_tokens"] == 30
    # Without `include_usage` the stream has no usage chunk, as OpenAI streams have not.
    assert added_up(bare) == {**replayed, "usage": None}


async def test_a_plain_call_is_answered_from_a_streamed_entry(
    proxy: RunningProxy, cached: Cached
) -> None:
    async with proxy.openai(cached.tenant.key) as sdk:
        # The client does not ask for usage: the entry still has it (the gateway asked).
        miss, chunks = await chat_stream(sdk, include_usage=False)
        header, plain = await chat(sdk)
        refused_miss, refused = await chat(sdk, messages=[{"role": "user", "content": "refuse"}])
        refused_hit, refused_chunks = await chat_stream_of(sdk, "refuse")
    assert (miss, header, refused_miss, refused_hit) == ("miss", "hit", "miss", "hit")
    assert len(cached.fake.calls) == 2
    assert whole(plain) == {**added_up(chunks), "usage": whole(plain)["usage"]}
    assert whole(plain)["usage"]["prompt_tokens"] == 120
    assert whole(plain)["usage"]["completion_tokens"] == 80
    assert whole(refused)["refusal"] == "".join(REFUSAL)
    assert added_up(refused_chunks)["refusal"] == "".join(REFUSAL)
    assert added_up(refused_chunks)["finish_reason"] == "stop"


async def chat_stream_of(sdk: openai.AsyncOpenAI, content: str) -> tuple[str | None, list[Any]]:
    raw = await sdk.chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": content}], tools=TOOLS, stream=True
    )
    return raw.headers.get("x-vkgate-cache"), [chunk async for chunk in raw.parse()]


async def test_anthropic_messages_hit_plain_and_streamed_with_thinking_and_tool_use(
    proxy: RunningProxy, cached: Cached
) -> None:
    async with anthropic.AsyncAnthropic(
        base_url=proxy.url.removesuffix("/v1"), api_key=cached.tenant.key, max_retries=0
    ) as claude:
        request: Any = {
            "model": "claude",
            "max_tokens": 256,
            "messages": HELLO,
            "tools": [{"name": "weather", "input_schema": {"type": "object"}}],
        }
        async with claude.messages.with_streaming_response.create(**request, stream=True) as miss:
            assert miss.headers["x-vkgate-cache"] == "miss"
            async for _ in miss.iter_bytes():
                pass
        raw = await claude.messages.with_raw_response.create(**request)
        plain = await raw.parse()
        async with claude.messages.stream(**request) as stream:
            streamed = await stream.get_final_message()
            header = stream.response.headers["x-vkgate-cache"]
    assert (raw.headers["x-vkgate-cache"], header) == ("hit", "hit")
    assert len(cached.fake.calls) == 1
    assert streamed.model_dump() == plain.model_dump()
    thinking, text, tool = plain.content
    assert thinking.type == "thinking" and thinking.thinking == "".join(REASONING)
    assert thinking.signature == SIGNATURE
    assert text.type == "text" and text.text == "".join(TEXT)
    assert tool.type == "tool_use" and tool.input == {"city": "Paris"}
    assert plain.stop_reason == "tool_use"
    assert plain.usage.output_tokens == 80 and plain.usage.cache_read_input_tokens == 20


async def test_embeddings_are_answered_from_the_cache(
    proxy: RunningProxy, client: httpx.AsyncClient, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    await cache_rule(client, tenant.org, {"kind": "organization"}, models=["embed"])
    async with proxy.openai(tenant.key) as sdk:
        answers = [
            await sdk.embeddings.with_raw_response.create(model="embed", input=["one", "two"])
            for _ in range(2)
        ]
        other = await sdk.embeddings.with_raw_response.create(model="embed", input=["three"])
    assert [a.headers["x-vkgate-cache"] for a in answers] == ["miss", "hit"]
    assert other.headers["x-vkgate-cache"] == "miss"
    first, second = (a.parse() for a in answers)
    assert second.model_dump() == first.model_dump()
    assert len(second.data) == 2
    assert len([r for r in fake_openai.received if r.path.endswith("/embeddings")]) == 2


async def test_a_translated_answer_is_cached_in_the_clients_format(
    proxy: RunningProxy, cached: Cached
) -> None:
    """An OpenAI client's request routed to an Anthropic credential: the entry is the answer
    the client got, in OpenAI's format, and a streamed hit replays it so."""
    async with proxy.openai(cached.tenant.key) as sdk:
        header, plain = await chat(sdk, model="claude", max_tokens=256)
        raw = await sdk.chat.completions.with_raw_response.create(
            model="claude", messages=HELLO, tools=TOOLS, max_tokens=256, stream=True
        )
        chunks = [chunk async for chunk in raw.parse()]
    assert (header, raw.headers["x-vkgate-cache"]) == ("miss", "hit")
    assert len(cached.fake.calls) == 1
    replayed = added_up(chunks)
    assert replayed == {**whole(plain), "usage": None}
    assert replayed["content"] == "".join(TEXT)
    assert replayed["tool_calls"] == [("toolu_weather_1", "weather")]
    assert replayed["finish_reason"] == "tool_calls"


async def test_no_cache_refreshes_and_no_store_bypasses(
    proxy: RunningProxy, cached: Cached
) -> None:
    async with proxy.openai(cached.tenant.key) as sdk:
        bypass = (await chat(sdk, headers={"Cache-Control": "no-store"}))[0]
        # `no-store` neither read nor wrote: the next call is a miss.
        miss = (await chat(sdk))[0]
        hit = (await chat(sdk))[0]
        refresh = (await chat(sdk, headers={"Cache-Control": "no-cache"}))[0]
        bypass_again = (await chat(sdk, headers={"cache-control": "max-age=60, no-store"}))[0]
        again = (await chat(sdk))[0]
        streamed = [
            await chat_stream(sdk, include_usage=True, headers=headers)
            for headers in ({"Cache-Control": "no-store"}, {"Cache-Control": "no-cache"}, None)
        ]
    assert [bypass, miss, hit, refresh, bypass_again, again] == [
        "bypass",
        "miss",
        "hit",
        "refresh",
        "bypass",
        "hit",
    ]
    assert [header for header, _ in streamed] == ["bypass", "refresh", "hit"]
    # Whatever the cache did, the client got the same answer.
    assert len({repr(added_up(chunks)) for _, chunks in streamed}) == 1
    assert len(cached.fake.calls) == 6


async def test_an_entry_older_than_the_clients_max_age_is_refreshed(
    proxy: RunningProxy, cached: Cached, clock: ManualClock
) -> None:
    async with proxy.openai(cached.tenant.key) as sdk:
        assert (await chat(sdk))[0] == "miss"
        clock.advance(120)
        young = {"Cache-Control": "max-age=60"}
        old = {"Cache-Control": "max-age=600"}
        assert [(await chat(sdk, headers=h))[0] for h in (old, young, young)] == [
            "hit",
            "refresh",
            "hit",
        ]
        raw = await sdk.chat.completions.with_raw_response.create(
            model="chat", messages=HELLO, tools=TOOLS, extra_headers=young
        )
    assert (raw.headers["x-vkgate-cache"], raw.headers["age"]) == ("hit", "0")
    assert len(cached.fake.calls) == 2


async def test_an_entry_is_never_served_outside_the_scope_that_stored_it(
    app: Litestar,
    client: httpx.AsyncClient,
    clock: ManualClock,
    fake_reasoning: FakeReasoning,
) -> None:
    one = await cached_tenant(client, fake_reasoning, "first")
    two = await cached_tenant(client, fake_reasoning, "second")
    # Organization-wide in both organizations; project-scoped for `claude` in the first.
    await cache_rule(client, one.tenant.org, {"kind": "organization"}, models=["chat"])
    await cache_rule(client, two.tenant.org, {"kind": "organization"}, models=["chat"])
    await cache_rule(
        client, one.tenant.org, {"kind": "project", "id": one.tenant.project}, models=["claude"]
    )
    _, same_project_key = await add_key(client, one.tenant)
    async with serve_proxy(app, clock, proxy_settings()) as proxy:
        async with proxy.openai(one.tenant.key) as sdk:
            assert (await chat(sdk))[0] == "miss"
        async with proxy.openai(one.other_project_key) as sdk:
            # The organization's rule: shared by its projects.
            assert (await chat(sdk))[0] == "hit"
        async with proxy.openai(two.tenant.key) as sdk:
            # Another organization, the same body and alias: never its entry.
            assert (await chat(sdk))[0] == "miss"
        headers = []
        for key in (one.tenant.key, same_project_key, one.other_project_key):
            async with anthropic.AsyncAnthropic(
                base_url=proxy.url.removesuffix("/v1"), api_key=key, max_retries=0
            ) as claude:
                raw = await claude.messages.with_raw_response.create(
                    model="claude", max_tokens=64, messages=HELLO
                )
                headers.append(raw.headers.get("x-vkgate-cache"))
        # The project's rule: its keys share, another project's key is not covered at all.
        assert headers == ["miss", "hit", None]
        async with proxy.openai(one.tenant.key) as sdk:
            # No rule names this alias: nothing said, nothing cached.
            raw = await sdk.chat.completions.with_raw_response.create(model="plain", messages=HELLO)
            assert "x-vkgate-cache" not in raw.headers
    assert len(fake_reasoning.calls) == 5


async def test_a_rule_reaches_the_proxy_through_the_change_feed(
    proxy: RunningProxy,
    client: httpx.AsyncClient,
    fake_reasoning: FakeReasoning,
) -> None:
    setup = await cached_tenant(client, fake_reasoning, "late")
    await proxy.following_changes()
    async with proxy.openai(setup.tenant.key) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(model="chat", messages=HELLO)
        assert "x-vkgate-cache" not in raw.headers
        rule = await cache_rule(client, setup.tenant.org, {"kind": "organization"})
        assert await rule_applies(sdk, True)
        assert (await chat(sdk))[0] == "hit"
        disabled = await client.patch(
            f"/api/admin/cache-rules/{rule['id']}", json={"enabled": False}, headers=ADMIN
        )
        assert disabled.status_code == 200, disabled.text
        assert await rule_applies(sdk, False)
        assert (await chat(sdk))[0] is None


async def rule_applies(sdk: openai.AsyncOpenAI, applies: bool, within_s: float = 2.0) -> bool:
    """Whether the `chat` alias comes to be cached (or not) within the time: a `no-cache`
    call's `X-Vkgate-Cache` says `refresh` while a rule covers it, nothing otherwise."""
    wanted = "refresh" if applies else None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while loop.time() < deadline:
        if (await chat(sdk, headers={"Cache-Control": "no-cache"}))[0] == wanted:
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_hit_counts_against_the_request_rate_limit(
    proxy: RunningProxy, client: httpx.AsyncClient, cached: Cached
) -> None:
    _, limited = await add_key(client, cached.tenant, limits={"rpm": 2})
    async with proxy.openai(limited) as sdk:
        assert (await chat(sdk))[0] == "miss"
        assert (await chat(sdk))[0] == "hit"
        with pytest.raises(openai.RateLimitError) as refused:
            await chat(sdk)
    assert refused.value.response.json()["error"]["code"] == "rate_limited"
    assert len(cached.fake.calls) == 1


async def test_a_hit_costs_nothing_and_the_report_says_what_it_saved(
    proxy: RunningProxy, client: httpx.AsyncClient, cached: Cached
) -> None:
    await create(
        client,
        "/api/admin/budgets",
        {
            "organization_id": cached.tenant.org,
            "scope": {"kind": "organization"},
            "window": "month",
            "limit_usd": "0.0015",
        },
    )
    async with proxy.openai(cached.tenant.key) as sdk:
        assert (await chat(sdk, max_tokens=50))[0] == "miss"
        # The budget has no room left for another provider call: hits reserve and spend
        # nothing from it, so they are served all the same.
        for _ in range(3):
            assert (await chat(sdk, max_tokens=50))[0] == "hit"
        with pytest.raises(openai.APIStatusError) as refused:
            await chat(sdk, max_tokens=50, headers={"Cache-Control": "no-cache"})
    assert refused.value.status_code == 402
    await drained(proxy, records=2 * 5)
    body = await report(client, cached.tenant.org)
    totals = body["totals"]
    assert totals["requests"] == 4
    assert totals["refused"] == 1
    assert totals["cache_hits"] == 3
    assert Decimal(totals["cost_usd"]) == CHAT_COST
    assert Decimal(totals["saved_usd"]) == 3 * CHAT_COST
    # One call's tokens: a hit uses none.
    assert (totals["input_tokens"], totals["output_tokens"]) == (120, 80)
    ledger = await client.get(
        "/api/spend/ledger", params={"organization_id": cached.tenant.org}, headers=ADMIN
    )
    confirms = [row for row in ledger.json()["data"] if row["kind"] == "confirm"]
    hits = [row for row in confirms if row["cache_hit"]]
    assert len(hits) == 3
    for row in hits:
        assert (row["cost_usd"], Decimal(row["saved_usd"])) == ("0", CHAT_COST)
        assert (row["input_tokens"], row["output_tokens"], row["attempts"]) == (0, 0, 0)
        assert (row["provider_id"], row["served_model"]) == (cached.tenant.provider, "r1")
    csv = await client.get(
        "/api/spend/report",
        params={"organization_id": cached.tenant.org, "format": "csv", "group_by": "model"},
        headers=ADMIN,
    )
    header, row = csv.text.splitlines()[:2]
    assert "saved_usd" in header.split(",")
    assert dict(zip(header.split(","), row.split(","), strict=True))["saved_usd"] == str(
        3 * CHAT_COST
    )


async def test_a_hit_names_its_end_user_where_a_budget_gives_each_one_an_allowance(
    proxy: RunningProxy, client: httpx.AsyncClient, cached: Cached
) -> None:
    await create(
        client,
        "/api/admin/budgets",
        {
            "organization_id": cached.tenant.org,
            "scope": {"kind": "end_user"},
            "window": "day",
            "limit_usd": "10",
        },
    )
    _, key = await add_key(client, cached.tenant)
    async with proxy.openai(key) as sdk:
        assert (await chat(sdk, user="alice"))[0] == "miss"
        # Who asks is no part of the entry's key: another end user's request is a hit.
        assert (await chat(sdk, user="bob"))[0] == "hit"
        # Refused as the same request would be on a miss, though a hit moves no budget.
        with pytest.raises(openai.BadRequestError) as refused:
            await chat(sdk)
    assert refused.value.response.json()["error"]["code"] == "end_user_required"
    assert len(cached.fake.calls) == 1


async def test_two_proxies_share_the_cache_through_redis(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, cached: Cached
) -> None:
    settings = {"redis_url": REDIS_URL}
    async with (
        serve_proxy(app, clock, proxy_settings(**settings)) as first,
        serve_proxy(app, clock, proxy_settings(**settings)) as second,
    ):
        async with first.openai(cached.tenant.key) as sdk:
            assert (await chat(sdk))[0] == "miss"
        async with second.openai(cached.tenant.key) as sdk:
            header, completion = await chat(sdk)
            stream_header, chunks = await chat_stream(sdk, include_usage=True)
    assert (header, stream_header) == ("hit", "hit")
    assert added_up(chunks) == whole(completion)
    assert len(cached.fake.calls) == 1


async def test_a_redis_that_cannot_answer_is_a_miss_never_an_error(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, cached: Cached
) -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    async with (
        serve_proxy(app, clock, proxy_settings(redis_url=nobody)) as proxy,
        proxy.openai(cached.tenant.key) as sdk,
    ):
        answers = [await chat(sdk) for _ in range(2)]
        stream_header, chunks = await chat_stream(sdk, include_usage=True)
    assert [header for header, _ in answers] == ["miss", "miss"]
    assert stream_header == "miss"
    assert added_up(chunks)["content"] == "".join(TEXT)
    assert len(cached.fake.calls) == 3


async def test_a_redis_that_goes_away_is_a_miss_and_serves_again_when_it_is_back(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, cached: Cached, tmp_path: Path
) -> None:
    with redis_server(tmp_path / "redis") as redis:
        settings = proxy_settings(redis_url=redis.url)
        async with (
            serve_proxy(app, clock, settings) as proxy,
            proxy.openai(cached.tenant.key) as sdk,
        ):
            assert [(await chat(sdk))[0] for _ in range(2)] == ["miss", "hit"]
            redis.stop()
            down = [await chat(sdk) for _ in range(2)]
            assert [header for header, _ in down] == ["miss", "miss"]
            assert all(whole(answer)["content"] == "".join(TEXT) for _, answer in down)
            metrics = proxy.metrics.render().decode().splitlines()
            [errors] = [m for m in metrics if m.startswith("vkgate_response_cache_redis_errors")]
            assert float(errors.split()[-1]) >= 2, "each lookup and each store that failed"
            redis.start()
            # Back (an empty Redis: it keeps nothing on disk): stored again, then served.
            headers = [(await chat(sdk))[0] for _ in range(2)]
    assert headers == ["miss", "hit"]
    assert len(cached.fake.calls) == 4


async def test_proxies_share_the_cache_through_a_redis_cluster(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock, cached: Cached, tmp_path: Path
) -> None:
    with redis_cluster(tmp_path / "cluster") as cluster:
        settings = {"redis_url": cluster.url, "redis_cluster": True}
        async with (
            serve_proxy(app, clock, proxy_settings(**settings)) as first,
            serve_proxy(app, clock, proxy_settings(**settings)) as second,
        ):
            async with first.openai(cached.tenant.key) as sdk:
                assert (await chat(sdk))[0] == "miss"
                assert (await chat(sdk, model="chat", temperature=0.5))[0] == "miss"
            async with second.openai(cached.tenant.key) as sdk:
                assert (await chat(sdk))[0] == "hit"
                assert (await chat(sdk, model="chat", temperature=0.5))[0] == "hit"
    assert len(cached.fake.calls) == 2
