"""Hostile clients against a real `vkgate proxy` process: each gets a clear 4xx or a bounded cost.

One proxy process (uvicorn, as `vkgate proxy` runs it) serves a key routed to fake OpenAI and
Anthropic providers on loopback, beside a real control plane. The clients here send enormous
heads and bodies, lie about their lengths, trickle their requests, send JSON no reader should
choke on, and open streams they never read. Every socket operation has a timeout, so the file
ends by itself whatever the proxy does; the proxy's resident memory is measured before and
after and must stay within a generous bound.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api import ADMIN
from tests.support.env import INTERNAL_SECRET
from tests.support.fake_anthropic import FakeAnthropic, serve_fake_anthropic
from tests.support.fake_openai import FakeOpenAI, serve_fake_openai
from tests.support.processes import Service, clean_env, free_port, running, sqlite_controlplane

MIB = 1024 * 1024
MAX_BODY_BYTES = 2 * MIB
"""The proxy's `VKGATE_MAX_BODY_BYTES`: the attacks below send several times as much."""
MAX_HEADER_BYTES = 32 * 1024
READ_TIMEOUT_S = 1.0
"""`VKGATE_CLIENT_READ_TIMEOUT_SECONDS`: a request must arrive whole within about this long."""
CUT_WITHIN_S = 10 * READ_TIMEOUT_S
"""How long a trickling client is given before the test concludes the proxy never cuts it."""
IO_TIMEOUT_S = 10.0
"""Every socket operation's bound: a proxy that hangs fails the test instead of holding it."""
RSS_GROWTH_BOUND = 50 * MIB
UPSTREAM_CHAT_MODEL = "gpt-4o-mini-2024-07-18"
UPSTREAM_EMBEDDING_MODEL = "text-embedding-3-small"
UPSTREAM_CLAUDE_MODEL = "claude-3-5-haiku-20241022"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}
MESSAGES = {"model": "claude", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
EMBED = {"model": "embed", "input": "hello"}


# -- the world: a control plane, fake providers, one proxy process ------------------------------


class Fakes:
    """The fake providers, served by an event loop of their own on a background thread, so the
    test's blocking sockets never stop them from answering the proxy."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        started: Future[tuple[FakeOpenAI, FakeAnthropic]] = Future()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        self.openai, self.anthropic = started.result(timeout=IO_TIMEOUT_S)

    def _run(self, started: Future[tuple[FakeOpenAI, FakeAnthropic]]) -> None:
        async def serve() -> None:
            self._stop = asyncio.Event()
            async with serve_fake_openai() as openai, serve_fake_anthropic() as anthropic:
                started.set_result((openai, anthropic))
                await self._stop.wait()

        try:
            self._loop.run_until_complete(serve())
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            raise
        finally:
            self._loop.close()

    def call(self, action: Callable[[], None]) -> None:
        """Run `action` on the fakes' loop (for their asyncio state), and wait for it."""
        done: Future[None] = Future()

        def run() -> None:
            action()
            done.set_result(None)

        self._loop.call_soon_threadsafe(run)
        done.result(timeout=IO_TIMEOUT_S)

    def close(self) -> None:
        stop = self._stop
        if stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout=IO_TIMEOUT_S)


@dataclass
class World:
    controlplane: Service
    proxy: Service
    fakes: Fakes
    org: str
    key: str
    single_key: str
    """A key limited to one request at once (`max_concurrency: 1`)."""
    rss_log: list[tuple[str, int]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.proxy.url.rsplit(":", 1)[1])

    @property
    def pid(self) -> int:
        return self.proxy.process.pid

    def rss(self, label: str) -> int:
        """The proxy process's resident memory now, noted under `label` for the summary."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        self.rss_log.append((label, kib * 1024))
        return kib * 1024

    def headers(self, key: str | None = None, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}", **extra}

    def post(
        self, path: str, body: bytes, *, key: str | None = None, **headers: str
    ) -> httpx.Response:
        merged = {"Content-Type": "application/json", **self.headers(key), **headers}
        return httpx.post(
            f"{self.proxy.url}{path}", content=body, headers=merged, timeout=IO_TIMEOUT_S
        )

    def assert_serves(self) -> None:
        """A normal request still gets its answer."""
        answer = self.post("/v1/chat/completions", json.dumps(CHAT).encode())
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]


def _admin(controlplane: Service, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{controlplane.url}{path}", json=body, headers=ADMIN, timeout=10)
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created


def _tenant(controlplane: Service, fakes: Fakes) -> tuple[str, str, str]:
    """An organization routing `chat`, `embed` and `claude` to the fakes: (org, key, single key)."""
    org = _admin(controlplane, "/api/admin/organizations", {"name": "hostile"})["id"]
    project = _admin(controlplane, "/api/admin/projects", {"organization_id": org, "name": "p"})[
        "id"
    ]
    openai = _admin(
        controlplane,
        "/api/admin/providers",
        {
            "organization_id": org,
            "name": "fake-openai",
            "kind": "openai_compatible",
            "base_url": fakes.openai.url,
            "api_key": fakes.openai.api_key,
        },
    )["id"]
    anthropic = _admin(
        controlplane,
        "/api/admin/providers",
        {
            "organization_id": org,
            "name": "fake-anthropic",
            "kind": "anthropic",
            "base_url": fakes.anthropic.url,
            "api_key": fakes.anthropic.api_key,
        },
    )["id"]
    policy = _admin(
        controlplane,
        "/api/admin/routing-policies",
        {
            "organization_id": org,
            "name": "default",
            "aliases": {
                "chat": [{"provider_id": openai, "model": UPSTREAM_CHAT_MODEL}],
                "embed": [{"provider_id": openai, "model": UPSTREAM_EMBEDDING_MODEL}],
                "claude": [{"provider_id": anthropic, "model": UPSTREAM_CLAUDE_MODEL}],
            },
        },
    )["id"]

    def key(name: str, **fields: Any) -> str:
        body = {"project_id": project, "name": name, "routing_policy_id": policy, **fields}
        return str(_admin(controlplane, "/api/admin/virtual-keys", body)["key"])

    return org, key("app"), key("single", limits={"max_concurrency": 1})


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    home = tmp_path_factory.mktemp("hostile")
    with ExitStack() as stack:
        fakes = Fakes()
        stack.callback(fakes.close)
        controlplane = stack.enter_context(sqlite_controlplane(home))
        org, key, single_key = _tenant(controlplane, fakes)
        port = free_port()
        env = clean_env(
            VKGATE_INTERNAL_SECRET=INTERNAL_SECRET,
            VKGATE_CONTROLPLANE_URL=controlplane.url,
            VKGATE_PROXY_ADDR=f"127.0.0.1:{port}",
            VKGATE_HOME=str(home / "proxy"),
            VKGATE_MAX_BODY_BYTES=str(MAX_BODY_BYTES),
            VKGATE_MAX_HEADER_BYTES=str(MAX_HEADER_BYTES),
            VKGATE_CLIENT_READ_TIMEOUT_SECONDS=str(READ_TIMEOUT_S),
            VKGATE_SPEND_FLUSH_INTERVAL_SECONDS="0.2",
            VKGATE_LOG_REQUESTS="false",
            VKGATE_LOG_LEVEL="WARNING",
        )
        proxy = stack.enter_context(
            running(["proxy"], env=env, port=port, log=home / "proxy.log", cwd=home)
        )
        world = World(controlplane, proxy, fakes, org, key, single_key)
        world.assert_serves()  # warm: the key is cached, the provider pool has a connection
        _load_the_token_estimator(world)
        start = world.rss("start")
        yield world
        end = world.rss("end")
        print("\nproxy RSS (VmRSS) through the hostile rounds:")
        for label, size in world.rss_log:
            print(f"  {label:<48} {size / MIB:8.1f} MiB")
        assert end - start < RSS_GROWTH_BOUND, "the hostile rounds left the proxy's memory grown"


def _load_the_token_estimator(world: World) -> None:
    """A stream left before its usage arrived: its record is estimated with the tokenizer, whose
    first estimates grow the proxy's memory once, which would otherwise count as growth."""
    body = json.dumps({**CHAT, "stream": True}).encode()
    world.fakes.openai.stream_events = 100_000
    try:
        with connection(world, rcvbuf=4096) as sock:
            extra = b"X-Request-ID: hostile-warm-up\r\n"
            sock.sendall(head("/v1/chat/completions", world.key, length=len(body), extra=extra))
            sock.sendall(body)
            assert sock.recv(64).startswith(b"HTTP/1.1 200")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        world.fakes.openai.stream_events = 0
    ledger_outcome(world, "hostile-warm-up")


@pytest.fixture(autouse=True)
def still_serving(world: World) -> Iterator[None]:
    """After every hostile round the proxy is alive and answers a normal request."""
    yield
    assert world.proxy.process.poll() is None, world.proxy.output()
    world.assert_serves()


# -- raw HTTP/1.1 on a socket, every step bounded -----------------------------------------------


@dataclass
class Reply:
    status: int | None
    """None: the connection was closed without an answer."""
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@contextmanager
def connection(world: World, *, rcvbuf: int | None = None) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(IO_TIMEOUT_S)
        sock.connect(("127.0.0.1", world.port))
        yield sock
    finally:
        sock.close()


def head(
    path: str, key: str, *, length: int | None = None, chunked: bool = False, extra: bytes = b""
) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: 127.0.0.1",
        f"Authorization: Bearer {key}",
        "Content-Type: application/json",
    ]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return "\r\n".join(lines).encode() + b"\r\n" + extra + b"\r\n"


def send_then_read(sock: socket.socket, data: bytes | Iterator[bytes]) -> Reply:
    """Send `data` until all is sent or the server answers (or closes), then read the answer."""
    pieces = iter([data]) if isinstance(data, bytes) else data
    pending = b""
    deadline = time.monotonic() + IO_TIMEOUT_S
    while True:
        if not pending:
            pending = next(pieces, b"")
            if not pending:
                break
        left = deadline - time.monotonic()
        assert left > 0, "the proxy neither took the request nor answered it"
        readable, writable, _ = select.select([sock], [sock], [], left)
        if readable:
            break  # an answer (or a close) before the whole request went out
        if writable:
            try:
                sent = sock.send(pending[: 256 * 1024])
            except (BrokenPipeError, ConnectionResetError):
                break
            pending = pending[sent:]
    return read_reply(sock)


def read_reply(sock: socket.socket) -> Reply:
    """One HTTP answer from `sock` (by Content-Length, chunks, or until close)."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return Reply(None, {}, data)
            data += chunk
    except ConnectionResetError:
        return Reply(None, {}, data)
    raw_head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
    status = int(status_line.split()[1])
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        wanted = int(headers["content-length"])
        with suppress(ConnectionResetError):
            while len(body) < wanted:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                body += chunk
    return Reply(status, headers, body)


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closes `sock` within `within_s`, whatever it sends before that."""
    deadline = time.monotonic() + within_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([sock], [], [], left)
            if readable and not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    return False


def assert_clear_refusal(reply: Reply, statuses: tuple[int, ...], *, closed_ok: bool) -> None:
    """A 4xx from `statuses` with the contract's error body, or (if allowed) a closed socket."""
    if reply.status is None:
        assert closed_ok, "the proxy closed the connection without an answer"
        return
    assert reply.status in statuses, (reply.status, reply.body[:300])
    error = reply.json()["error"]
    assert set(error) >= {"message", "type", "code", "param"}, error
    assert error["message"]


def openai_refusal(answer: httpx.Response, status: int, code: str, param: Any = ...) -> str:
    """The message of an OpenAI-format refusal, after checking its status, shape and code."""
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    body = answer.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) - {"attempts"} == {"message", "type", "code", "param"}, error
    assert error["code"] == code, error
    if param is not ...:
        assert error["param"] == param, error
    message: str = error["message"]
    assert message
    return message


def anthropic_refusal(answer: httpx.Response, status: int, code: str) -> str:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert body["type"] == "error", body
    assert body["error"]["code"] == code, body
    assert body["error"]["type"] == "invalid_request_error", body
    message: str = body["error"]["message"]
    return message


# -- enormous heads ------------------------------------------------------------------------------


def test_one_enormous_header_value_is_refused_431(world: World) -> None:
    before = world.rss("headers: before")
    with connection(world) as sock:
        big = b"X-Big: " + b"a" * (10 * MIB) + b"\r\n"
        reply = send_then_read(sock, head("/v1/chat/completions", world.key, length=2, extra=big))
    assert_clear_refusal(reply, (431, 400), closed_ok=True)
    assert reply.status == 431
    assert "header" in reply.json()["error"]["message"]
    after = world.rss("headers: after one 10 MiB header")
    assert after - before < RSS_GROWTH_BOUND


def test_very_many_headers_are_refused_431(world: World) -> None:
    many = b"".join(b"X-H-%d: v\r\n" % n for n in range(200_000))
    with connection(world) as sock:
        reply = send_then_read(sock, head("/v1/chat/completions", world.key, length=2, extra=many))
    assert_clear_refusal(reply, (431, 400), closed_ok=True)
    world.rss("headers: after 200,000 headers")


def test_an_endless_request_line_is_refused(world: World) -> None:
    with connection(world) as sock:
        reply = send_then_read(sock, b"POST /v1/chat/completions?" + b"q" * (4 * MIB))
    assert_clear_refusal(reply, (431, 414, 400), closed_ok=True)


def test_after_an_early_answer_the_unread_body_and_what_follows_stay_bounded(
    world: World,
) -> None:
    """A 401 is answered before the body is read: the connection must not then take an
    endless head (or body) past the head bound."""
    with connection(world) as sock:
        sock.sendall(head("/v1/chat/completions", "vk-not-a-key", length=1))
        reply = read_reply(sock)
        assert reply.status == 401
        endless = b"x" + b"POST /v1/chat/completions HTTP/1.1\r\n" + b"X-Big: " + b"a" * (4 * MIB)
        answer = send_then_read(sock, endless)
    assert_clear_refusal(answer, (431,), closed_ok=False)


def test_header_just_under_the_bound_is_served(world: World) -> None:
    # A long but reasonable header (a large cookie, a trace baggage) is not refused.
    answer = world.post(
        "/v1/chat/completions",
        json.dumps(CHAT).encode(),
        **{"X-Baggage": "b" * (MAX_HEADER_BYTES // 2)},
    )
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    "value",
    [b"Bearer vk-\xff\xfe\x80abc", b"Bearer \xc3\x28", b"\xff\xff\xff"],
    ids=["vk-prefix", "not-utf8", "no-scheme"],
)
def test_invalid_utf8_in_the_authorization_header_is_401(world: World, value: bytes) -> None:
    with connection(world) as sock:
        body = json.dumps(CHAT).encode()
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: "
            + value
            + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body
        )
        reply = send_then_read(sock, request)
    assert reply.status == 401, reply.body
    assert reply.json()["error"]["code"] == "invalid_api_key"


def test_invalid_utf8_in_other_headers_does_no_harm(world: World) -> None:
    with connection(world) as sock:
        body = json.dumps(CHAT).encode()
        extra = (
            b"X-Request-ID: \xff\xfe\r\nX-Vkgate-End-User: \xe2\x28\xa1\r\n"
            b"traceparent: \xff\r\nanthropic-version: \xff\r\n"
        )
        reply = send_then_read(
            sock, head("/v1/chat/completions", world.key, length=len(body), extra=extra) + body
        )
    assert reply.status == 200, reply.body
    assert reply.headers["x-request-id"].isascii()


def test_a_malformed_request_is_a_400_in_the_contracts_shape(world: World) -> None:
    with connection(world) as sock:
        reply = send_then_read(
            sock, b"POST /v1/chat/completions HTTP/1.1\r\nBad\x01Header: x\r\n\r\n"
        )
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert error["code"] == "invalid_request"
    assert "HTTP" in error["message"]


# -- enormous and lying bodies -------------------------------------------------------------------


def test_declared_body_over_the_limit_is_413_before_it_is_sent(world: World) -> None:
    with connection(world) as sock:
        reply = send_then_read(sock, head("/v1/chat/completions", world.key, length=12 * MIB))
        assert reply.status == 413, reply.body
        assert reply.json()["error"]["code"] == "payload_too_large"
        # The unread body is not waited for: the connection is closed behind the answer.
        assert closed_by_server(sock, IO_TIMEOUT_S)


def test_body_over_the_limit_sent_whole_is_413_with_bounded_memory(world: World) -> None:
    before = world.rss("bodies: before")
    body = b'{"model": "chat", "messages": [{"role": "user", "content": "' + b"x" * (12 * MIB)
    with connection(world) as sock:
        reply = send_then_read(
            sock, head("/v1/chat/completions", world.key, length=len(body)) + body
        )
    assert reply.status == 413, reply.body
    after = world.rss("bodies: after a 12 MiB body")
    assert after - before < RSS_GROWTH_BOUND


def _chunked(total: int, piece: int = 64 * 1024) -> Iterator[bytes]:
    yield b"%x\r\n" % 10 + b'{"model": ' + b"\r\n"
    sent = 0
    while sent < total:
        yield b"%x\r\n" % piece + b"x" * piece + b"\r\n"
        sent += piece
    yield b"0\r\n\r\n"


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/messages", "/v1/embeddings"], ids=lambda p: p[4:]
)
def test_chunked_body_over_the_limit_is_413(world: World, path: str) -> None:
    before = world.rss(f"chunked {path}: before")
    with connection(world) as sock:
        reply = send_then_read(
            sock, head(path, world.key, chunked=True) + b"".join(_chunked(12 * MIB))
        )
    assert reply.status == 413, reply.body
    body = reply.json()
    error = body["error"]
    assert error["code"] == "payload_too_large"
    if path == "/v1/messages":
        assert body["type"] == "error"
    after = world.rss(f"chunked {path}: after 12 MiB")
    assert after - before < RSS_GROWTH_BOUND


def test_content_length_shorter_than_the_body_is_400(world: World) -> None:
    body = json.dumps(CHAT).encode()
    with connection(world) as sock:
        reply = send_then_read(sock, head("/v1/chat/completions", world.key, length=10) + body)
    assert reply.status == 400, reply.body
    assert reply.json()["error"]["code"] == "invalid_request"


def test_content_length_longer_than_the_body_is_cut_and_recorded(world: World) -> None:
    body = json.dumps(CHAT).encode()
    request_id = "hostile-longer-length"
    extra = f"X-Request-ID: {request_id}\r\n".encode()
    with connection(world) as sock:
        sock.sendall(
            head("/v1/chat/completions", world.key, length=len(body) + 100, extra=extra) + body
        )
        assert closed_by_server(sock, CUT_WITHIN_S), "a body that never completes is waited for"
    record = ledger_outcome(world, request_id)
    assert record["kind"] == "fail" and record["status"] == 499, record


def test_invalid_chunked_framing_is_400(world: World) -> None:
    with connection(world) as sock:
        reply = send_then_read(
            sock, head("/v1/chat/completions", world.key, chunked=True) + b"zz\r\nnope\r\n"
        )
    assert_clear_refusal(reply, (400,), closed_ok=True)


# -- slow clients --------------------------------------------------------------------------------


def test_slow_loris_connections_are_cut_while_others_are_served(world: World) -> None:
    world.rss("slow clients: before")
    body = json.dumps(CHAT).encode()
    kinds: list[bytes] = [
        b"",  # connects and says nothing
        b"POST /v1/chat/compl",  # half a request line
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ",  # half a head
        head("/v1/chat/completions", world.key, length=len(body)) + body[:5],  # half a body
        head("/v1/chat/completions", world.key, chunked=True) + b'5\r\n{"mod',  # open chunks
    ]
    with ExitStack() as stack:
        socks = []
        for n in range(60):
            sock = stack.enter_context(connection(world))
            sock.sendall(kinds[n % len(kinds)])
            socks.append(sock)
        trickler = stack.enter_context(connection(world))
        # Served meanwhile: the held connections cost the others nothing.
        for _ in range(5):
            world.assert_serves()
        # One client sends its head a byte at a time, never finishing it.
        deadline = time.monotonic() + CUT_WITHIN_S
        cut = False
        trickle = iter(head("/v1/chat/completions", world.key, length=10) * 1000)
        while not cut and time.monotonic() < deadline:
            try:
                trickler.send(bytes([next(trickle)]))
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            cut = closed_by_server(trickler, 0.05)
        assert cut, "a head trickled a byte at a time is never cut"
        deadline = time.monotonic() + CUT_WITHIN_S
        still_open = [
            n
            for n, sock in enumerate(socks)
            if not closed_by_server(sock, max(deadline - time.monotonic(), 0.01))
        ]
        assert still_open == [], f"{len(still_open)} slow connections were never cut"
    world.rss("slow clients: after 61 held connections")


# -- bodies no JSON reader should choke on -------------------------------------------------------

MSG = b'"messages": [{"role": "user", "content": "hi"}]'


def _chat(*fields: bytes) -> bytes:
    return b"{" + b", ".join((b'"model": "chat"', MSG, *fields)) + b"}"


DEEP = b"[" * 100_000 + b"]" * 100_000
REFUSED_CHAT: list[tuple[str, bytes, str | None, str]] = [
    # (id, body, param, a word the message must contain)
    ("empty", b"", None, "JSON"),
    ("array", b"[]", None, "object"),
    ("string", b'"x"', None, "object"),
    ("null", b"null", None, "object"),
    ("not-json", b"model=chat", None, "JSON"),
    ("truncated", b'{"model": "chat", "messages": [', None, "JSON"),
    ("utf8-in-model", b'{"model": "ch\xffat", ' + MSG + b"}", None, "UTF-8"),
    (
        "utf8-in-content",
        b'{"model": "chat", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        None,
        "UTF-8",
    ),
    ("utf8-in-unknown-field", _chat(b'"x_custom": "\xc3\x28"'), None, "UTF-8"),
    ("utf8-after-body", _chat() + b"\xff", None, "JSON"),
    (
        "deep-in-messages",
        b'{"model": "chat", "messages": [{"role": "user", "content": ' + DEEP + b"}]}",
        None,
        "nest",
    ),
    ("deep-unknown-field", _chat(b'"x": ' + DEEP), None, "nest"),
    ("deep-unclosed", b'{"model": "chat", "x": ' + b"[" * 100_000, None, "nest"),
    ("model-missing", b"{" + MSG + b"}", "model", "model"),
    ("model-int", b'{"model": 5, ' + MSG + b"}", "model", "str"),
    ("model-empty", b'{"model": "", ' + MSG + b"}", "model", "length"),
    ("messages-empty", b'{"model": "chat", "messages": []}', "messages", "length"),
    ("messages-object", b'{"model": "chat", "messages": {}}', "messages", "array"),
    ("stream-string", _chat(b'"stream": "yes"'), "stream", "bool"),
    ("max-tokens-negative", _chat(b'"max_tokens": -1'), "max_tokens", ">= 1"),
    ("max-tokens-zero", _chat(b'"max_tokens": 0'), "max_tokens", ">= 1"),
    ("max-tokens-float", _chat(b'"max_tokens": 1.5'), "max_tokens", "int"),
    ("max-tokens-string", _chat(b'"max_tokens": "10"'), "max_tokens", "int"),
    ("max-tokens-huge", _chat(b'"max_tokens": 99999999999999999999'), "max_tokens", "<="),
    ("max-tokens-5000-digits", _chat(b'"max_tokens": ' + b"9" * 5000), "max_tokens", "range"),
    (
        "max-completion-tokens-huge",
        _chat(b'"max_completion_tokens": 1e300'),
        "max_completion_tokens",
        "int",
    ),
    ("n-negative", _chat(b'"n": -3'), "n", ">= 1"),
    ("n-absurd", _chat(b'"n": 1000000'), "n", "<= 128"),
    ("n-float", _chat(b'"n": 2.5'), "n", "int"),
    ("user-int", _chat(b'"user": 5'), "user", "str"),
    (
        "stream-options-string",
        _chat(b'"stream": true, "stream_options": "x"'),
        "stream_options",
        "object",
    ),
]


@pytest.mark.parametrize(
    ("body", "param", "word"),
    [case[1:] for case in REFUSED_CHAT],
    ids=[case[0] for case in REFUSED_CHAT],
)
def test_malformed_chat_body_is_a_clear_400(
    world: World, body: bytes, param: str | None, word: str
) -> None:
    calls = len(world.fakes.openai.received)
    answer = world.post("/v1/chat/completions", body)
    message = openai_refusal(answer, 400, "invalid_request", param)
    assert word.lower() in message.lower(), message
    assert len(world.fakes.openai.received) == calls, "a refused request reached the provider"


PASSED_CHAT: list[tuple[str, bytes]] = [
    ("unknown-fields", _chat(b'"x_custom": {"a": [1, 2, {"b": null}]}', b'"metadata": {"k": "v"}')),
    ("huge-number-elsewhere", _chat(b'"temperature": 1e400', b'"seed": ' + b"9" * 400)),
    ("max-tokens-at-int32", _chat(b'"max_tokens": 2147483647')),
    ("escaped-unicode", _chat(b'"x": "\\ud83d\\ude00 \\u0000"')),
    ("nested-200-deep", _chat(b'"x": ' + b"[" * 200 + b"]" * 200)),
]


@pytest.mark.parametrize("body", [c[1] for c in PASSED_CHAT], ids=[c[0] for c in PASSED_CHAT])
def test_odd_but_valid_chat_body_reaches_the_provider_untouched(world: World, body: bytes) -> None:
    answer = world.post("/v1/chat/completions", body)
    assert answer.status_code == 200, answer.text
    sent = world.fakes.openai.received[-1].body
    assert sent == body.replace(b'"chat"', json.dumps(UPSTREAM_CHAT_MODEL).encode(), 1)


@pytest.mark.parametrize("depth", [900, 950, 970, 980, 990, 1000])
def test_deep_body_with_duplicate_model_keys_is_never_a_500(world: World, depth: int) -> None:
    # Duplicate keys send the body down the slow path (decoded whole, deeper in the stack than
    # where its fields were read): nesting that passed there may be too deep here.
    body = _chat(b'"model": "chat"', b'"x": ' + b"[" * depth + b"]" * depth)
    answer = world.post("/v1/chat/completions", body)
    if answer.status_code != 200:
        message = openai_refusal(answer, 400, "invalid_request")
        assert "nested" in message, message


def test_duplicate_model_keys_mean_the_same_model_to_proxy_and_provider(world: World) -> None:
    answer = world.post(
        "/v1/chat/completions", b'{"model": "no-such-alias", "model": "chat", ' + MSG + b"}"
    )
    assert answer.status_code == 200, answer.text
    sent = world.fakes.openai.received[-1].body
    assert sent.count(b'"model"') == 1, sent
    assert json.loads(sent)["model"] == UPSTREAM_CHAT_MODEL

    refused = world.post(
        "/v1/chat/completions", b'{"model": "chat", "model": "no-such-alias", ' + MSG + b"}"
    )
    openai_refusal(refused, 404, "model_not_found", "model")


@pytest.mark.parametrize(
    ("content_type", "status"),
    [("text/plain", 200), ("application/x-www-form-urlencoded", 200), ("", 200)],
)
def test_wrong_content_type_with_a_json_body_is_served(
    world: World, content_type: str, status: int
) -> None:
    # OpenAI's own API reads the body as JSON whatever the Content-Type says.
    answer = world.post(
        "/v1/chat/completions", json.dumps(CHAT).encode(), **{"Content-Type": content_type}
    )
    assert answer.status_code == status, answer.text


REFUSED_MESSAGES: list[tuple[str, bytes, str]] = [
    ("empty", b"", "JSON"),
    ("array", b"[]", "object"),
    ("null", b"null", "object"),
    (
        "utf8",
        b'{"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": "\xff"}]}',
        "UTF-8",
    ),
    ("deep", b'{"model": "claude", "max_tokens": 5, "messages": [' + DEEP + b"]}", "nest"),
    ("max-tokens-missing", b'{"model": "claude", ' + MSG + b"}", "max_tokens"),
    ("max-tokens-negative", b'{"model": "claude", "max_tokens": -5, ' + MSG + b"}", ">= 1"),
    (
        "max-tokens-huge",
        b'{"model": "claude", "max_tokens": 1' + b"0" * 30 + b", " + MSG + b"}",
        "<=",
    ),
    ("max-tokens-float", b'{"model": "claude", "max_tokens": 2.5, ' + MSG + b"}", "int"),
]


@pytest.mark.parametrize(
    ("body", "word"), [c[1:] for c in REFUSED_MESSAGES], ids=[c[0] for c in REFUSED_MESSAGES]
)
def test_malformed_messages_body_is_a_clear_400_in_anthropics_shape(
    world: World, body: bytes, word: str
) -> None:
    calls = len(world.fakes.anthropic.received)
    message = anthropic_refusal(world.post("/v1/messages", body), 400, "invalid_request")
    assert word.lower() in message.lower(), message
    assert len(world.fakes.anthropic.received) == calls


REFUSED_EMBEDDINGS: list[tuple[str, bytes, str | None, str]] = [
    ("empty", b"", None, "JSON"),
    ("string", b'"x"', None, "object"),
    ("utf8", b'{"model": "embed", "input": "\xff"}', None, "UTF-8"),
    ("deep", b'{"model": "embed", "input": ' + DEEP + b"}", None, "nest"),
    ("input-missing", b'{"model": "embed"}', "input", "input"),
    ("input-empty", b'{"model": "embed", "input": []}', "input", "empty"),
    ("model-list", b'{"model": ["embed"], "input": "x"}', "model", "str"),
]


@pytest.mark.parametrize(
    ("body", "param", "word"),
    [c[1:] for c in REFUSED_EMBEDDINGS],
    ids=[c[0] for c in REFUSED_EMBEDDINGS],
)
def test_malformed_embeddings_body_is_a_clear_400(
    world: World, body: bytes, param: str | None, word: str
) -> None:
    calls = len(world.fakes.openai.received)
    message = openai_refusal(world.post("/v1/embeddings", body), 400, "invalid_request", param)
    assert word.lower() in message.lower(), message
    assert len(world.fakes.openai.received) == calls


def test_refused_requests_leak_no_concurrency_slot(world: World) -> None:
    # Refused before and after the limits are reserved: malformed, unknown model, too large.
    bodies = [
        b"[]",
        b"{" + MSG + b"}",
        b'{"model": "no-such-alias", ' + MSG + b"}",
        b'{"model": "chat", "x": ' + DEEP + b"}",
        b'{"model": "chat", "messages": [{"role": "user", "content": "\xff"}]}',
        _chat(b'"max_tokens": -1'),
    ]
    for _ in range(10):
        for body in bodies:
            answer = world.post("/v1/chat/completions", body, key=world.single_key)
            assert 400 <= answer.status_code < 500, answer.text
        with connection(world) as sock:
            reply = send_then_read(
                sock, head("/v1/chat/completions", world.single_key, length=12 * MIB)
            )
        assert reply.status == 413
    served = world.post("/v1/chat/completions", json.dumps(CHAT).encode(), key=world.single_key)
    assert served.status_code == 200, served.text


# -- streams the client never reads ------------------------------------------------------------


STREAM_EVENTS = 300_000
"""About 70 MB of SSE from the provider: far more than any buffer should hold."""


@pytest.mark.parametrize("route", ["chat", "messages"])
def test_stream_never_read_is_held_back_and_recorded_when_the_client_goes(
    world: World, route: str
) -> None:
    fake: FakeOpenAI | FakeAnthropic
    if route == "chat":
        fake, path, payload = world.fakes.openai, "/v1/chat/completions", {**CHAT, "stream": True}
    else:
        fake, path, payload = world.fakes.anthropic, "/v1/messages", {**MESSAGES, "stream": True}
    body = json.dumps(payload).encode()
    request_id = f"hostile-unread-{route}"
    before = world.rss(f"unread {route} stream: before")
    fake.stream_events = STREAM_EVENTS
    world.fakes.call(fake.stream_cancelled.clear)
    streamed_before = len(fake.streamed)
    try:
        with connection(world, rcvbuf=4096) as sock:
            sock.sendall(
                head(
                    path,
                    world.key,
                    length=len(body),
                    extra=f"X-Request-ID: {request_id}\r\n".encode(),
                )
                + body
            )
            sent = _stalled(lambda: len(fake.streamed) - streamed_before)
            assert 0 < sent < STREAM_EVENTS, f"the provider streamed {sent} events unread"
            during = world.rss(f"unread {route} stream: provider paused")
            assert during - before < RSS_GROWTH_BOUND
            # Gone without a word: a reset, as a killed client's kernel sends.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        fake.stream_events = 0
    world.rss(f"unread {route} stream: client gone")
    record = ledger_outcome(world, request_id)
    world.rss(f"unread {route} stream: recorded")
    assert record["kind"] == "confirm" and record["cancelled"] is True, record
    assert record["status"] == 200
    _eventually(lambda: fake.stream_cancelled.is_set(), "the provider's stream is never closed")
    world.rss(f"unread {route} stream: after")


def _stalled(count: Callable[[], int]) -> int:
    """`count()` once it stopped growing (back-pressure reached the provider), within bounds."""
    deadline = time.monotonic() + IO_TIMEOUT_S
    last, steady = -1, 0
    while steady < 5:
        assert time.monotonic() < deadline, "the provider was never held back"
        now = count()
        steady = steady + 1 if now == last and now > 0 else 0
        last = now
        time.sleep(0.1)  # another process's progress: sampled, never asserted on a duration
    return last


def _eventually(check: Callable[[], bool], failure: str) -> None:
    deadline = time.monotonic() + IO_TIMEOUT_S
    while not check():
        assert time.monotonic() < deadline, failure
        time.sleep(0.05)  # waiting on other processes, bounded by the deadline


def ledger_outcome(world: World, request_id: str) -> dict[str, Any]:
    """The outcome (confirm or fail) ledger row of `request_id`, once the spool shipped it."""
    found: list[dict[str, Any]] = []

    def shipped() -> bool:
        cursor = None
        while True:
            params = {"organization_id": world.org, "limit": "1000"}
            if cursor:
                params["cursor"] = cursor
            page = httpx.get(
                f"{world.controlplane.url}/api/spend/ledger",
                params=params,
                headers=ADMIN,
                timeout=IO_TIMEOUT_S,
            )
            assert page.status_code == 200, page.text
            data = page.json()
            found.extend(r for r in data["data"] if r["request_id"] == request_id)
            cursor = data["next_cursor"]
            if not cursor:
                return bool(found)

    _eventually(shipped, f"no ledger row for request {request_id}")
    assert len(found) == 1, found
    return found[0]
