"""The proxy's HTTP/1.1 protocol: an answer's head goes out with its body, and nothing waits
past the event loop's next turn."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from proxy.asgi import ON_DISCONNECT, Scope, Watch
from proxy.http1 import OneWriteHttpToolsProtocol
from proxy.http1._transport import OneWrite
from proxy.main import HTTP_OPTIONS
from proxy.pace import pace_of
from tests.proxy.conftest import RunningProxy


class Recorder:
    """A transport that records what reaches it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False
        self.paused = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def writelines(self, data: tuple[bytes, ...]) -> None:
        self.writes.append(b"".join(data))  # one system call (writev)

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1234) if name == "peername" else None


def one_write() -> tuple[OneWrite, Recorder]:
    recorder = Recorder()
    return OneWrite(recorder, asyncio.get_running_loop()), recorder  # type: ignore[arg-type]


async def test_a_head_and_the_body_after_it_are_one_write() -> None:
    transport, recorder = one_write()
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert transport.get_write_buffer_size() > 0
    transport.write(b"{}")
    assert recorder.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    await asyncio.sleep(0)  # the loop's next turn: nothing more is sent
    assert len(recorder.writes) == 1


async def test_a_lone_write_goes_out_at_the_loops_next_turn() -> None:
    transport, recorder = one_write()
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert recorder.writes == []
    await asyncio.sleep(0)
    assert recorder.writes == [b"HTTP/1.1 200 OK\r\n\r\n"]
    transport.write(b"data: 1\n\n")  # a stream's later chunk waits no longer
    await asyncio.sleep(0)
    assert recorder.writes[-1] == b"data: 1\n\n"


async def test_close_sends_what_is_held_and_abort_drops_it() -> None:
    transport, recorder = one_write()
    transport.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    transport.close()
    assert recorder.writes == [b"HTTP/1.1 400 Bad Request\r\n\r\n"] and recorder.closed
    transport, recorder = one_write()
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.abort()
    await asyncio.sleep(0)
    assert recorder.writes == [] and recorder.aborted


async def test_a_whole_answer_goes_at_once_unless_other_requests_are_in_flight() -> None:
    pace = pace_of(asyncio.get_running_loop())
    transport, recorder = one_write()
    pace.in_flight = 1  # this answer's own request: nothing else would go in the turn
    transport.writelines((b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n", b"{}"))
    assert recorder.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    pace.in_flight = 2
    try:
        transport, recorder = one_write()
        transport.write(b"HTTP/1.1 200 OK\r\n")
        transport.writelines((b"content-length: 2\r\n\r\n", b"{}"))
        assert recorder.writes == []
        assert transport.get_write_buffer_size() > 0
        transport.write(b"next")  # whatever is written meanwhile goes after it, in one write
        assert recorder.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}next"]
        transport, recorder = one_write()
        transport.writelines((b"HTTP/1.1 204 No Content\r\n\r\n",))
        await asyncio.sleep(0)  # the loop's next turn
        assert recorder.writes == [b"HTTP/1.1 204 No Content\r\n\r\n"]
        await asyncio.sleep(0)
        assert len(recorder.writes) == 1
    finally:
        pace.in_flight = 0


async def test_answers_written_without_an_await_go_together_when_requests_arrive_together() -> None:
    # A cache hit is answered within its task's first step: no paid request is in flight
    # then, but the server counts every request whose head it has handed over.
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
        await send({"type": "http.response.body", "body": b"{}"})

    pace = pace_of(asyncio.get_running_loop())
    request = b"GET /x HTTP/1.1\r\nhost: a\r\n\r\n"
    alone, alone_writes = _connection(OneWriteHttpToolsProtocol, app)
    alone.data_received(request)
    assert pace.serving == 1
    await asyncio.sleep(0)  # its task runs: the only request, so its answer goes at once
    assert len(alone_writes.writes) == 1
    await asyncio.sleep(0)
    assert pace.serving == 0

    pair = [_connection(OneWriteHttpToolsProtocol, app) for _ in range(2)]
    for connection, _ in pair:
        connection.data_received(request)  # both heads arrive in one turn of the loop
    assert pace.serving == 2
    await asyncio.sleep(0)  # both tasks run and answer: the writes wait for the next turn
    assert [recorder.writes for _, recorder in pair] == [[], []]
    await asyncio.sleep(0)
    assert [len(recorder.writes) for _, recorder in pair] == [1, 1]
    assert pair[0][1].writes[0].endswith(b"\r\n\r\n{}")
    assert pace.serving == 0


async def test_the_rest_of_the_transport_is_the_real_ones() -> None:
    transport, _ = one_write()
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1234)
    assert not transport.is_closing()


async def test_a_request_hears_from_the_connection_that_its_client_left() -> None:
    scopes: list[Scope] = []
    answered = asyncio.Event()

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        scopes.append(scope)
        await answered.wait()

    config = uvicorn.Config(app, lifespan="off", **HTTP_OPTIONS)
    connections = []
    for _ in range(2):
        connection = OneWriteHttpToolsProtocol(config, ServerState(), {})
        connection.connection_made(Recorder())  # type: ignore[arg-type]
        connection.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nhost: a\r\n\r\n")
        connections.append(connection)
    await asyncio.sleep(0)  # the requests' tasks start
    watches: list[Watch] = [scope["extensions"][ON_DISCONNECT]["watch"] for scope in scopes]
    left: list[str] = []
    watches[0](lambda: left.append("watched"))
    watches[1](lambda: left.append("no longer watched"))
    watches[1](None)
    for connection in connections:
        connection.connection_lost(None)
    assert left == ["watched"]
    # Watching a connection already lost hears of it at once.
    watches[0](lambda: left.append("already gone"))
    assert left == ["watched", "already gone"]
    answered.set()
    await asyncio.sleep(0)


async def test_answers_over_one_connection_arrive_whole_and_in_order(
    proxy: RunningProxy,
) -> None:
    # Keep-alive: each answer's held head must go out with its own body, never another's.
    async with httpx.AsyncClient(base_url=proxy.url.removesuffix("/v1")) as http:
        for _ in range(3):
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            answer = await http.post("/v1/nope", json={})
            assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"


# --- the same bytes as uvicorn's own protocol --------------------------------------------------
# The proxy's request cycle (proxy/http1/_cycle.py) is its own, for speed; what it writes is
# pinned here against uvicorn's protocol, request by request.

JSON_HEADERS = [
    (b"content-type", b"application/json"),
    (b"x-request-id", b"abc"),
    (b"x-ratelimit-reset-requests", b"1ms"),
    (b"content-length", b"2"),
]
HEADS = [
    # (request line, status, answer headers, body)
    ("POST /v1/chat/completions HTTP/1.1", 200, JSON_HEADERS, b"{}"),
    ("GET /x HTTP/1.1", 200, [(b"content-type", b"text/event-stream")], b"data: 1\n\n"),
    ("GET /x HTTP/1.0", 200, [(b"content-length", b"2")], b"ok"),
    ("HEAD /x HTTP/1.1", 200, [(b"content-length", b"2")], b""),
    ("HEAD /x HTTP/1.1", 200, [], b""),
    ("DELETE /x HTTP/1.1", 204, [(b"x-a", b"tab\there, and obs-text \xe9")], b""),
    ("GET /x HTTP/1.1", 304, [], b""),
    ("GET /x HTTP/1.1", 413, [(b"content-length", b"2"), (b"connection", b"close")], b"{}"),
    ("GET /x HTTP/1.1", 200, [(b"Content-Length", b"2"), (b"X-Upper", b"a")], b"ok"),
    ("GET /x HTTP/1.1", 200, [(b"transfer-encoding", b"chunked")], b"ok"),
    ("GET /x HTTP/1.1", 200, [(b"connection", b"keep-alive"), (b"content-length", b"2")], b"ok"),
    # Heads that cannot be sent: not a byte of them is, and the connection closes.
    ("GET /x HTTP/1.1", 200, [(b"x-bad", b"a\r\nset-cookie: b"), (b"content-length", b"2")], b"ok"),
    ("GET /x HTTP/1.1", 200, [(b"x bad", b"a"), (b"content-length", b"2")], b"ok"),
    ("GET /x HTTP/1.1", 200, [(b"x-a\nx-b", b"c"), (b"content-length", b"2")], b"ok"),
    ("GET /x HTTP/1.1", 200, [(b"x-a:", b"c"), (b"content-length", b"2")], b"ok"),
    ("GET /x HTTP/1.1", 200, [(b"x-nul", b"a\x00")], b"ok"),
]


def _connection(protocol_class: type[Any], app: Any) -> tuple[Any, Recorder]:
    options = {**HTTP_OPTIONS, "http": protocol_class}
    config = uvicorn.Config(app, lifespan="off", log_level="critical", access_log=False, **options)
    config.load()
    recorder = Recorder()
    connection = protocol_class(config, ServerState(), {})
    connection.connection_made(recorder)
    return connection, recorder


async def _exchange(protocol_class: type[Any], app: Any, *parts: bytes) -> Recorder:
    """What a connection of `protocol_class` writes for `parts` arriving one after another."""
    connection, recorder = _connection(protocol_class, app)
    for part in parts:
        connection.data_received(part)
        for _ in range(5):  # the app's task runs, and a held write goes out
            await asyncio.sleep(0)
    return recorder


async def _alike(app: Any, *parts: bytes) -> bytes:
    """What the proxy's protocol writes, once asserted equal to what uvicorn's writes."""
    expected = await _exchange(HttpToolsProtocol, app, *parts)
    found = await _exchange(OneWriteHttpToolsProtocol, app, *parts)
    assert b"".join(found.writes) == b"".join(expected.writes)
    assert found.closed == expected.closed
    return b"".join(found.writes)


def answering(status: int, headers: Any, *body: bytes) -> Any:
    """An app that reads the whole request body, then answers with `body` in parts."""

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": status, "headers": list(headers)})
        for i, part in enumerate(body):
            await send({"type": "http.response.body", "body": part, "more_body": i < len(body) - 1})

    return app


async def test_an_answers_head_is_written_as_uvicorn_writes_it() -> None:
    for request, status, headers, body in HEADS:
        written = await _alike(
            answering(status, headers, body), f"{request}\r\nhost: a\r\n\r\n".encode()
        )
        assert written.startswith(b"HTTP/1.1 ") or not written, request
    assert written == b""  # the last: a NUL in a value


async def test_a_body_in_parts_and_a_streamed_answer_are_as_uvicorns() -> None:
    echoed: list[bytes] = []

    async def echo(scope: Scope, receive: Any, send: Any) -> None:
        parts = []
        while True:
            message = await receive()
            parts.append(message["body"])
            if not message["more_body"]:
                break
        echoed.append(b"|".join(parts))
        body = b"".join(parts)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": True})
        await send({"type": "http.response.body", "body": b"end", "more_body": False})

    head = b"POST /x HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n"
    written = await _alike(echo, head + b"5\r\nhello\r\n", b"6\r\n world\r\n", b"0\r\n\r\n")
    assert written.endswith(b"b\r\nhello world\r\n3\r\nend\r\n0\r\n\r\n")
    # Each part was handed over as it came, uvicorn's and the proxy's alike.
    assert echoed == [b"hello| world|", b"hello| world|"]


async def test_100_continue_pipelining_and_failing_apps_are_as_uvicorns() -> None:
    expecting = b"POST /x HTTP/1.1\r\nhost: a\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n"
    written = await _alike(answering(200, [(b"content-length", b"2")], b"ok"), expecting, b"hi")
    assert written.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")

    two = b"GET /a HTTP/1.1\r\nhost: a\r\n\r\nGET /b HTTP/1.1\r\nhost: a\r\n\r\n"
    paths: list[str] = []

    async def path(scope: Scope, receive: Any, send: Any) -> None:
        paths.append(scope["path"])
        await answering(200, [(b"content-length", b"2")], scope["path"].encode())(
            scope, receive, send
        )

    assert (await _alike(path, two)).count(b"HTTP/1.1 200 OK") == 2
    assert paths == ["/a", "/b", "/a", "/b"]

    async def fails(scope: Scope, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    async def silent(scope: Scope, receive: Any, send: Any) -> None:
        pass

    async def half(scope: Scope, receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"9")]}
        )
        await send({"type": "http.response.body", "body": b"only", "more_body": True})

    request = b"GET /x HTTP/1.1\r\nhost: a\r\n\r\n"
    for app in (fails, silent):
        assert (await _alike(app, request)).startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert (await _alike(half, request)).endswith(b"only")


async def test_receive_after_the_body_waits_for_the_client_to_leave() -> None:
    heard: list[str] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        heard.append((await receive())["type"])
        heard.append((await receive())["type"])  # returns once the client has gone

    connection, _ = _connection(OneWriteHttpToolsProtocol, app)
    connection.data_received(b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\nhi")
    for _ in range(5):
        await asyncio.sleep(0)
    assert heard == ["http.request"]
    connection.connection_lost(None)
    await asyncio.sleep(0)
    assert heard == ["http.request", "http.disconnect"]


async def test_a_known_length_head_goes_out_with_the_first_bytes_of_its_body() -> None:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
        await asyncio.sleep(0)  # the loop turns between the head and the body
        await send({"type": "http.response.body", "body": b"{}"})

    async def fails(scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
        raise RuntimeError("boom")

    request = b"GET /x HTTP/1.1\r\nhost: a\r\n\r\n"
    found = await _exchange(OneWriteHttpToolsProtocol, app, request)
    assert len(found.writes) == 1 and found.writes[0].endswith(b"\r\n\r\n{}")
    # An app that fails between the two leaves no half answer: the connection just closes.
    found = await _exchange(OneWriteHttpToolsProtocol, fails, request)
    assert found.writes == [] and found.closed


def test_uvicorn_options_the_protocol_does_not_take_are_refused() -> None:
    async def app(scope: Scope, receive: Any, send: Any) -> None:
        pass

    loop = asyncio.new_event_loop()
    try:
        for option in ({"limit_concurrency": 10}, {"reset_contextvars": True}):
            config = uvicorn.Config(app, lifespan="off", **HTTP_OPTIONS, **option)
            with pytest.raises(ValueError, match="limit_concurrency nor reset_contextvars"):
                OneWriteHttpToolsProtocol(config, ServerState(), {}, _loop=loop)
    finally:
        loop.close()
