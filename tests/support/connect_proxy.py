"""A forward proxy on loopback that tunnels CONNECT requests, for what a packaged proxy will not
do on demand: answer 502, hang up or stay silent when asked, and show every request it read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping


class ConnectProxy:
    """Tunnels `CONNECT host:port` to `hosts[host]` (or host itself), unless told to refuse.

    `refuse` is a whole answer sent instead of a tunnel; `credentials` is the
    `Proxy-Authorization` value required (407 otherwise); `silent` reads a request and never
    answers; `hang_up` closes the connection once a request is read.
    """

    def __init__(
        self,
        *,
        hosts: Mapping[str, str] | None = None,
        refuse: bytes | None = None,
        credentials: str | None = None,
        silent: bool = False,
        hang_up: bool = False,
    ) -> None:
        self.hosts = dict(hosts or {})
        self.refuse = refuse
        self.credentials = credentials
        self.silent = silent
        self.hang_up = hang_up
        self.requests: list[bytes] = []
        """The head of every request read, in order."""
        self.tunnels = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def targets(self) -> list[str]:
        """The `CONNECT` targets asked for, in order."""
        return [head.split(b" ")[1].decode() for head in self.requests]

    async def __aenter__(self) -> ConnectProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            self.requests.append(head)
            if self.hang_up:
                return
            if self.silent:
                await reader.read()  # until the client gives up
                return
            answer = self._refusal(head)
            if answer is not None:
                writer.write(answer)
                await writer.drain()
                return
            await self._tunnel(head, reader, writer)
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    def _refusal(self, head: bytes) -> bytes | None:
        line, *headers = head.decode("latin-1").split("\r\n")
        if not line.startswith("CONNECT "):
            return b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n"
        if self.credentials is not None:
            given = [
                value.strip()
                for name, _, value in (h.partition(":") for h in headers)
                if name.lower() == "proxy-authorization"
            ]
            if given != [self.credentials]:
                return (
                    b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                    b'proxy-authenticate: Basic realm="test"\r\ncontent-length: 0\r\n\r\n'
                )
        return self.refuse

    async def _tunnel(
        self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        target = head.split(b" ")[1].decode()
        host, _, port = target.rpartition(":")
        host = host.strip("[]")
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                self.hosts.get(host, host), int(port)
            )
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
            return
        self._writers.add(upstream_writer)
        self.tunnels += 1
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        try:
            await asyncio.gather(
                self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer)
            )
        finally:
            self._writers.discard(upstream_writer)
            upstream_writer.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.write_eof()
