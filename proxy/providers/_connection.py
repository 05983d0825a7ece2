"""One HTTP/1.1 connection to a provider, and the answer it carries (httptools parses it).

A request is written in one call (head and body together); its answer is a `Response` that the
gateway reads whole or chunk by chunk. The connection goes back to its client's pool the moment
an answer ends (the body is the `Response`'s by then), whether or not it was read yet; a
connection whose answer did not end (cut short, timed out, abandoned) is closed, never reused.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httptools

from proxy.pace import pace_of
from proxy.providers.base import ProviderTimeout, ProviderUnreachable

STALE_WINDOW_S = 1.0
"""How soon after a request went out on a kept-alive connection a close with no byte of an
answer is taken for the provider's idle close crossing the request (which it never read),
rather than for a provider that read it and then failed."""

HIGH_WATER = 256 * 1024
"""Unread bytes of a streamed answer above which the connection stops reading from the
provider, until the gateway has taken them."""


class Decoder:
    """A `gzip` or `deflate` body, decoded as it arrives.

    wbits 47 takes a gzip or a zlib header, found by looking; a `deflate` body without its
    zlib header (raw deflate, as some servers send it) is tried again as such; a gzip body of
    several members is decoded whole.
    """

    __slots__ = ("_fed", "_raw_allowed", "_z")

    def __init__(self, encoding: bytes) -> None:
        self._z = zlib.decompressobj(47)
        self._raw_allowed = encoding == b"deflate"
        self._fed = False

    def decompress(self, data: bytes) -> bytes:
        """Raises zlib.error on a body that does not decode."""
        if not data:
            return b""
        first, self._fed = not self._fed, True
        try:
            out = self._z.decompress(data)
        except zlib.error:
            if not (first and self._raw_allowed):
                raise
            self._z = zlib.decompressobj(-15)
            out = self._z.decompress(data)
        z = self._z
        parts = [out]
        while z.eof and z.unused_data:
            rest = z.unused_data
            z = self._z = zlib.decompressobj(47)
            parts.append(z.decompress(rest))
        return out if len(parts) == 1 else b"".join(parts)

    def finish(self) -> bytes:
        """What is left once the body ended; zlib.error if it ended inside the stream."""
        if not self._fed:
            return b""  # an empty body: nothing was compressed
        rest = self._z.flush()
        if not self._z.eof:
            raise zlib.error("the compressed answer was cut short")
        return rest


_ENCODINGS = frozenset((b"gzip", b"x-gzip", b"deflate"))


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float
    """To open a connection (TCP and TLS)."""
    read_s: float
    """Between two arrivals of an answer's bytes, from the request written on."""
    total_s: float
    """From the call to the last byte of its answer."""


def _again(error: Exception) -> Exception:
    """The answer's failure, raised afresh for each reader: the stored one then holds no
    traceback, whose frames would hold the answer."""
    return type(error)(*error.args)


class StaleConnection(ProviderUnreachable):
    """A kept-alive connection was closed by the provider before it read the request."""


class Connection(asyncio.Protocol):
    """A kept-alive connection to one origin (through one proxy, or none); carries one request at
    a time."""

    __slots__ = (
        "_loop",
        "_pace",
        "_release",
        "aborted",
        "clean",
        "idle_since",
        "lost",
        "origin",
        "response",
        "served",
        "transport",
    )

    def __init__(
        self,
        origin: tuple[str, str, int, str],
        loop: asyncio.AbstractEventLoop,
        release: Callable[[Connection], None],
    ):
        self.origin = origin
        self._loop = loop
        self._pace = pace_of(loop)
        self._release = release
        self.transport: asyncio.Transport | None = None
        self.response: Response | None = None
        self.lost = False
        self.aborted = False
        """Closed by this side: what the connection carried did not end by the provider's
        close."""
        self.served = 0
        """Answers it carried whole: a connection that carried one was kept alive."""
        self.clean = True
        """Nothing arrived that no request asked for: the connection may carry another."""
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None or response.complete:
            # Bytes no request asked for: this connection cannot be trusted with another.
            self.clean = False
            self.abort()
            return
        response.arrived(data)

    def eof_received(self) -> bool:
        return False  # the transport closes; `connection_lost` ends what was in flight

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        response = self.response
        if response is not None:
            self.response = None
            if not response.complete:
                response.cut(exc)
        self._release(self)

    def _send(self, data: tuple[bytes, bytes]) -> None:
        transport = self.transport
        # Closed meanwhile: `connection_lost` has ended the request already.
        if transport is not None and not transport.is_closing():
            transport.writelines(data)

    def usable(self) -> bool:
        transport = self.transport
        return self.clean and not self.lost and transport is not None and not transport.is_closing()

    async def request(
        self, data: tuple[bytes, bytes], deadline: float, timeouts: Timeouts
    ) -> Response:
        """Write one request (head, body) and return its answer once its head is in; raises
        `StaleConnection` when a kept-alive connection closed before a byte of it arrived."""
        response = self.response = Response(self, self._loop, deadline, timeouts)
        assert self.transport is not None
        if self._pace.busy:
            # Sent with the loop's other writes at its next turn (see proxy/pace.py).
            self._loop.call_soon(self._send, data)
        else:
            self.transport.writelines(data)
        try:
            await response.head
        except BaseException:
            response.close()
            raise
        return response

    def answered(self) -> None:
        """The current answer ended: the connection may carry another."""
        self.served += 1
        self._release(self)

    def abort(self) -> None:
        self.clean = False
        self.aborted = True
        if self.transport is not None:
            self.transport.abort()


class Response:
    """A provider's answer (`proxy.providers.base.Reply`): status and headers once `head` is
    done, the body read whole (`read`) or as it comes (`chunks`)."""

    __slots__ = (
        "_chunks",
        "_connection",
        "_deadline",
        "_decoder",
        "_encoding",
        "_error",
        "_framed",
        "_informational",
        "_last_read",
        "_loop",
        "_parser",
        "_paused",
        "_received",
        "_streaming",
        "_timeouts",
        "_unread",
        "_waiter",
        "complete",
        "content_type",
        "error_type",
        "head",
        "input_token_count",
        "retry_after",
        "status",
    )

    def __init__(
        self,
        connection: Connection,
        loop: asyncio.AbstractEventLoop,
        deadline: float,
        timeouts: Timeouts,
    ) -> None:
        self._loop = loop
        self._connection = connection
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._timeouts = timeouts
        self._deadline = deadline
        self._last_read = loop.time()
        self.head: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.content_type = b"application/json"
        self.retry_after: bytes | None = None
        self.error_type: bytes | None = None
        """AWS's `x-amzn-ErrorType`: what a Bedrock error is, which its status alone does not
        tell (a quota exceeded is a 400, as a validation error is)."""
        self.input_token_count: bytes | None = None
        """Bedrock's `X-Amzn-Bedrock-Input-Token-Count`: the only usage some InvokeModel
        answers (Cohere's embeddings) give."""
        self.complete = False
        self._error: Exception | None = None
        self._chunks: list[bytes] = []
        self._unread = 0
        self._waiter: asyncio.Future[None] | None = None
        self._streaming = False
        self._paused = False
        self._encoding: bytes | None = None
        self._decoder: Decoder | None = None
        self._received = False
        """A byte of this answer arrived."""
        self._framed = False
        """The answer says where its body ends (a length, or chunks); else the close ends it."""
        self._informational = False

    # -- bytes in, from the connection ----------------------------------------------------------

    def arrived(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:
            return  # ended or failed: what follows is no part of this answer
        self._last_read = self._loop.time()
        self._received = True
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.fail(ProviderUnreachable("the provider switched protocols"))
        except httptools.HttpParserError as exc:
            self.fail(ProviderUnreachable(f"malformed HTTP answer from the provider: {exc}"))

    def cut(self, exc: Exception | None) -> None:
        """The connection closed before this answer ended."""
        if self._error is not None:
            return
        connection = self._connection
        if exc is None and not connection.aborted and self.head.done() and not self._framed:
            self._ended()  # a body that runs until the provider closes, whole
            return
        detail = f": {exc}" if exc is not None else ""
        if self.head.done():
            self.fail(ProviderUnreachable(f"the provider's answer was cut short{detail}"))
        elif (
            connection.served
            and not self._received
            and not connection.aborted
            and self._loop.time() - self._last_read < STALE_WINDOW_S
        ):
            # Kept alive, then closed by the provider as this request went out (its idle
            # time ran out): it never read the request, which can go on a new connection.
            self.fail(StaleConnection(f"the provider closed a kept-alive connection{detail}"))
        else:
            self.fail(
                ProviderUnreachable(f"the provider closed the connection before answering{detail}")
            )

    # -- httptools' callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            # A second answer to one request: whatever it is, the connection is not reused.
            self._connection.clean = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._parser is None:
            return  # a second answer, after this one ended: not this answer's header
        name = name.lower()
        if name == b"content-type":
            self.content_type = value
        elif name == b"retry-after":
            self.retry_after = value
        elif name == b"content-length":
            self._framed = True
        elif name == b"transfer-encoding":
            self._framed = self._framed or b"chunked" in value.lower()
        elif name == b"content-encoding":
            self._encoding = value.strip().lower()
        elif name == b"x-amzn-errortype":
            self.error_type = value
        elif name == b"x-amzn-bedrock-input-token-count":
            self.input_token_count = value

    def on_headers_complete(self) -> None:
        parser = self._parser
        if parser is None:
            return
        status = parser.get_status_code()
        if status < 200:
            # 100 Continue and the like: the answer is still to come.
            self._informational = True
            self.content_type, self.retry_after, self._encoding = b"application/json", None, None
            self.error_type = self.input_token_count = None
            self._framed = False
            return
        self.status = status
        if status in (204, 304):
            self._framed = True
        encoding = self._encoding
        if encoding is not None and encoding != b"identity":
            if encoding not in _ENCODINGS:
                self.fail(ProviderUnreachable(f"unsupported content-encoding {encoding!r}"))
                return
            self._decoder = Decoder(encoding)
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self._parser is None:
            return  # ended or failed: not this answer's body
        decoder = self._decoder
        if decoder is not None:
            try:
                body = decoder.decompress(body)
            except zlib.error as exc:
                self.fail(ProviderUnreachable(f"the provider's answer does not decompress: {exc}"))
                return
            if not body:
                return
        self._chunks.append(body)
        self._unread += len(body)
        if self._streaming and not self._paused and self._unread > HIGH_WATER:
            self._paused = True
            transport = self._connection.transport
            if transport is not None:
                transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        parser = self._parser
        if self._error is None and not self.complete and parser is not None:
            keep_alive = parser.should_keep_alive()
            self._ended()
            connection = self._connection
            if self._paused:
                # The body is this answer's now; the connection reads again, for the next.
                self._resume()
            if self.complete and keep_alive and connection.clean:
                connection.answered()
            else:
                connection.abort()

    def _ended(self) -> None:
        decoder = self._decoder
        if decoder is not None:
            try:
                rest = decoder.finish()
            except zlib.error as exc:
                self.fail(ProviderUnreachable(f"the provider's answer does not decompress: {exc}"))
                return
            if rest:
                self._chunks.append(rest)
        self.complete = True
        # The parser refers back to this answer: let go of it, and no cycle outlives the call.
        self._parser = None
        if not self.head.done():
            self.head.set_result(None)
        self._wake()

    # -- failure and time -------------------------------------------------------------------------

    def fail(self, error: Exception) -> None:
        """End this answer with `error`: whoever waits for it hears it; the connection closes."""
        if self.complete or self._error is not None:
            return
        self._error = error
        self._parser = None
        if not self.head.done():
            self.head.set_exception(error)
            # Retrieved here, so an answer no one awaits logs no "exception never retrieved".
            self.head.exception()
        self._wake()
        self._connection.abort()

    @property
    def waiting(self) -> bool:
        """Whether this answer has yet to end (so its timeouts still apply)."""
        return not self.complete and self._error is None

    def check_time(self, now: float) -> None:
        """Fail this answer if one of its timeouts has run out by `now` (the client's ticker
        calls it while the answer is `waiting`)."""
        timeouts = self._timeouts
        if now >= self._deadline:
            self.fail(ProviderTimeout(f"no whole answer within {timeouts.total_s:g} s"))
        elif self._paused:
            # The gateway is behind, not the provider: its clock starts again once reading does.
            self._last_read = now
        elif now - self._last_read >= timeouts.read_s:
            self.fail(ProviderTimeout(f"no data from the provider for {timeouts.read_s:g} s"))

    # -- the gateway's side ---------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    async def read(self) -> bytes:
        """The whole body."""
        if self._paused:
            self._resume()
        while not self.complete:
            if self._error is not None:
                raise _again(self._error)
            await self._wait()
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._unread = 0
        return data

    @property
    def drained(self) -> bool:
        return self.complete and not self._chunks

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives: what is there at each turn, in one piece."""
        self._streaming = True
        chunks = self._chunks
        while True:
            if chunks:
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self._unread = 0
                if self._paused:
                    self._resume()
                yield data
                continue
            if self._error is not None:
                raise _again(self._error)
            if self.complete:
                return
            await self._wait()

    def _resume(self) -> None:
        self._paused = False
        transport = self._connection.transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    def close(self) -> None:
        """Done with this answer: a connection still carrying it is closed."""
        if not self.complete:
            self._parser = None
            if self._error is None:
                self._error = ProviderUnreachable("the answer was abandoned")
            self._wake()  # a reader waiting for more hears that there is none
            self._connection.abort()
