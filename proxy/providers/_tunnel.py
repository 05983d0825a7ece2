"""A connection to a provider through an HTTP proxy's CONNECT tunnel, TLS to the provider inside.

The proxy is asked for a tunnel to host:port (with the credentials of its URL); once it answers
2xx, the same socket carries TLS to the provider, verified for the provider's name: the proxy
sees where the call goes, never what it says. A refusal (407, 403, 502 ...) ends the attempt as
`ProviderUnreachable`, saying what the proxy answered and what that usually means.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from proxy.egress import ProxyServer
from proxy.providers._connection import Connection
from proxy.providers.base import ProviderUnreachable

MAX_ANSWER_BYTES = 16 * 1024
"""The most of a proxy's answer to CONNECT read before it is taken for something else."""

_MEANINGS = {
    400: "the proxy did not take the request for a tunnel",
    403: "the proxy's policy forbids this destination",
    404: "the proxy does not know this destination",
    405: "the proxy does not tunnel (CONNECT) to this destination",
    407: "the proxy wants credentials: check the user and password in {variable}",
    502: "the proxy could not reach the provider",
    503: "the proxy could not reach the provider",
    504: "the proxy timed out reaching the provider",
}


class ProxyRefused(ProviderUnreachable):
    """The proxy answered the tunnel request with something other than 2xx."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def refusal(proxy: ProxyServer, host: str, port: int, status: int, reason: str) -> ProxyRefused:
    """What a proxy's refusal of a call to host:port says to an operator."""
    meaning = _MEANINGS.get(status, "the proxy refused the call").format(variable=proxy.variable)
    shown = "".join(c for c in reason[:80] if c.isprintable()).strip()
    answer = f"{status} {shown}" if shown else str(status)
    return ProxyRefused(
        f"the proxy {proxy.address} ({proxy.variable}) answered {answer} for {host}:{port}: "
        f"{meaning}",
        status,
    )


def connect_request(proxy: ProxyServer, host: str, port: int, user_agent: str) -> bytes:
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"host: {authority}", f"user-agent: {user_agent}"]
    if proxy.authorization is not None:
        lines.append(f"proxy-authorization: {proxy.authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


async def open_tunnel(
    loop: asyncio.AbstractEventLoop,
    proxy: ProxyServer,
    host: str,
    port: int,
    tls: ssl.SSLContext,
    make: Callable[[], Connection],
    user_agent: str,
) -> Connection:
    """A connection to https://host:port through `proxy`; the caller bounds its time. Raises
    `ProviderUnreachable` (the proxy refused or broke off) or `OSError` (TCP or TLS failed)."""
    transport, handshake = await loop.create_connection(
        lambda: _Handshake(loop, proxy, host, port), proxy.host, proxy.port
    )
    try:
        transport.write(connect_request(proxy, host, port, user_agent))
        await handshake.established
        connection = make()
        secured = await loop.start_tls(transport, connection, tls, server_hostname=host)
    except BaseException:
        transport.abort()
        raise
    if secured is None:  # the loop's type allows it; a closed transport is the only cause
        raise ProviderUnreachable(f"the proxy {proxy.address} closed the tunnel to {host}:{port}")
    # start_tls hands the protocol a transport without calling connection_made.
    connection.connection_made(secured)
    return connection


class _Handshake(asyncio.Protocol):
    """Reads the proxy's answer to CONNECT: `established` is done on a 2xx, failed otherwise."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, proxy: ProxyServer, host: str, port: int
    ) -> None:
        self.established: asyncio.Future[None] = loop.create_future()
        self._proxy, self._host, self._port = proxy, host, port
        self._buffer = b""

    def data_received(self, data: bytes) -> None:
        if self.established.done():
            return  # the refusal's body, or bytes after a tunnel was refused: not read
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_ANSWER_BYTES:
                self._fail(self._unreadable("an answer longer than any proxy's head"))
            return
        line = self._buffer.split(b"\r\n", 1)[0]
        parts = line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            self._fail(self._unreadable("an answer that is not HTTP"))
            return
        status = int(parts[1])
        if not 200 <= status < 300:
            reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
            self._fail(refusal(self._proxy, self._host, self._port, status, reason))
            return
        if self._buffer[end + 4 :]:
            # The provider speaks only after the TLS hello: these bytes are the proxy's own.
            self._fail(self._unreadable("bytes after its answer, before TLS began"))
            return
        self.established.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.established.done():
            detail = f": {exc}" if exc is not None else ""
            self._fail(
                ProviderUnreachable(
                    f"the proxy {self._proxy.address} ({self._proxy.variable}) closed the "
                    f"connection before it answered the tunnel request for "
                    f"{self._host}:{self._port}{detail}"
                )
            )

    def _unreadable(self, what: str) -> ProviderUnreachable:
        return ProviderUnreachable(
            f"the proxy {self._proxy.address} ({self._proxy.variable}) sent {what} to the tunnel "
            f"request for {self._host}:{self._port}"
        )

    def _fail(self, error: Exception) -> None:
        if not self.established.done():
            self.established.set_exception(error)
