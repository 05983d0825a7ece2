"""Walking a chain of credentials: fall-through order, circuit breakers, Retry-After, and the
evidence an exhausted chain keeps."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from litestar import Litestar

from tests.proxy.conftest import (
    CHAT_ALIAS,
    RunningProxy,
    Tenant,
    add_key,
    add_policy,
    add_provider,
    proxy_settings,
    serve_proxy,
)
from tests.support.api import create
from tests.support.clock import ManualClock
from tests.support.fake_openai import REPLY, FakeOpenAI, serve_fake_openai
from tests.support.processes import free_port

HELLO: Any = [{"role": "user", "content": "hello"}]


@dataclass
class Chain:
    """Three fake providers, `a`, `b` and `c`, chained in that order behind one key."""

    proxy: RunningProxy
    tenant: Tenant
    fakes: dict[str, FakeOpenAI]
    ids: dict[str, str]

    async def chat(self, **extra: Any) -> httpx.Response:
        async with self.proxy.http() as http:
            return await http.post(
                "/v1/chat/completions",
                json={"model": CHAT_ALIAS, "messages": HELLO, **extra},
                headers={"Authorization": f"Bearer {self.tenant.key}"},
            )

    def calls(self) -> dict[str, int]:
        return {name: len(fake.received) for name, fake in self.fakes.items()}


async def build_chain(
    client: httpx.AsyncClient,
    app: Litestar,
    clock: ManualClock,
    stack: AsyncExitStack,
    names: tuple[str, ...] = ("a", "b", "c"),
    *,
    unreachable: tuple[str, ...] = (),
    **settings: Any,
) -> Chain:
    org = (await create(client, "/api/admin/organizations", {"name": "chained"}))["id"]
    project = (await create(client, "/api/admin/projects", {"organization_id": org, "name": "p"}))[
        "id"
    ]
    fakes: dict[str, FakeOpenAI] = {}
    ids: dict[str, str] = {}
    for name in names:
        if name in unreachable:
            url = f"http://127.0.0.1:{free_port()}/v1"
        else:
            fakes[name] = await stack.enter_async_context(serve_fake_openai())
            url = fakes[name].url
        ids[name] = await add_provider(client, org, name, url)
    policy = await add_policy(client, org, {CHAT_ALIAS: [(ids[n], f"model-{n}") for n in names]})
    tenant = Tenant(org, project, ids[names[0]], policy, "", "")
    tenant.key_id, tenant.key = await add_key(client, tenant)
    proxy = await stack.enter_async_context(serve_proxy(app, clock, proxy_settings(**settings)))
    return Chain(proxy, tenant, fakes, ids)


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


async def test_falls_through_5xx_and_429_in_order_and_says_where_it_landed(
    client: httpx.AsyncClient, app: Litestar, clock: ManualClock, stack: AsyncExitStack
) -> None:
    chain = await build_chain(client, app, clock, stack)
    chain.fakes["a"].fail_next(503, "down")
    chain.fakes["b"].fail_next(429, "busy")
    response = await chain.chat()
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == REPLY
    assert response.headers["x-vkgate-provider"] == "c"
    assert response.headers["x-vkgate-fallback-count"] == "2"
    assert chain.calls() == {"a": 1, "b": 1, "c": 1}
    assert chain.fakes["c"].received[0].json()["model"] == "model-c"


async def test_falls_through_a_refused_connection_and_a_timeout(
    client: httpx.AsyncClient, app: Litestar, clock: ManualClock, stack: AsyncExitStack
) -> None:
    chain = await build_chain(
        client, app, clock, stack, unreachable=("a",), first_byte_timeout_s=0.2
    )
    chain.fakes["b"].stall_s = 0.6
    response = await chain.chat()
    assert response.status_code == 200, response.text
    assert response.headers["x-vkgate-provider"] == "c"
    assert chain.calls() == {"b": 1, "c": 1}


async def test_a_provider_4xx_ends_the_walk(
    client: httpx.AsyncClient, app: Litestar, clock: ManualClock, stack: AsyncExitStack
) -> None:
    chain = await build_chain(client, app, clock, stack)
    chain.fakes["a"].fail_next(400, "bad tool schema")
    response = await chain.chat()
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "bad tool schema"
    assert response.headers["x-vkgate-provider"] == "a"
    assert chain.calls() == {"a": 1, "b": 0, "c": 0}


@pytest.mark.parametrize("status", [401, 403])
async def test_a_provider_refusing_the_gateways_credential_falls_through(
    client: httpx.AsyncClient,
    app: Litestar,
    clock: ManualClock,
    stack: AsyncExitStack,
    status: int,
) -> None:
    """The provider refused the credential, not the request: another credential may hold the
    access this one lacks. The breaker is not told (nothing failed)."""
    chain = await build_chain(client, app, clock, stack, names=("a", "b"))
    chain.fakes["a"].fail_next(status, "this key may not use that model")
    response = await chain.chat()
    assert response.status_code == 200, response.text
    assert response.headers["x-vkgate-provider"] == "b"
    assert response.headers["x-vkgate-fallback-count"] == "1"
    assert chain.calls() == {"a": 1, "b": 1}
    # Every credential refused: the last refusal is the answer, the provider's own 4xx.
    chain.fakes["a"].fail_next(status, "refused")
    chain.fakes["b"].fail_next(status, "refused too")
    refused = await chain.chat()
    assert refused.status_code == status
    assert refused.json()["error"]["message"] == "refused too"
    assert refused.headers["x-vkgate-provider"] == "b"
    assert refused.headers["x-vkgate-fallback-count"] == "1"
    # A refusal among other failures is one cause of an exhausted chain.
    chain.fakes["a"].fail_next(status, "refused")
    chain.fakes["b"].fail_next(503, "down")
    exhausted = await chain.chat()
    assert exhausted.status_code == 502
    error = exhausted.json()["error"]
    assert error["code"] == "chain_exhausted"
    assert f"refused the gateway's credential (HTTP {status})" in error["message"]
    assert [a["status"] for a in error["attempts"]] == [status, 503]


async def test_an_exhausted_chain_keeps_every_attempts_cause(
    client: httpx.AsyncClient, app: Litestar, clock: ManualClock, stack: AsyncExitStack
) -> None:
    chain = await build_chain(
        client, app, clock, stack, unreachable=("c",), first_byte_timeout_s=5.0
    )
    chain.fakes["a"].fail_next(500, "boom")
    chain.fakes["b"].fail_next(429, "busy")
    response = await chain.chat()
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "chain_exhausted"
    assert error["type"] == "api_error"
    assert error["attempts"] == [
        {"provider": "a", "provider_id": chain.ids["a"], "status": 500, "code": "provider_error"},
        {
            "provider": "b",
            "provider_id": chain.ids["b"],
            "status": 429,
            "code": "provider_rate_limited",
        },
        {"provider": "c", "provider_id": chain.ids["c"], "status": None, "code": "provider_error"},
    ]


async def test_every_provider_rate_limited_is_a_429_with_the_shortest_retry_after(
    client: httpx.AsyncClient, app: Litestar, clock: ManualClock, stack: AsyncExitStack
) -> None:
    chain = await build_chain(client, app, clock, stack, names=("a", "b"))
    chain.fakes["a"].fail_next(429, "busy", **{"Retry-After": "30"})
    chain.fakes["b"].fail_next(429, "busy", **{"Retry-After": "12"})
    response = await chain.chat()
    assert response.status_code == 429, response.text
    assert response.json()["error"]["code"] == "provider_rate_limited"
    assert [a["status"] for a in response.json()["error"]["attempts"]] == [429, 429]
    assert response.headers["retry-after"] == "12"


async def test_retry_after_rests_that_credential_only(
    client: httpx.AsyncClient, app: Litestar, clock: ManualClock, stack: AsyncExitStack
) -> None:
    chain = await build_chain(client, app, clock, stack, names=("a", "b"))
    chain.fakes["a"].fail_next(429, "busy", **{"Retry-After": "30"})
    assert (await chain.chat()).headers["x-vkgate-provider"] == "b"
    second = await chain.chat()
    assert second.headers["x-vkgate-provider"] == "b"
    assert second.headers["x-vkgate-fallback-count"] == "1"
    assert chain.calls() == {"a": 1, "b": 2}, "a was skipped while it asked to be left alone"
    clock.elapse(30)
    assert (await chain.chat()).headers["x-vkgate-provider"] == "a"


async def test_breaker_opens_skips_probes_and_closes(
    client: httpx.AsyncClient, app: Litestar, clock: ManualClock, stack: AsyncExitStack
) -> None:
    chain = await build_chain(
        client, app, clock, stack, names=("a", "b"), circuit_threshold=2, circuit_cooldown_s=60
    )
    for _ in range(2):
        chain.fakes["a"].fail_next(500, "down")
        assert (await chain.chat()).headers["x-vkgate-provider"] == "b"
    # Open: a is not called at all.
    assert (await chain.chat()).headers["x-vkgate-provider"] == "b"
    assert chain.calls() == {"a": 2, "b": 3}
    clock.elapse(60)
    # Half-open: one probe goes to a; its success closes the breaker.
    assert (await chain.chat()).headers["x-vkgate-provider"] == "a"
    assert (await chain.chat()).headers["x-vkgate-provider"] == "a"
    assert chain.calls() == {"a": 4, "b": 3}


async def test_a_failed_probe_keeps_the_breaker_open(
    client: httpx.AsyncClient, app: Litestar, clock: ManualClock, stack: AsyncExitStack
) -> None:
    chain = await build_chain(
        client, app, clock, stack, names=("a", "b"), circuit_threshold=1, circuit_cooldown_s=60
    )
    chain.fakes["a"].fail_next(500, "down")
    await chain.chat()
    clock.elapse(60)
    chain.fakes["a"].fail_next(500, "still down")
    assert (await chain.chat()).headers["x-vkgate-provider"] == "b"
    assert (await chain.chat()).headers["x-vkgate-provider"] == "b"
    assert chain.calls() == {"a": 2, "b": 3}


async def test_an_all_open_chain_is_refused_without_calling_any_provider(
    client: httpx.AsyncClient, app: Litestar, clock: ManualClock, stack: AsyncExitStack
) -> None:
    chain = await build_chain(
        client, app, clock, stack, names=("a", "b"), circuit_threshold=1, circuit_cooldown_s=60
    )
    chain.fakes["a"].fail_next(500, "down")
    chain.fakes["b"].fail_next(502, "down too")
    assert (await chain.chat()).status_code == 502
    refused = await chain.chat()
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "circuit_open"
    assert [a["code"] for a in error["attempts"]] == ["circuit_open", "circuit_open"]
    assert refused.headers["retry-after"] == "60"
    assert chain.calls() == {"a": 1, "b": 1}


async def test_a_429_does_not_open_the_breaker(
    client: httpx.AsyncClient, app: Litestar, clock: ManualClock, stack: AsyncExitStack
) -> None:
    chain = await build_chain(client, app, clock, stack, names=("a", "b"), circuit_threshold=1)
    chain.fakes["a"].fail_next(429, "busy")
    assert (await chain.chat()).headers["x-vkgate-provider"] == "b"
    assert (await chain.chat()).headers["x-vkgate-provider"] == "a"


async def test_a_stream_that_fails_before_its_first_chunk_falls_through(
    client: httpx.AsyncClient, app: Litestar, clock: ManualClock, stack: AsyncExitStack
) -> None:
    chain = await build_chain(client, app, clock, stack, names=("a", "b"))
    chain.fakes["a"].break_after_events = 0
    async with chain.proxy.openai(chain.tenant.key) as sdk:
        stream = await sdk.chat.completions.create(model=CHAT_ALIAS, messages=HELLO, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "Hi there!", "b's whole stream, nothing of a's"
    assert chain.calls() == {"a": 1, "b": 1}


async def test_no_failover_once_a_stream_started_it_ends_with_an_error_event(
    client: httpx.AsyncClient, app: Litestar, clock: ManualClock, stack: AsyncExitStack
) -> None:
    chain = await build_chain(client, app, clock, stack, names=("a", "b"))
    chain.fakes["a"].break_after_events = 2
    async with chain.proxy.http() as http:
        response = await http.post(
            "/v1/chat/completions",
            json={"model": CHAT_ALIAS, "messages": HELLO, "stream": True},
            headers={"Authorization": f"Bearer {chain.tenant.key}"},
        )
    assert response.status_code == 200
    events = [e for e in response.text.split("\n\n") if e.strip()]
    assert len(events) == 3, events
    assert '"error"' in events[-1] and '"code":"provider_error"' in events[-1]
    assert chain.calls() == {"a": 1, "b": 0}


async def test_a_chain_that_only_timed_out_is_a_504_with_every_cause(
    client: httpx.AsyncClient, app: Litestar, clock: ManualClock, stack: AsyncExitStack
) -> None:
    chain = await build_chain(client, app, clock, stack, names=("a", "b"), first_byte_timeout_s=0.2)
    chain.fakes["a"].stall_s = chain.fakes["b"].stall_s = 0.6
    response = await chain.chat()
    assert response.status_code == 504, response.text
    error = response.json()["error"]
    assert error["code"] == "provider_timeout"
    assert [a["code"] for a in error["attempts"]] == ["provider_timeout", "provider_timeout"]
