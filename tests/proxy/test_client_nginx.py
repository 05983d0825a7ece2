"""The provider client against nginx, TLS in front of the fake OpenAI provider: answers framed by
length and by chunks, gzip, connections nginx closes after its request limit, and nginx's idle
close crossing a request already sent. nginx writes its answers its own way (its chunk sizes,
its TLS records, its closes), which no server written here imitates."""

from __future__ import annotations

import asyncio
import json
import logging
import select
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from proxy.providers import HttpClient, Timeouts
from tests.support.certificates import TestCA
from tests.support.fake_openai import API_KEY, REPLY, FakeOpenAI, serve_fake_openai
from tests.support.packaged import Nginx, nginx_tls

HEADERS = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
STREAMED = "Hi there!"
"""What the fake provider's streams say."""
IDLE_CLOSE_S = 1
"""nginx's keep-alive time on /idle/: it closes a connection idle this long."""


def locations(upstream: int) -> str:
    def proxied(prefix: str, extra: str) -> str:
        return f"""
        location /{prefix}/ {{
            proxy_pass http://127.0.0.1:{upstream}/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            {extra}
        }}"""

    return "\n".join(
        [
            proxied("plain", "gzip off;"),
            proxied(
                "gzip",
                "gzip on; gzip_proxied any; gzip_min_length 0; "
                "gzip_types application/json text/event-stream;",
            ),
            proxied("short", "keepalive_requests 2;"),
            proxied("idle", f"keepalive_timeout {IDLE_CLOSE_S}s;"),
        ]
    )


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("nginx-ca"))


@pytest.fixture(scope="module")
async def upstream() -> AsyncIterator[FakeOpenAI]:
    async with serve_fake_openai() as fake:
        yield fake


@pytest.fixture(scope="module")
def nginx(ca: TestCA, upstream: FakeOpenAI) -> Iterator[Nginx]:
    issued = ca.issue("api.provider.test", "localhost")
    port = int(upstream.url.rsplit(":", 1)[1].split("/")[0])
    with nginx_tls(issued.certificate, issued.key, locations(port)) as server:
        yield server


@pytest.fixture
async def http(ca: TestCA) -> AsyncIterator[HttpClient]:
    client = HttpClient(
        Timeouts(connect_s=5, read_s=10, total_s=30),
        user_agent="vkgate/test",
        tls=ssl.create_default_context(cafile=str(ca.bundle)),
    )
    yield client
    await client.close()


def url(nginx: Nginx, prefix: str) -> str:
    return f"https://localhost:{nginx.port}/{prefix}/v1/chat/completions"


def body(**extra: Any) -> bytes:
    return json.dumps({**CHAT, **extra}).encode()


async def framing(ca: TestCA, nginx: Nginx, prefix: str, **extra: Any) -> httpx.Headers:
    """The headers nginx answers `prefix` with, as a client that sends gzip hears them."""
    context = ssl.create_default_context(cafile=str(ca.bundle))
    async with httpx.AsyncClient(verify=context, timeout=10) as client:
        answer = await client.post(url(nginx, prefix), content=body(**extra), headers=HEADERS)
    assert answer.status_code == 200, answer.text
    return answer.headers


def events(stream: bytes) -> list[str]:
    return [line for line in stream.decode().split("\n\n") if line]


async def test_an_answer_framed_by_its_length_is_read_whole(
    http: HttpClient, nginx: Nginx, ca: TestCA
) -> None:
    headers = await framing(ca, nginx, "plain")
    assert "content-length" in headers and "transfer-encoding" not in headers
    reply = await http.post(url(nginx, "plain"), body(), HEADERS)
    assert reply.status == 200 and reply.content_type.startswith(b"application/json")
    answer = json.loads(await reply.read())
    assert answer["choices"][0]["message"]["content"] == REPLY


async def test_a_chunked_stream_arrives_whole_and_in_order(
    http: HttpClient, nginx: Nginx, ca: TestCA
) -> None:
    assert (await framing(ca, nginx, "plain", stream=True))["transfer-encoding"] == "chunked"
    reply = await http.post(url(nginx, "plain"), body(stream=True), HEADERS)
    assert reply.content_type.startswith(b"text/event-stream")
    received = b"".join([chunk async for chunk in reply.chunks()])
    lines = events(received)
    assert lines[-1] == "data: [DONE]"
    content = "".join(
        json.loads(line.removeprefix("data: "))["choices"][0]["delta"].get("content", "")
        for line in lines[:-1]
        if json.loads(line.removeprefix("data: "))["choices"]
    )
    assert content == STREAMED


async def test_gzip_answers_are_decoded_plain_and_streamed(
    http: HttpClient, nginx: Nginx, ca: TestCA
) -> None:
    headers = await framing(ca, nginx, "gzip")
    assert headers["content-encoding"] == "gzip" and headers["transfer-encoding"] == "chunked"
    reply = await http.post(url(nginx, "gzip"), body(), HEADERS)
    assert json.loads(await reply.read())["choices"][0]["message"]["content"] == REPLY
    reply = await http.post(url(nginx, "gzip"), body(stream=True), HEADERS)
    received = b"".join([chunk async for chunk in reply.chunks()])
    assert events(received)[-1] == "data: [DONE]"


async def test_sequential_calls_share_one_tls_connection(http: HttpClient, nginx: Nginx) -> None:
    before = nginx.accepted()
    for _ in range(3):
        reply = await http.post(url(nginx, "plain"), body(), HEADERS)
        await reply.read()
    assert nginx.accepted() - before - 1 == 1  # less the count's own connection


async def test_a_connection_nginx_closes_after_its_request_limit_is_replaced(
    http: HttpClient, nginx: Nginx
) -> None:
    before = nginx.accepted()
    for _ in range(5):
        reply = await http.post(url(nginx, "short"), body(), HEADERS)
        assert reply.status == 200
        assert json.loads(await reply.read())["choices"][0]["message"]["content"] == REPLY
    # Two requests a connection (the second answered with `connection: close`): three in all.
    assert nginx.accepted() - before - 1 == 3


async def test_a_connection_nginx_closed_while_idle_is_not_reused(
    http: HttpClient, nginx: Nginx
) -> None:
    await (await http.post(url(nginx, "idle"), body(), HEADERS)).read()
    deadline = asyncio.get_running_loop().time() + IDLE_CLOSE_S + 10
    while any(http._idle.values()):  # until nginx's idle close is noticed
        assert asyncio.get_running_loop().time() < deadline, "nginx never closed the connection"
        await asyncio.sleep(0.02)  # nginx's own timer: nothing here can be injected
    before = nginx.accepted()
    await (await http.post(url(nginx, "idle"), body(), HEADERS)).read()
    assert nginx.accepted() - before - 1 == 1


async def test_a_request_sent_as_nginx_closes_its_idle_connection_goes_again_on_a_new_one(
    http: HttpClient, nginx: Nginx, upstream: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    await (await http.post(url(nginx, "idle"), body(), HEADERS)).read()
    [connection] = [c for idle in http._idle.values() for c in idle]
    assert connection.transport is not None
    descriptor = connection.transport.get_extra_info("socket").fileno()
    calls = len(upstream.received)
    before = nginx.accepted()
    loop = asyncio.get_running_loop()
    sent: asyncio.Future[asyncio.Task[Any]] = loop.create_future()

    def when_nginx_has_closed() -> None:
        # The loop is held here until nginx's close has reached the socket, and the request is
        # sent before the loop reads that close: the client still holds the connection for
        # usable, as it would when the close and the request cross on the wire.
        readable, _, _ = select.select([descriptor], [], [], IDLE_CLOSE_S + 10)
        assert readable, "nginx never closed the idle connection"
        sent.set_result(asyncio.ensure_future(http.post(url(nginx, "idle"), body(), HEADERS)))

    loop.call_soon(when_nginx_has_closed)
    with caplog.at_level(logging.INFO, logger="vkgate.proxy.providers"):
        reply = await asyncio.wait_for(await sent, 10)
    # It was sent on the connection nginx had closed, and sent again on a new one.
    replaced = [r.getMessage() for r in caplog.records if r.name == "vkgate.proxy.providers"]
    assert replaced == ["provider_connection_replaced"]
    assert json.loads(await reply.read())["choices"][0]["message"]["content"] == REPLY
    assert nginx.accepted() - before - 1 == 1  # the request went again, on a new connection
    assert len(upstream.received) == calls + 1  # and reached the provider once
