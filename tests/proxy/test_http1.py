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

from proxy import http1_cycle
from proxy.asgi import ON_DISCONNECT, Scope, Watch
from proxy.http1 import OneWriteHttpToolsProtocol, _OneWrite
from proxy.main import HTTP_OPTIONS
from tests.proxy.conftest import RunningProxy


class Recorder:
    """A transport that records what reaches it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

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

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1234) if name == "peername" else None


def one_write() -> tuple[_OneWrite, Recorder]:
    recorder = Recorder()
    return _OneWrite(recorder, asyncio.get_running_loop()), recorder  # type: ignore[arg-type]


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


# --- the answer's head ------------------------------------------------------------------------

JSON_HEADERS = [
    (b"content-type", b"application/json"),
    (b"x-request-id", b"abc"),
    (b"x-ratelimit-reset-requests", b"1ms"),
    (b"content-length", b"2"),
]
HEADS = [
    # (request line, status, answer headers, body, made by the proxy rather than uvicorn)
    ("POST /v1/chat/completions HTTP/1.1", 200, JSON_HEADERS, b"{}", True),
    ("GET /x HTTP/1.1", 200, [(b"content-type", b"text/event-stream")], b"data: 1\n\n", True),
    ("GET /x HTTP/1.0", 200, [(b"content-length", b"2")], b"ok", True),
    ("HEAD /x HTTP/1.1", 200, [(b"content-length", b"2")], b"", True),
    ("HEAD /x HTTP/1.1", 200, [], b"", False),  # no header at all (the server's date is off)
    ("DELETE /x HTTP/1.1", 204, [(b"x-a", b"tab\there, and obs-text \xe9")], b"", True),
    ("GET /x HTTP/1.1", 304, [(b"etag", b'"x"')], b"", True),
    ("GET /x HTTP/1.1", 413, [(b"content-length", b"2"), (b"connection", b"close")], b"{}", False),
    ("GET /x HTTP/1.1", 200, [(b"Content-Length", b"2"), (b"X-Upper", b"a")], b"ok", False),
    ("GET /x HTTP/1.1", 200, [(b"transfer-encoding", b"chunked")], b"ok", False),
    # Heads that cannot be sent: not a byte of them is.
    (
        "GET /x HTTP/1.1",
        200,
        [(b"x-bad", b"a\r\nset-cookie: b"), (b"content-length", b"2")],
        b"ok",
        False,
    ),
    ("GET /x HTTP/1.1", 200, [(b"x bad", b"a"), (b"content-length", b"2")], b"ok", False),
    ("GET /x HTTP/1.1", 200, [(b"x-nul", b"a\x00")], b"ok", False),
]


async def _answered(
    protocol_class: type[Any], request: str, status: int, headers: Any, body: bytes
) -> Recorder:
    """What a connection of `protocol_class` writes when its app answers `request` so."""

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": list(headers)})
        await send({"type": "http.response.body", "body": body})

    options = {**HTTP_OPTIONS, "http": protocol_class}
    config = uvicorn.Config(app, lifespan="off", log_level="critical", access_log=False, **options)
    config.load()
    recorder = Recorder()
    connection = protocol_class(config, ServerState(), {})
    connection.connection_made(recorder)
    connection.data_received(f"{request}\r\nhost: a\r\n\r\n".encode())
    for _ in range(3):  # the app's task runs, and a held write goes out
        await asyncio.sleep(0)
    return recorder


async def test_an_answers_head_is_written_as_uvicorn_writes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    to_uvicorn: list[str] = []

    async def uvicorn_send(cycle: Any, message: Any) -> None:
        to_uvicorn.append(message["type"])
        await uvicorn_send_itself(cycle, message)

    uvicorn_send_itself = http1_cycle._uvicorn_send
    monkeypatch.setattr(http1_cycle, "_uvicorn_send", uvicorn_send)
    for request, status, headers, body, made_here in HEADS:
        expected = await _answered(HttpToolsProtocol, request, status, headers, body)
        to_uvicorn.clear()
        found = await _answered(OneWriteHttpToolsProtocol, request, status, headers, body)
        assert b"".join(found.writes) == b"".join(expected.writes), request
        assert found.closed == expected.closed, request
        assert ("http.response.start" not in to_uvicorn) == made_here, (request, headers)
    assert not found.writes and found.closed  # the last: a NUL in a value
