"""The process's one pooled HTTP/1.1 client for provider calls.

The gateway makes one kind of call, many times a second: a POST of a body it already holds to
a handful of origins, answered by JSON or an event stream. A general client spends most of its
time on what that call never needs (URL objects, cookie jars, header multidicts, tracing
hooks, a task per timeout). Measured in one process against the benchmark's nginx upstream,
one call at a time: aiohttp 3.14 takes 169-201 µs of CPU a call, a bare httptools exchange on a
kept-alive connection 16-21 µs. This client keeps that exchange and adds what a gateway needs
around it: kept-alive connections per origin (reused last-in first-out, closed after
`keepalive_s` idle), TLS, and the contract's three provider timeouts; every failure is one of
`ProviderUnreachable` or `ProviderTimeout`.

Unlike aiohttp it keeps no DNS cache (a name is resolved when a connection opens, and
connections are kept alive) and no cap of its own on connections: a request holds at most one
at a time, so `VKGATE_MAX_IN_FLIGHT` bounds them.

The read and total timeouts are checked by one ticker per client while answers are in flight,
every quarter of the shorter of the two (at most every second), rather than by a timer per
call (3 µs a call to set and cancel): a timeout fires up to that much late.

Through an HTTP proxy (`proxy.egress`), an http:// call is sent to the proxy in absolute form
with the proxy's credentials, and an https:// call goes through a CONNECT tunnel
(`_tunnel`); either way connections are pooled per origin and per proxy, and what the egress
decides for a URL is worked out once, with the rest of the URL's request line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Mapping
from urllib.parse import quote, urlsplit

from proxy.egress import Egress, ProxyServer
from proxy.providers._connection import Connection, Response, StaleConnection, Timeouts
from proxy.providers._tunnel import open_tunnel, refusal
from proxy.providers.base import ProviderTimeout, ProviderUnreachable
from vkgate.logs import event

log = logging.getLogger("vkgate.proxy.providers")

Origin = tuple[str, str, int, str]
"""Scheme, host, port and the proxy's address ("" for none): connections with one origin are
interchangeable."""

_DIRECT = Egress()

_MAX_TARGETS = 4096
"""URLs whose request line is remembered (a few per credential)."""

_PATH_SAFE = "/%!$&'()*+,;=:@~-._?"

_FRAMING = frozenset(
    (
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "accept-encoding",
        "proxy-authorization",
        "proxy-connection",
    )
)
"""Headers that say how the request is framed, carried and encoded: the client's to write, so
a credential's extra headers cannot set them (a second length or chunking would have the
provider read the connection's next request out of this one's body; an encoding the client
cannot decode would make every answer unreadable; the proxy's credentials are the egress's)."""


class _Target:
    __slots__ = ("forwarder", "host_line", "origin", "proxy", "request_line")

    def __init__(
        self, origin: Origin, request_line: bytes, host_line: bytes, proxy: ProxyServer | None
    ) -> None:
        self.origin = origin
        self.request_line = request_line
        self.host_line = host_line
        self.proxy = proxy
        self.forwarder = proxy if origin[0] == "http" else None
        """The proxy that answers this URL's requests itself when it refuses them (an http://
        call it forwards); inside a tunnel, only the provider answers."""


def _target(url: str, egress: Egress, method: str = "POST") -> _Target:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ProviderUnreachable(f"the provider's URL cannot be read: {exc}") from None
    scheme, host = parts.scheme.lower(), parts.hostname
    if scheme not in ("http", "https") or not host:
        raise ProviderUnreachable(
            "the provider's URL is not an http:// or https:// URL with a host"
        )
    if parts.username is not None or parts.password is not None:
        # The control plane refuses such a base_url; a credential goes in a header.
        raise ProviderUnreachable("the provider's URL holds a user name or password")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise ProviderUnreachable("the provider's host name cannot be encoded") from None
    default_port = 443 if scheme == "https" else 80
    port = port or default_port
    named = f"[{host}]" if ":" in host else host
    if port != default_port:
        named = f"{named}:{port}"
    path = quote(parts.path or "/", safe=_PATH_SAFE)
    if parts.query:
        path += "?" + quote(parts.query, safe=_PATH_SAFE)
    proxy = egress.proxy_for(scheme, host, port)
    request_line = f"{method} {path} HTTP/1.1\r\n"
    if proxy is not None and scheme == "http":
        # Forwarded by the proxy: the request names its whole URL, and carries the proxy's
        # credentials (a tunnelled https call gave them to CONNECT instead).
        request_line = f"{method} http://{named}{path} HTTP/1.1\r\n"
        if proxy.authorization is not None:
            request_line += f"proxy-authorization: {proxy.authorization}\r\n"
    return _Target(
        (scheme, host, port, proxy.address if proxy is not None else ""),
        request_line.encode("ascii"),
        f"host: {named}\r\n".encode("ascii"),
        proxy,
    )


class HttpClient:
    """POSTs to providers over kept-alive HTTP/1.1 connections; `close` when done."""

    def __init__(
        self,
        timeouts: Timeouts,
        *,
        user_agent: str,
        keepalive_s: float = 60.0,
        tls: ssl.SSLContext | None = None,
        egress: Egress = _DIRECT,
    ) -> None:
        self._timeouts = timeouts
        self._user_agent = user_agent
        self._agent_line = f"user-agent: {user_agent}\r\n"
        # As aiohttp sent them before this client: compressed answers are decoded here.
        self._accept_lines = "accept: */*\r\naccept-encoding: gzip, deflate\r\n"
        self._keepalive_s = keepalive_s
        self._tls = tls
        self._egress = egress
        self._targets: dict[str, _Target] = {}
        self._idle: dict[Origin, list[Connection]] = {}
        self._open: set[Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._ticker: asyncio.TimerHandle | None = None
        self._tick_s = max(0.005, min(1.0, min(timeouts.read_s, timeouts.total_s) / 4))
        self._closed = False

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> Response:
        """POST `body` to `url`; the answer once its status and headers are in (its body is
        read from it)."""
        if self._closed:
            raise ProviderUnreachable("the proxy is shutting down")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeouts.total_s
        target = self._targets.get(url)
        if target is None:
            target = self._remember(url)
        head = self._head(target, headers, len(body))
        connection = self._reuse(target.origin)
        response = None
        if connection is not None:
            self._watch_time(loop)
            try:
                response = await connection.request((head, body), deadline, self._timeouts)
            except StaleConnection:
                # The provider never read it: once more, on a new connection.
                if self._closed:
                    raise
                _, host, port, _ = target.origin
                event(log, "provider_connection_replaced", address=f"{host}:{port}")
        if response is None:
            connection = await self._connect(target)
            self._watch_time(loop)
            response = await connection.request((head, body), deadline, self._timeouts)
        if response.status == 407 and target.forwarder is not None:
            # The forwarding proxy's own answer, not the provider's: no provider saw the call.
            response.close()
            _, host, port, _ = target.origin
            raise refusal(target.forwarder, host, port, 407, "Proxy Authentication Required")
        return response

    async def request(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes = b""
    ) -> Response:
        """Any other call (`GET` or `DELETE` of an object a provider stores): rare, so its
        request line is made for it rather than remembered, and `post` stays as it was."""
        if self._closed:
            raise ProviderUnreachable("the proxy is shutting down")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeouts.total_s
        target = _target(url, self._egress, method)
        head = self._head(target, headers, len(body))
        connection = self._reuse(target.origin)
        response = None
        if connection is not None:
            self._watch_time(loop)
            with contextlib.suppress(StaleConnection):
                response = await connection.request((head, body), deadline, self._timeouts)
            if response is None and self._closed:
                raise ProviderUnreachable("the proxy is shutting down")
        if response is None:
            connection = await self._connect(target)
            self._watch_time(loop)
            response = await connection.request((head, body), deadline, self._timeouts)
        if response.status == 407 and target.forwarder is not None:
            response.close()
            _, host, port, _ = target.origin
            raise refusal(target.forwarder, host, port, 407, "Proxy Authentication Required")
        return response

    def _watch_time(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have the ticker running: called right before an answer is awaited, with no turn of
        the loop between, so the ticker cannot stop while that answer is in flight."""
        if self._ticker is None:
            self._ticker = loop.call_later(self._tick_s, self._tick)

    def _tick(self) -> None:
        """Time out the answers in flight whose provider is too slow; again while any is."""
        loop = self._loop
        assert loop is not None
        self._ticker = None
        now = loop.time()
        waiting = False
        try:
            for connection in tuple(self._open):
                response = connection.response
                if response is not None and response.waiting:
                    waiting = True
                    response.check_time(now)
        finally:
            # Armed again whatever happened above, or a silent provider would go unnoticed.
            if waiting and not self._closed:
                self._ticker = loop.call_later(self._tick_s, self._tick)

    def _remember(self, url: str) -> _Target:
        target = _target(url, self._egress)
        if len(self._targets) >= _MAX_TARGETS:
            self._targets.clear()
        self._targets[url] = target
        return target

    def _head(self, target: _Target, headers: Mapping[str, str], length: int) -> bytes:
        lines = []
        agent, host, accept = True, True, True
        for name, value in headers.items():
            lowered = name.lower()
            if lowered in _FRAMING:
                continue
            if lowered == "user-agent":
                agent = False
            elif lowered == "host":
                host = False
            elif lowered == "accept":
                accept = False
            lines.append(f"{name}: {value}\r\n")
        text = "".join(lines)
        count = len(lines)
        if text.count("\n") != count or text.count("\r") != count:
            # A line break inside a name or a value would end the head early: the rest of it
            # would be read as headers the request never meant to send.
            raise ProviderUnreachable("a header for the provider holds a line break")
        if agent:
            text += self._agent_line
        text += self._accept_lines if accept else "accept-encoding: gzip, deflate\r\n"
        text += f"content-length: {length}\r\n\r\n"
        if host:
            return target.request_line + target.host_line + text.encode()
        return target.request_line + text.encode()

    def _reuse(self, origin: Origin) -> Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if connection.usable():
                return connection
            connection.abort()
        return None

    async def _connect(self, target: _Target) -> Connection:
        origin, proxy = target.origin, target.proxy
        scheme, host, port, _ = origin
        loop = self._loop
        assert loop is not None
        tls = self._tls_context() if scheme == "https" else None

        def make() -> Connection:
            return Connection(origin, loop, self._settle)

        try:
            async with asyncio.timeout(self._timeouts.connect_s):
                if proxy is None:
                    _, connection = await loop.create_connection(
                        make, host, port, ssl=tls, server_hostname=host if tls is not None else None
                    )
                elif tls is None:
                    _, connection = await loop.create_connection(make, proxy.host, proxy.port)
                else:
                    connection = await open_tunnel(
                        loop, proxy, host, port, tls, make, self._user_agent
                    )
        except TimeoutError:
            raise ProviderTimeout(
                f"no connection to {host}:{port}{_via(proxy)} within {self._timeouts.connect_s:g} s"
            ) from None
        except (OSError, UnicodeError) as exc:
            # UnicodeError: a host name the resolver cannot encode (an empty or long label).
            raise ProviderUnreachable(
                f"cannot connect to {host}:{port}{_via(proxy)}: {exc}"
            ) from None
        if self._closed:
            connection.abort()
            raise ProviderUnreachable("the proxy is shutting down")
        self._open.add(connection)
        return connection

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            # The system's trust store, verified hostnames: made on the first https call, as
            # loading the store takes milliseconds.
            self._tls = ssl.create_default_context()
        return self._tls

    def _settle(self, connection: Connection) -> None:
        """A connection's answer ended (it may idle) or the connection closed (forgotten)."""
        if connection.lost:
            self._open.discard(connection)
            idle = self._idle.get(connection.origin)
            if idle and connection in idle:
                idle.remove(connection)
            return
        loop = self._loop
        if self._closed or loop is None or not connection.usable():
            connection.abort()
            return
        connection.response = None
        connection.idle_since = loop.time()
        idle = self._idle.get(connection.origin)
        if idle is None:
            idle = self._idle[connection.origin] = []
        idle.append(connection)
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._keepalive_s, self._sweep)

    def _sweep(self) -> None:
        """Close the connections idle for `keepalive_s` or more."""
        loop = self._loop
        assert loop is not None
        self._sweeper = None
        cutoff = loop.time() - self._keepalive_s
        for origin, idle in list(self._idle.items()):
            stale = [c for c in idle if c.idle_since <= cutoff]
            if stale:
                idle[:] = [c for c in idle if c.idle_since > cutoff]
                for connection in stale:
                    connection.abort()
            if not idle:
                del self._idle[origin]
        if self._idle:
            oldest = min(c.idle_since for idle in self._idle.values() for c in idle)
            self._sweeper = loop.call_at(oldest + self._keepalive_s, self._sweep)

    async def close(self) -> None:
        """Close every connection, idle or carrying an answer."""
        self._closed = True
        for timer in (self._sweeper, self._ticker):
            if timer is not None:
                timer.cancel()
        self._sweeper = self._ticker = None
        self._idle.clear()
        for connection in list(self._open):
            connection.abort()
        self._open.clear()


def _via(proxy: ProxyServer | None) -> str:
    return "" if proxy is None else f" through the proxy {proxy.address} ({proxy.variable})"
