"""The provider client (proxy/providers/_client.py) against HTTP/1.1 servers on loopback that
answer exactly the bytes each test scripts: framing, reuse, timeouts, failures, TLS."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gzip
import socket
import ssl
import struct
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from proxy.pace import pace_of
from proxy.providers import HttpClient, ProviderTimeout, ProviderUnreachable, Timeouts
from proxy.providers._connection import HIGH_WATER
from tests.support.processes import free_port

Answer = Callable[[asyncio.StreamWriter], Awaitable[bool]]
"""Writes one answer; False closes the connection after it."""

BODY = b'{"model":"m","messages":[]}'
JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"


def fixed(data: bytes, keep: bool = True) -> Answer:
    async def answer(writer: asyncio.StreamWriter) -> bool:
        writer.write(data)
        await writer.drain()
        return keep

    return answer


def json_answer(body: bytes = b'{"ok":true}', extra: bytes = b"") -> Answer:
    return fixed(JSON_HEAD + extra + b"content-length: %d\r\n\r\n" % len(body) + body)


class Scripted:
    """A loopback HTTP/1.1 server: each request it reads gets the next scripted answer."""

    def __init__(self, *answers: Answer, tls: ssl.SSLContext | None = None) -> None:
        self.answers = list(answers)
        self.tls = tls
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0
        self.closed_connections = 0
        self.connection_closed = asyncio.Event()
        self.release = asyncio.Event()
        self.port = 0
        self.reader: asyncio.StreamReader | None = None
        """The latest connection's, for an answer that waits for the client to leave."""
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Scripted:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self.release.set()
        self._server.close()

    def held(self, data: bytes) -> Answer:
        """An answer that writes `data`, then waits for `release` and closes."""

        async def answer(writer: asyncio.StreamWriter) -> bool:
            writer.write(data)
            await writer.drain()
            await self.release.wait()
            return False

        return answer

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.reader = reader
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
                    break
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                if not await self.answers.pop(0)(writer):
                    break
        finally:
            writer.close()
            self.closed_connections += 1
            self.connection_closed.set()


def chunked_in_two(server: Scripted) -> Answer:
    """A chunked event stream: `data: `, then, once `server.release` is set, `one` and the end
    of the answer in one write, as providers send their last bytes."""

    async def answer(writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(b"transfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n")
        await writer.drain()
        await server.release.wait()
        writer.write(b"3\r\none\r\n0\r\n\r\n")
        await writer.drain()
        return True

    return answer


def client(read_s: float = 5.0, total_s: float = 30.0, **options: object) -> HttpClient:
    return HttpClient(
        Timeouts(connect_s=2, read_s=read_s, total_s=total_s),
        user_agent="vkgate/test",
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture
async def http() -> AsyncIterator[HttpClient]:
    c = client()
    yield c
    await c.close()


async def test_sequential_calls_share_one_kept_alive_connection(http: HttpClient) -> None:
    async with Scripted(*(json_answer(b'{"n":%d}' % i) for i in range(5))) as server:
        for i in range(5):
            reply = await http.post(server.url + "/v1/chat/completions", BODY, {})
            assert reply.status == 200
            assert await reply.read() == b'{"n":%d}' % i
            reply.close()
    assert server.connections == 1


async def test_request_carries_the_path_query_host_agent_length_and_headers(
    http: HttpClient,
) -> None:
    async with Scripted(json_answer()) as server:
        url = f"http://localhost:{server.port}/openai/deployments/d/chat/completions?api-version=1"
        reply = await http.post(url, BODY, {"api-key": "k", "traceparent": "00-ab-cd-01"})
        await reply.read()
    head, body = server.requests[0]
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /openai/deployments/d/chat/completions?api-version=1 HTTP/1.1"
    assert f"host: localhost:{server.port}" in lines
    assert "user-agent: vkgate/test" in lines
    assert "api-key: k" in lines and "traceparent: 00-ab-cd-01" in lines
    assert "accept: */*" in lines and "accept-encoding: gzip, deflate" in lines
    assert f"content-length: {len(BODY)}" in lines
    assert body == BODY


async def test_get_and_delete_go_with_their_method_and_share_the_posts_connection(
    http: HttpClient,
) -> None:
    answers = (json_answer(b'{"n":%d}' % i) for i in range(4))
    async with Scripted(*answers) as server:
        base = f"http://127.0.0.1:{server.port}/v1/responses"
        calls = [
            http.post(base, BODY, {}),
            http.request("GET", base + "/resp_1/input_items?limit=2&order=asc", {"a": "b"}),
            http.request("DELETE", base + "/resp_1", {}),
            http.post(base, BODY, {}),
        ]
        for i, call in enumerate(calls):
            reply = await call
            assert (reply.status, await reply.read()) == (200, b'{"n":%d}' % i)
    assert server.connections == 1
    lines = [head.decode().split("\r\n") for head, _ in server.requests]
    assert [line[0] for line in lines] == [
        "POST /v1/responses HTTP/1.1",
        "GET /v1/responses/resp_1/input_items?limit=2&order=asc HTTP/1.1",
        "DELETE /v1/responses/resp_1 HTTP/1.1",
        "POST /v1/responses HTTP/1.1",
    ]
    assert "a: b" in lines[1] and "content-length: 0" in lines[1]
    assert [body for _, body in server.requests] == [BODY, b"", b"", BODY]


async def test_while_requests_are_in_flight_a_call_is_sent_at_the_loops_next_turn(
    http: HttpClient,
) -> None:
    pace = pace_of(asyncio.get_running_loop())
    async with Scripted(json_answer(), json_answer(b'{"n":2}')) as server:
        await (await http.post(server.url + "/x", BODY, {})).read()  # a connection to reuse
        [connection] = [c for idle in http._idle.values() for c in idle]
        assert connection.transport is not None
        sent: list[bytes] = []
        writelines = connection.transport.writelines

        def recorded(data: tuple[bytes, ...]) -> None:
            sent.append(b"".join(data))
            writelines(data)

        connection.transport.writelines = recorded  # type: ignore[method-assign]
        pace.in_flight = 2
        try:
            call = asyncio.ensure_future(http.post(server.url + "/x", BODY, {}))
            await asyncio.sleep(0)  # the call's first step: the request is not written yet
            assert sent == []
            await asyncio.sleep(0)  # the next turn: written whole, in one write
            assert len(sent) == 1 and sent[0].endswith(b"\r\n\r\n" + BODY)
            reply = await call
            assert (reply.status, await reply.read()) == (200, b'{"n":2}')
        finally:
            pace.in_flight = 0
    assert server.connections == 1 and [body for _, body in server.requests] == [BODY, BODY]


async def test_a_credentials_own_user_agent_replaces_the_gateways(http: HttpClient) -> None:
    async with Scripted(json_answer()) as server:
        await (await http.post(server.url + "/x", BODY, {"User-Agent": "mine/1"})).read()
    lines = server.requests[0][0].decode().lower().split("\r\n")
    assert [line for line in lines if line.startswith("user-agent")] == ["user-agent: mine/1"]


async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(
    http: HttpClient,
) -> None:
    async with Scripted() as server:
        with pytest.raises(ProviderUnreachable, match="line break"):
            await http.post(server.url + "/x", BODY, {"x-a": "1\r\nx-injected: 2"})
    assert server.connections == 0


async def test_status_content_type_and_retry_after_are_read() -> None:
    answer = fixed(
        b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json; charset=utf-8\r\n"
        b"Retry-After: 7\r\nContent-Length: 2\r\n\r\n{}"
    )
    async with Scripted(answer) as server:
        http = client()
        reply = await http.post(server.url + "/x", BODY, {})
        assert (reply.status, reply.content_type, reply.retry_after) == (
            429,
            b"application/json; charset=utf-8",
            b"7",
        )
        assert await reply.read() == b"{}"
        await http.close()


async def test_a_chunked_answer_is_read_whole_and_streamed_as_it_arrives(
    http: HttpClient,
) -> None:
    async with Scripted() as server:
        server.answers += [chunked_in_two(server), chunked_in_two(server)]
        reply = await http.post(server.url + "/x", BODY, {})
        assert reply.content_type == b"text/event-stream"
        chunks = reply.chunks()
        assert await anext(chunks) == b"data: "
        server.release.set()
        assert [c async for c in chunks] == [b"one"]
        reply.close()
        reply = await http.post(server.url + "/x", BODY, {})
        assert await reply.read() == b"data: one"
    assert server.connections == 1


async def test_a_streamed_answer_is_drained_only_after_its_provider_ended_it(
    http: HttpClient,
) -> None:
    """`drained` says the last bytes yielded are the last there will be, and never while the
    provider may still send more."""
    async with Scripted() as server:
        server.answers.append(chunked_in_two(server))
        reply = await http.post(server.url + "/x", BODY, {})
        chunks = reply.chunks()
        assert await anext(chunks) == b"data: "
        assert not reply.drained, "the provider has not ended its answer"
        server.release.set()
        assert await anext(chunks) == b"one"
        assert reply.drained
        assert [c async for c in chunks] == []


async def test_an_answer_that_closes_the_connection_is_read_and_the_next_call_reconnects(
    http: HttpClient,
) -> None:
    close_delimited = fixed(JSON_HEAD + b"connection: close\r\n\r\n" + b'{"until":"close"}', False)
    async with Scripted(close_delimited, json_answer()) as server:
        reply = await http.post(server.url + "/x", BODY, {})
        assert await reply.read() == b'{"until":"close"}'
        reply = await http.post(server.url + "/x", BODY, {})
        assert await reply.read() == b'{"ok":true}'
    assert server.connections == 2


async def test_a_connection_the_provider_closed_while_idle_is_not_reused(
    http: HttpClient,
) -> None:
    # The first answer is whole, then the provider drops the connection (as at the end of its
    # keep-alive time) without saying so in the answer.
    whole_then_closed = fixed(JSON_HEAD + b"content-length: 2\r\n\r\n{}", keep=False)
    async with Scripted(whole_then_closed, json_answer()) as server:
        await (await http.post(server.url + "/x", BODY, {})).read()
        await asyncio.wait_for(server.connection_closed.wait(), 5)
        await until(lambda: not any(http._idle.values()))
        reply = await http.post(server.url + "/x", BODY, {})
        assert await reply.read() == b'{"ok":true}'
    assert server.connections == 2


async def test_gzip_and_deflate_answers_are_decoded(http: HttpClient) -> None:
    payload = b'{"text":"' + b"x" * 5000 + b'"}'
    gz, zl = gzip.compress(payload), zlib.compress(payload)
    async with Scripted(
        json_answer(gz, b"content-encoding: gzip\r\n"),
        json_answer(zl, b"content-encoding: deflate\r\n"),
    ) as server:
        for _ in range(2):
            reply = await http.post(server.url + "/x", BODY, {})
            assert await reply.read() == payload


async def test_a_corrupt_compressed_answer_is_a_failure(http: HttpClient) -> None:
    async with Scripted(json_answer(b"not gzip at all", b"content-encoding: gzip\r\n")) as server:
        reply = await http.post(server.url + "/x", BODY, {})
        with pytest.raises(ProviderUnreachable, match="decompress"):
            await reply.read()


async def test_empty_raw_deflate_and_several_member_gzip_bodies_decode(http: HttpClient) -> None:
    raw = zlib.compressobj(wbits=-15)
    raw_deflate = raw.compress(b'{"a":1}') + raw.flush()
    members = gzip.compress(b'{"a":') + gzip.compress(b"1}")
    async with Scripted(
        json_answer(b"", b"content-encoding: gzip\r\n"),
        json_answer(raw_deflate, b"content-encoding: deflate\r\n"),
        json_answer(members, b"content-encoding: gzip\r\n"),
    ) as server:
        for expected in (b"", b'{"a":1}', b'{"a":1}'):
            reply = await http.post(server.url + "/x", BODY, {})
            assert await reply.read() == expected


async def test_an_informational_answer_before_the_real_one_is_skipped(http: HttpClient) -> None:
    async with Scripted(json_answer(extra=b"")) as server:
        server.answers[0] = fixed(
            b"HTTP/1.1 100 Continue\r\n\r\n" + JSON_HEAD + b"content-length: 2\r\n\r\n{}"
        )
        reply = await http.post(server.url + "/x", BODY, {})
        assert (reply.status, await reply.read()) == (200, b"{}")


async def test_a_provider_silent_before_its_head_times_out() -> None:
    async with Scripted() as server:
        server.answers.append(server.held(b""))
        http = client(read_s=0.1)
        with pytest.raises(ProviderTimeout, match=r"no data from the provider for 0\.1 s"):
            await http.post(server.url + "/x", BODY, {})
        await http.close()


async def test_a_stream_that_stalls_times_out_and_its_connection_is_not_reused() -> None:
    async with Scripted() as server:
        server.answers += [server.held(JSON_HEAD + b"content-length: 100\r\n\r\n{"), json_answer()]
        http = client(read_s=0.1)
        reply = await http.post(server.url + "/x", BODY, {})
        with pytest.raises(ProviderTimeout):
            await reply.read()
        reply.close()
        reply = await http.post(server.url + "/x", BODY, {})
        assert await reply.read() == b'{"ok":true}'
        await http.close()
    assert server.connections == 2


async def test_an_answer_that_trickles_past_the_total_time_is_cut() -> None:
    async def trickles(writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        while not writer.is_closing():
            writer.write(b"1\r\n.\r\n")
            await writer.drain()
            try:
                await asyncio.wait_for(server.release.wait(), 0.02)
            except TimeoutError:
                continue
            break
        return False

    async with Scripted(trickles) as server:
        http = client(read_s=5, total_s=0.3)
        reply = await http.post(server.url + "/x", BODY, {})
        with pytest.raises(ProviderTimeout, match=r"no whole answer within 0\.3 s"):
            async for _ in reply.chunks():
                pass
        await http.close()


@pytest.mark.parametrize(
    ("answer", "where"),
    [
        (b"", "before answering"),
        (JSON_HEAD + b"content-length: 50\r\n\r\n{", "cut short"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab", "cut short"),
    ],
)
async def test_a_connection_closed_before_the_answer_ends_is_a_failure(
    http: HttpClient, answer: bytes, where: str
) -> None:
    async with Scripted(fixed(answer, keep=False)) as server:
        with pytest.raises(ProviderUnreachable, match=where):
            reply = await http.post(server.url + "/x", BODY, {})
            await reply.read()


async def test_a_malformed_answer_is_a_failure(http: HttpClient) -> None:
    async with Scripted(fixed(b"<html>oops</html>\r\n\r\n")) as server:
        with pytest.raises(ProviderUnreachable, match="malformed HTTP answer"):
            await http.post(server.url + "/x", BODY, {})


async def test_a_second_answer_in_the_same_packet_is_not_read_into_the_first(
    http: HttpClient,
) -> None:
    second = b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 9\r\n\r\n<injected>"
    async with Scripted(fixed(JSON_HEAD + b"content-length: 2\r\n\r\n{}" + second)) as server:
        reply = await http.post(server.url + "/x", BODY, {})
        assert (await reply.read(), reply.content_type) == (b"{}", b"application/json")


async def test_bytes_no_request_asked_for_keep_the_connection_from_reuse(
    http: HttpClient,
) -> None:
    extra = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
    async with Scripted(
        fixed(JSON_HEAD + b"content-length: 2\r\n\r\n{}" + extra), json_answer()
    ) as server:
        assert await (await http.post(server.url + "/x", BODY, {})).read() == b"{}"
        assert await (await http.post(server.url + "/x", BODY, {})).read() == b'{"ok":true}'
    assert server.connections == 2


async def test_an_abandoned_answer_closes_its_connection(http: HttpClient) -> None:
    async def endless(writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        assert server.reader is not None
        with contextlib.suppress(ConnectionError):
            assert await server.reader.read() == b""  # the client left
        return False

    async with Scripted(endless) as server:
        reply = await http.post(server.url + "/x", BODY, {})
        assert await anext(reply.chunks()) == b"hello"
        reply.close()
        await asyncio.wait_for(server.connection_closed.wait(), 5)
        assert server.closed_connections == 1


async def test_a_body_that_runs_until_close_is_cut_when_the_connection_is_reset_or_ours_closes(
    http: HttpClient,
) -> None:
    async def partial(writer: asyncio.StreamWriter) -> bool:
        writer.write(JSON_HEAD + b"\r\n" + b'{"text":"partial')
        await writer.drain()
        await server.release.wait()
        linger = struct.pack("ii", 1, 0)  # closed with a reset, not a FIN
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        writer.transport.abort()
        return False

    async with Scripted(partial) as server:
        reply = await http.post(server.url + "/x", BODY, {})
        server.release.set()
        with pytest.raises(ProviderUnreachable, match="cut short"):
            await reply.read()
    async with Scripted(partial) as server:
        other = client()
        reply = await other.post(server.url + "/x", BODY, {})
        await other.close()
        with pytest.raises(ProviderUnreachable, match="cut short"):
            await reply.read()


async def test_a_kept_alive_connection_the_provider_closes_as_a_request_goes_out_is_replaced(
    http: HttpClient,
) -> None:
    # The provider's idle close crosses the next request: it closes the connection without a
    # byte of an answer (as when its keep-alive time ran out just as the request arrived).
    async with Scripted(json_answer(), fixed(b"", keep=False), json_answer(b'{"n":2}')) as server:
        await (await http.post(server.url + "/x", BODY, {})).read()
        reply = await http.post(server.url + "/x", BODY, {})
        assert await reply.read() == b'{"n":2}'
    assert (server.connections, len(server.requests)) == (2, 3)


async def test_a_connection_closed_without_an_answer_is_not_replaced_the_first_time(
    http: HttpClient,
) -> None:
    # A new connection has no idle close to cross: its provider read the request.
    async with Scripted(fixed(b"", keep=False), json_answer()) as server:
        with pytest.raises(ProviderUnreachable, match="before answering"):
            await http.post(server.url + "/x", BODY, {})
    assert len(server.requests) == 1


async def until(condition: Callable[[], bool]) -> None:
    """Turns of the loop until `condition` holds (bounded: the test fails rather than hangs)."""
    for _ in range(100_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_a_stream_abandoned_after_its_provider_finished_leaves_a_reusable_connection(
    http: HttpClient,
) -> None:
    # The last bytes take the unread part of a stream over HIGH_WATER and end it, in one read:
    # the connection went back to the pool while reading was paused for the slow reader.
    more = asyncio.Event()

    async def big(writer: asyncio.StreamWriter) -> bool:
        length = 1 + HIGH_WATER + 10
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\nx" % length)
        await writer.drain()
        await server.release.wait()
        writer.write(b"y" * HIGH_WATER)
        await writer.drain()
        await more.wait()
        writer.write(b"z" * 10)
        await writer.drain()
        return True

    async with Scripted(big, json_answer()) as server:
        reply = await http.post(server.url + "/x", BODY, {})
        assert await anext(reply.chunks()) == b"x"
        server.release.set()  # the provider goes on while the gateway's client is slow
        await until(lambda: reply._unread >= HIGH_WATER)
        more.set()
        await until(lambda: reply.complete)
        reply.close()  # and then the client goes away
        reply = await http.post(server.url + "/x", BODY, {})
        assert await reply.read() == b'{"ok":true}'
    assert server.connections == 1


async def test_framing_headers_from_a_credential_are_not_sent(http: HttpClient) -> None:
    extra = {
        "Accept-Encoding": "br",
        "Transfer-Encoding": "chunked",
        "Content-Length": "1",
        "Connection": "close",
        "x-ok": "1",
    }
    async with Scripted(json_answer(), json_answer()) as server:
        for _ in range(2):
            assert await (await http.post(server.url + "/x", BODY, extra)).read() == b'{"ok":true}'
    lines = server.requests[0][0].decode().lower().split("\r\n")
    assert not [line for line in lines if line.startswith(("transfer-encoding", "connection"))]
    assert [line for line in lines if line.startswith("accept-encoding")] == [
        "accept-encoding: gzip, deflate"
    ]
    assert [line for line in lines if line.startswith("content-length")] == [
        f"content-length: {len(BODY)}"
    ]
    assert "x-ok: 1" in lines
    assert server.connections == 1


async def test_unreachable_and_unreadable_urls_are_failures(http: HttpClient) -> None:
    with pytest.raises(ProviderUnreachable, match="cannot connect"):
        await http.post(f"http://127.0.0.1:{free_port()}/x", BODY, {})
    with pytest.raises(ProviderUnreachable, match="not an http"):
        await http.post("ftp://example.com/x", BODY, {})
    with pytest.raises(ProviderUnreachable, match="cannot be read"):
        await http.post("http://127.0.0.1:99999/x", BODY, {})
    with pytest.raises(ProviderUnreachable, match="cannot connect"):
        await http.post("http://a..b/x", BODY, {})
    with pytest.raises(ProviderUnreachable, match="user name or password"):
        await http.post("http://user:secret@127.0.0.1:1/x", BODY, {})


async def test_a_streamed_answer_larger_than_the_buffer_pauses_the_provider_and_arrives_whole(
    http: HttpClient,
) -> None:
    payload = bytes(range(256)) * (4 * HIGH_WATER // 256)
    async with Scripted(json_answer(payload)) as server:
        reply = await http.post(server.url + "/x", BODY, {})
        received = bytearray()
        chunks = reply.chunks()
        received += await anext(chunks)
        # Not read for a while: the client stops reading once it holds more than HIGH_WATER.
        await until(lambda: reply._paused or reply.complete)
        assert reply._paused
        async for chunk in chunks:
            received += chunk
        assert bytes(received) == payload


async def test_idle_connections_are_closed_after_the_keep_alive_time() -> None:
    http = client(keepalive_s=0.05)
    async with Scripted(json_answer()) as server:
        await (await http.post(server.url + "/x", BODY, {})).read()
        await asyncio.wait_for(server.connection_closed.wait(), 5)
    assert http._idle == {}
    await http.close()


async def test_closing_the_client_ends_answers_in_flight(http: HttpClient) -> None:
    async with Scripted() as server:
        server.answers.append(server.held(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"))
        reply = await http.post(server.url + "/x", BODY, {})
        await http.close()
        with pytest.raises(ProviderUnreachable):
            await reply.read()
        with pytest.raises(ProviderUnreachable, match="shutting down"):
            await http.post(server.url + "/x", BODY, {})


# -- TLS -------------------------------------------------------------------------------------


def _self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


async def test_https_is_verified_against_the_trust_store(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(cert, key)
    answers = [json_answer(b'{"tls":true}'), json_answer(b'{"tls":true}')]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            await answers.pop(0)(writer)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=serving)
    port = server.sockets[0].getsockname()[1]
    try:
        trusting = ssl.create_default_context(cafile=str(cert))
        http = client(tls=trusting)
        reply = await http.post(f"https://localhost:{port}/x", BODY, {})
        assert await reply.read() == b'{"tls":true}'
        await http.close()
        # Trusted, but not for the name called: refused.
        http = client(tls=trusting)
        with pytest.raises(ProviderUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
            await http.post(f"https://127.0.0.1:{port}/x", BODY, {})
        await http.close()
        # The system's store does not know this certificate: refused, never sent.
        http = client()
        with pytest.raises(ProviderUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
            await http.post(f"https://localhost:{port}/x", BODY, {})
        await http.close()
    finally:
        server.close()


async def test_closing_an_answer_wakes_a_reader_waiting_for_more(http: HttpClient) -> None:
    chunk = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n"
    async with Scripted() as server:
        server.answers.append(server.held(chunk))
        reply = await http.post(server.url + "/x", BODY, {})
        chunks = reply.chunks()
        assert await anext(chunks) == b"hello"
        waiting = asyncio.ensure_future(anext(chunks))
        await until(lambda: reply._waiter is not None)
        reply.close()
        with pytest.raises(ProviderUnreachable, match="abandoned"):
            await asyncio.wait_for(waiting, 5)
