"""One request and its answer on the proxy's HTTP/1.1 connections (`proxy.http1`): the ASGI
`receive` and `send` the app is given, and the task that runs the app.

uvicorn's own request cycle costs far more than the HTTP it handles: a trivial ASGI app behind
uvicorn's httptools protocol took 177,700 instructions a request, against 18,400 for the same
answer from a bare httptools protocol (callgrind). Part of it is its cycle: an `asyncio.Event`
per request, a cycle object built from eleven arguments, and two regular-expression searches
per answer header (24 for a governed answer). Here, with 134,600 for the same trivial app:

- `receive` hands over the body the parser has collected, and waits on a future only when
  nothing has come yet (or, once the body is given, until the client leaves or the answer
  ends);
- an answer's head is checked and joined in a few calls over all its headers at once: every
  name must be an RFC 9110 token and every value free of control characters but tab, as
  uvicorn asks, but by two `bytes.translate` calls instead of a search per header;
- the head of an answer of known length is written with the body's first bytes, in one system
  call; a streamed answer's head goes out at once (held by `_transport.OneWrite` only until the
  event loop's next turn);
- the rest is uvicorn's behaviour, pinned against it by tests/proxy/test_http1.py: a length or
  a chunked encoding for the body, HEAD and 204/304 without one, `connection: close` when the
  connection will not be kept, `100 Continue` when the client waits for it, a 500 for an app
  that fails before answering.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

if TYPE_CHECKING:
    from proxy.http1._protocol import OneWriteHttpToolsProtocol

log = logging.getLogger("uvicorn.error")

App = Callable[[Any, Any, Any], Awaitable[object]]

_TOKEN = bytes(c in b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz\n" for c in range(256))
"""`translate` table: 0 for a byte no lowercase header name may hold (RFC 9110 `tchar`; the
newline separates the names joined for the check)."""
_VALUE = bytes(c == 0x09 or 0x20 <= c != 0x7F for c in range(256))
"""`translate` table: 0 for a byte no header value may hold (a control character but tab)."""
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection"))
_LENGTH_ONLY = frozenset((b"content-length",))
_NO_BODY = frozenset((204, 304))
_DISCONNECT = {"type": "http.disconnect"}
_500_HEADERS = (
    (b"content-type", b"text/plain; charset=utf-8"),
    (b"content-length", b"21"),
    (b"connection", b"close"),
)


class RequestCycle:
    """One request on a connection, from its head to its answer's last byte."""

    __slots__ = (
        "_answered",
        "_delivered",
        "_held_head",
        "_waiter",
        "body",
        "chunked_encoding",
        "default_headers",
        "disconnected",
        "expected_content_length",
        "flow",
        "keep_alive",
        "more_body",
        "response_complete",
        "response_started",
        "scope",
        "transport",
        "waiting_for_100_continue",
    )

    def __init__(
        self,
        connection: OneWriteHttpToolsProtocol,
        scope: Any,
        *,
        keep_alive: bool,
        expect_100_continue: bool,
    ) -> None:
        self.scope = scope
        self.transport = connection.transport
        self.flow = connection.flow
        self.default_headers = connection.server_state.default_headers
        self._answered: Callable[[], None] | None = connection.on_response_complete
        """The connection's callback once the answer is whole (dropped when the app ends)."""
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect_100_continue
        self.body = b""
        """What the parser has collected of the body and `receive` has not handed over yet."""
        self.more_body = True
        """Until the request's last byte is in."""
        self._delivered = False
        """The whole body was handed over: `receive` now waits for the client to leave."""
        self._waiter: asyncio.Future[None] | None = None
        self._held_head: bytes | None = None
        """The head of an answer of known length, until its body is sent."""
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding: bool | None = None
        self.expected_content_length = 0

    def wake(self) -> None:
        """Something `receive` may wait for happened: body, its end, the client leaving."""
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def run(self, app: App) -> None:
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            log.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                self._fail()
            else:
                self.transport.close()
        else:
            if result is not None:
                log.error("ASGI callable should return None, but returned '%s'.", result)
                self.transport.close()
            elif not self.response_started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                self._fail()
            elif not self.response_complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self.transport.close()
        finally:
            self._answered = None

    def _fail(self) -> None:
        """Answer 500 for an app that failed before answering, and close."""
        if not self.transport.is_closing():
            self.response_started = self.response_complete = True
            self.transport.write(self._head(500, _500_HEADERS) + b"Internal Server Error")
            self.transport.close()

    async def receive(self) -> dict[str, Any]:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            if self._delivered or (self.more_body and not self.body):
                waiter = self._waiter = asyncio.get_running_loop().create_future()
                await waiter
        if self.disconnected or self.response_complete:
            return dict(_DISCONNECT)
        body, self.body = self.body, b""
        more_body = self.more_body
        self._delivered = not more_body
        return {"type": "http.request", "body": body, "more_body": more_body}

    async def send(self, message: Any) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got {kind!r}."
                )
            self.response_started = True
            self.waiting_for_100_continue = False
            head = self._head(message["status"], message.get("headers", ()))
            if self.chunked_encoding is False and self.scope["method"] != "HEAD":
                self._held_head = head  # written with the body's first bytes
            else:
                self.transport.write(head)
        elif not self.response_complete:
            if kind != "http.response.body":
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got {kind!r}.")
            self._body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(
                f"Unexpected ASGI message {kind!r} sent, after response already completed."
            )

    def _body(self, body: bytes, more_body: bool) -> None:
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0  # the head alone is the answer
        elif self.chunked_encoding:
            if body:
                self.transport.write(
                    b"%x\r\n%b\r\n%b" % (len(body), body, b"" if more_body else b"0\r\n\r\n")
                )
            elif not more_body:
                self.transport.write(b"0\r\n\r\n")
        else:
            left = self.expected_content_length - len(body)
            if left < 0:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length = left
            held = self._held_head
            if held is not None:
                self._held_head = None
                self.transport.writelines((held, body))  # one system call, the body not copied
            elif body:
                self.transport.write(body)
        if more_body:
            return
        if self.expected_content_length:
            raise RuntimeError("Response content shorter than Content-Length")
        self.response_complete = True
        self.wake()
        if not self.keep_alive:
            self.transport.close()
        answered = self._answered
        if answered is not None:
            answered()

    def _head(self, status: int, extra: Any) -> bytes:
        """The answer's status line and headers, its framing taken; RuntimeError for a header
        that cannot be sent."""
        headers = [*self.default_headers, *extra]
        names: tuple[bytes, ...] = ()
        values: tuple[bytes, ...] = ()
        if headers:
            names, values = zip(*headers, strict=True)
        joined = b"\n".join(names)
        lowered = joined.lower()
        if lowered != joined:
            names = tuple(lowered.split(b"\n"))
            headers = list(zip(names, values, strict=True))
        if names and (
            0 in lowered.translate(_TOKEN)
            or lowered.count(b"\n") != len(names) - 1  # a newline inside a name
            or not all(names)
            or 0 in b"".join(values).translate(_VALUE)
        ):
            raise RuntimeError(_invalid(names, values))
        closes = False
        framing = _FRAMING.intersection(names)
        if framing == _LENGTH_ONLY:
            self.expected_content_length = int(values[names.index(b"content-length")])
            self.chunked_encoding = False
        elif framing:
            for name, value in headers:
                if name in _FRAMING:
                    closes = self._framing(name, value) or closes
        if (
            self.chunked_encoding is None
            and status not in _NO_BODY
            and self.scope["method"] != "HEAD"
        ):
            # Neither a length nor an encoding: the body is sent in chunks.
            self.chunked_encoding = True
            headers.append((b"transfer-encoding", b"chunked"))
        if not self.keep_alive and not closes:
            headers.append((b"connection", b"close"))
        lines = b"\r\n".join(map(b": ".join, headers))
        return b"".join((STATUS_LINE[status], lines, b"\r\n\r\n" if lines else b"\r\n"))

    def _framing(self, name: bytes, value: bytes) -> bool:
        """Take a header that frames the body or ends the connection; whether it closes it."""
        if name == b"content-length":
            if self.chunked_encoding is None:  # a chunked encoding named earlier wins
                self.expected_content_length = int(value)
                self.chunked_encoding = False
        elif name == b"transfer-encoding":
            if value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
        elif b"close" in [token.strip().lower() for token in value.split(b",")]:
            self.keep_alive = False
            return True
        return False


def _invalid(names: tuple[bytes, ...], values: tuple[bytes, ...]) -> str:
    """Which header of an answer cannot be sent, for the error."""
    for name, value in zip(names, values, strict=True):
        if not name or b"\n" in name or 0 in name.translate(_TOKEN):
            return f"Invalid HTTP header name: {name!r}."
        if 0 in value.translate(_VALUE):
            return f"Invalid HTTP header value in {name.decode('latin-1')!r}."
    return "Invalid HTTP header."
