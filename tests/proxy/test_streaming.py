"""Streams once they started: a client that leaves cancels the provider's request, and a provider
that goes quiet ends the stream with an error event instead of falling through."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import openai
import pytest
from litestar import Litestar

from proxy.breaker import Breakers, BreakerState
from proxy.dispatch import Dispatcher, Outcome
from proxy.formats import ChatExchange
from proxy.providers import Operation, ProviderUnreachable, Upstream
from proxy.providers.base import WireFormat
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
from tests.support.clock import ManualClock
from tests.support.fake_openai import FakeOpenAI
from vkgate.clock import SystemClock

HELLO: Any = [{"role": "user", "content": "hello"}]


async def test_client_leaving_mid_stream_cancels_the_provider_request(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    fake_openai.stream_events = 500
    fake_openai.chunk_delay_s = 0.01
    async with (
        proxy.http() as http,
        http.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": CHAT_ALIAS, "messages": HELLO, "stream": True},
            headers={"Authorization": f"Bearer {tenant.key}"},
        ) as response,
    ):
        assert response.status_code == 200
        first = await anext(response.aiter_raw())
        assert first.startswith(b"data: ")
    await asyncio.wait_for(fake_openai.stream_cancelled.wait(), 5)


async def test_sdk_closing_a_stream_early_cancels_the_provider_request(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    fake_openai.stream_events = 500
    fake_openai.chunk_delay_s = 0.01
    async with proxy.openai(tenant.key) as client:
        stream = await client.chat.completions.create(model=CHAT_ALIAS, messages=HELLO, stream=True)
        first = await anext(aiter(stream))
        assert first.choices[0].delta.role == "assistant"
        await stream.close()
    await asyncio.wait_for(fake_openai.stream_cancelled.wait(), 5)


@pytest.fixture
async def impatient_proxy(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock
) -> AsyncIterator[RunningProxy]:
    async with serve_proxy(app, clock, proxy_settings(first_byte_timeout_s=0.3)) as running:
        yield running


async def test_provider_going_quiet_mid_stream_ends_it_with_an_error_event(
    impatient_proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    fake_openai.chunk_delay_s = 1.0
    async with impatient_proxy.http() as http:
        response = await http.post(
            "/v1/chat/completions",
            json={"model": CHAT_ALIAS, "messages": HELLO, "stream": True},
            headers={"Authorization": f"Bearer {tenant.key}"},
        )
    assert response.status_code == 200  # the headers went out with the first chunk
    events = [e for e in response.text.split("\n\n") if e]
    assert json.loads(events[0].removeprefix("data: "))["choices"][0]["delta"]["role"]
    error = json.loads(events[-1].removeprefix("data: "))["error"]
    assert error["code"] == "provider_timeout"
    assert set(error) == {"message", "type", "code", "param"}
    assert "[DONE]" not in response.text


async def test_sdk_sees_a_broken_off_stream_as_an_error(
    impatient_proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    fake_openai.chunk_delay_s = 1.0
    async with impatient_proxy.openai(tenant.key) as client:
        stream = await client.chat.completions.create(model=CHAT_ALIAS, messages=HELLO, stream=True)
        with pytest.raises(openai.APIError, match="broke off"):
            async for _ in stream:
                pass


async def test_stream_never_falls_through_once_the_first_byte_went_out(
    impatient_proxy: RunningProxy,
    tenant: Tenant,
    client: httpx.AsyncClient,
    fake_openai: FakeOpenAI,
) -> None:
    first = await add_provider(client, tenant.org, "primary", fake_openai.url)
    second = await add_provider(client, tenant.org, "secondary", fake_openai.url)
    policy = await add_policy(client, tenant.org, {CHAT_ALIAS: [(first, "a"), (second, "b")]})
    _, key = await add_key(client, tenant, policy=policy)
    fake_openai.chunk_delay_s = 1.0
    async with impatient_proxy.http() as http:
        response = await http.post(
            "/v1/chat/completions",
            json={"model": CHAT_ALIAS, "messages": HELLO, "stream": True},
            headers={"Authorization": f"Bearer {key}"},
        )
    assert response.headers["x-vkgate-provider"] == "primary"
    assert '"provider_timeout"' in response.text
    assert [r.json()["model"] for r in fake_openai.received] == ["a"]


async def test_a_stream_whose_client_cannot_be_written_closes_the_providers_answer() -> None:
    closed: list[bool] = []

    class Reply:
        status = 200
        content_type = b"text/event-stream"
        retry_after = None

        drained = False

        async def read(self) -> bytes:
            return b""

        async def chunks(self) -> AsyncIterator[bytes]:
            self.drained = True
            yield b"data: {}\n\n"

        def close(self) -> None:
            closed.append(True)

    async def send(message: dict[str, Any]) -> None:
        raise OSError("client connection lost")

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # never disconnects on its own
        return {"type": "http.disconnect"}

    # A provider whose answer is already in; only the way to the client is broken.
    outcome = await stream_through(Reply(), send, receive, Breakers(10, 30.0, 60.0, SystemClock()))
    assert closed
    assert outcome.cancelled, "the answer never reached the client"


async def test_a_client_leaving_while_the_provider_is_quiet_ends_the_stream_as_cancelled() -> None:
    """No provider fault is counted: the answer is closed under the pump because the client
    left, not because the provider failed."""
    sent: list[dict[str, Any]] = []
    first_sent = asyncio.Event()
    closed: list[bool] = []

    class Reply:
        status = 200
        content_type = b"text/event-stream"
        retry_after = None

        drained = False  # the provider never ends this answer

        def __init__(self) -> None:
            self._closed = asyncio.Event()

        async def read(self) -> bytes:
            return b""

        async def chunks(self) -> AsyncIterator[bytes]:
            yield b'data: {"choices":[]}\n\n'
            await self._closed.wait()  # the provider is quiet until the answer is closed
            raise ProviderUnreachable("the answer was abandoned")

        def close(self) -> None:
            closed.append(True)
            self._closed.set()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            first_sent.set()

    async def receive() -> dict[str, Any]:
        await first_sent.wait()
        return {"type": "http.disconnect"}

    breakers = Breakers(1, 30.0, 60.0, SystemClock())
    outcome = await stream_through(Reply(), send, receive, breakers)
    assert closed
    assert outcome.cancelled and not outcome.broke
    # One failure would have opened this breaker (threshold 1).
    assert breakers.states() == {"p": BreakerState.CLOSED}
    assert not any(m.get("more_body") is False for m in sent), "no tail after the client left"


class _Scripted:
    """A provider's streamed answer that ends where the test says: `drained` turns true as
    its last chunk is handed over, as it does for a real answer that has arrived in full."""

    status = 200
    content_type = b"text/event-stream"
    retry_after = None

    def __init__(self, chunks: list[bytes], hold_before_last: asyncio.Event | None = None) -> None:
        self._chunks = chunks
        self._hold = hold_before_last
        self.drained = False

    async def read(self) -> bytes:
        return b""

    async def chunks(self) -> AsyncIterator[bytes]:
        for i, chunk in enumerate(self._chunks):
            if i == len(self._chunks) - 1:
                if self._hold is not None:
                    await self._hold.wait()
                self.drained = True
            yield chunk

    def close(self) -> None:
        pass


FIRST = b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
LAST = b'data: {"choices":[{"index":0,"delta":{"content":"lo"}}]}\n\ndata: [DONE]\n\n'


async def test_the_last_bytes_of_an_ended_answer_go_out_with_the_streams_end() -> None:
    """One write for the last events and the end of the stream, instead of two."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    breakers = Breakers(10, 30.0, 60.0, SystemClock())
    outcome = await stream_through(_Scripted([FIRST, LAST]), send, receive, breakers)
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert [(m["body"], m["more_body"]) for m in bodies] == [(FIRST, True), (LAST, False)]
    assert not outcome.cancelled and not outcome.broke


async def test_a_chunk_is_not_held_while_the_providers_answer_goes_on() -> None:
    """Chunks pass through as they come: only an answer that has ended gives its last bytes
    to the end of the stream."""
    sent: list[dict[str, Any]] = []
    more = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message.get("body") == FIRST:
            # The first chunk reached the client while the provider still had more to say.
            more.set()

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    breakers = Breakers(10, 30.0, 60.0, SystemClock())
    await stream_through(_Scripted([FIRST, LAST], hold_before_last=more), send, receive, breakers)
    bodies = [(m["body"], m["more_body"]) for m in sent if m["type"] == "http.response.body"]
    assert bodies == [(FIRST, True), (LAST, False)]


async def stream_through(
    reply: Any,
    send: Callable[[dict[str, Any]], Awaitable[None]],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    breakers: Breakers,
) -> Outcome:
    """A streamed chat request forwarded by a dispatcher to one provider answering `reply`,
    to a client of `send` and `receive`; its outcome."""

    class Provider:
        async def send(self, *_: Any) -> Any:
            return reply

    upstream = Upstream(
        "p", "p", "openai", "m", b'"m"', Provider(), urls={Operation.CHAT: "http://p.test"}
    )  # type: ignore[arg-type]
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
    exchange = ChatExchange(
        WireFormat.OPENAI,
        body,
        "m",
        stream=True,
        client_wants_usage=True,
        with_usage=body,
        created=0,
    )

    async def recheck() -> None:
        return None

    dispatcher = Dispatcher(breakers, SystemClock().monotonic)
    outcome = Outcome()
    await asyncio.wait_for(
        dispatcher.forward((upstream,), exchange, {}, receive, send, b"rid", recheck, outcome), 5
    )
    return outcome
