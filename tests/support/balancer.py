"""An HTTP load balancer on loopback, in front of several control planes, as a cluster has one.

It stands for a Kubernetes Service with an Ingress path rule: every request goes to the next
backend in turn, except those whose path starts with one of `pinned` prefixes, which always go
to the backend `owner` (in a test, the one control plane that holds the embedded ledger, which
only one process can open).

What a reverse proxy must not change, it does not: method, path and query reach the backend as
sent, byte for byte (the internal API signs `METHOD\\nPATH?QUERY\\n…`), and so do the headers
(hop-by-hop ones aside) and bodies in both directions, compressed or not. Answers are streamed
as they arrive, so a long-poll waits as long as the backend makes it wait and an SSE stream
is not held back. A client that goes away cancels its request to the backend.

It runs its own event loop on a thread of its own, so the test's loop (or a blocking call in
a test) never stalls the traffic it carries.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web
from multidict import CIMultiDict
from yarl import URL

# RFC 9110 7.6.1: meaningful for one connection only, so never forwarded.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
MAX_BODY_BYTES = 128 * 1024 * 1024
"""As large as the control plane takes a spend segment: the balancer must not be the limit."""
CONNECT_TIMEOUT_S = 5.0
CALL_TIMEOUT_S = 10.0
"""The longest starting, stopping or joining the balancer's thread may take."""


@dataclass(frozen=True, slots=True)
class Forwarded:
    """One request the balancer passed on."""

    backend: int
    """Index into the balancer's backends."""
    method: str
    path: str
    status: int
    """The backend's status, or 502 when it could not be reached."""


class Balancer:
    """Round-robin over `backends` (origins such as `http://127.0.0.1:5560`), with requests
    under `pinned` path prefixes sent to `backends[owner]`; see the module docstring."""

    def __init__(
        self, backends: Sequence[str], *, pinned: Sequence[str] = (), owner: int = 0
    ) -> None:
        if not backends:
            raise ValueError("a balancer needs at least one backend")
        if not 0 <= owner < len(backends):
            raise ValueError(f"owner {owner} is not one of the {len(backends)} backends")
        self.backends = [b.rstrip("/") for b in backends]
        self.pinned = tuple(pinned)
        self.owner = owner
        self.url = ""
        """Where to reach it, `http://127.0.0.1:<port>`, once started."""
        self._turn = itertools.cycle(range(len(self.backends)))
        self._forwarded: list[Forwarded] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="test-balancer", daemon=True
        )
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None

    @property
    def forwarded(self) -> list[Forwarded]:
        """Every request passed on so far, in the order answered (a copy)."""
        return list(self._forwarded)

    def backend_for(self, path: str) -> int:
        """The backend a request for `path` goes to (the next one in turn, unless pinned)."""
        if self.pinned and path.startswith(self.pinned):
            return self.owner
        return next(self._turn)

    # -- lifecycle (called from the test's thread) ---------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._call(self._start())

    def close(self) -> None:
        """Stop listening, end what is in flight, and stop the thread; safe to call twice."""
        if not self._thread.is_alive():
            if not self._loop.is_closed():
                self._loop.close()
            return
        try:
            self._call(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CALL_TIMEOUT_S)
            if not self._thread.is_alive():
                self._loop.close()

    def _call(self, coroutine: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(CALL_TIMEOUT_S)

    async def _start(self) -> None:
        self._session = ClientSession(
            # No pool limit: long-polls must not queue the requests behind them.
            connector=TCPConnector(limit=0),
            # The backend's own deadlines (a long-poll's) are the callers' business.
            timeout=ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S),
            # Bodies pass through as the backend encoded them.
            auto_decompress=False,
            # Nothing added: the caller's headers are the request's headers.
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            # A caller that hangs up (a proxy stopping its long-poll) ends the backend request.
            handler_cancellation=True,
            # The request body reaches the backend as sent (a signature covers its bytes).
            auto_decompress=False,
            shutdown_timeout=0.5,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # -- the data path (on the balancer's thread) -----------------------------------------------

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        index = self.backend_for(request.path)
        body = await request.read()
        headers = CIMultiDict(
            (name, value)
            for name, value in request.headers.items()
            if name.lower() not in HOP_BY_HOP and name.lower() != "content-length"
        )
        # `raw_path` is the request target as sent, query included; `encoded` keeps yarl from
        # normalising it (a re-quoted query would no longer match its signature).
        target = URL(self.backends[index] + request.raw_path, encoded=True)
        response: web.StreamResponse | None = None
        try:
            async with self._session.request(
                request.method,
                target,
                headers=headers,
                data=body if body else None,
                allow_redirects=False,
            ) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in upstream.headers.items():
                    if name.lower() not in HOP_BY_HOP:
                        response.headers.add(name, value)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
        except ClientError as exc:
            self._forwarded.append(Forwarded(index, request.method, request.path, 502))
            if response is not None:
                # Part of the answer is out: cut the connection, so the caller sees a short
                # body rather than a complete-looking one.
                if request.transport is not None:
                    request.transport.close()
                return response
            return web.json_response(
                {"error": {"message": f"backend {index} failed: {type(exc).__name__}"}},
                status=502,
            )
        self._forwarded.append(Forwarded(index, request.method, request.path, upstream.status))
        return response


@contextmanager
def balancing(
    backends: Sequence[str], *, pinned: Sequence[str] = (), owner: int = 0
) -> Iterator[Balancer]:
    """A started `Balancer` over `backends`, closed afterwards."""
    balancer = Balancer(backends, pinned=pinned, owner=owner)
    try:
        balancer.start()
        yield balancer
    finally:
        balancer.close()
