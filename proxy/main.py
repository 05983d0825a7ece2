"""Serving the proxy: the app factory servers import in each worker, and the server choice."""

from __future__ import annotations

import math
import sys
from typing import Any

from litestar import Litestar

from proxy.app import create_app
from proxy.http1 import OneWriteHttpToolsProtocol
from proxy.settings import ProxySettings
from proxy.workers import STARTUP_FAILURE, Workers, WorkersError
from vkgate import env as E
from vkgate.logs import configure as configure_logging
from vkgate.malloc import return_large_blocks
from vkgate.stopping import returning_server

FACTORY = "proxy.main:from_environment"
HTTP_OPTIONS: dict[str, Any] = {
    # httptools under the proxy's own request cycle, each answer's head and body in one write
    # (proxy/http1/).
    "http": OneWriteHttpToolsProtocol,
    # The proxy serves no WebSocket: an Upgrade header is answered as plain HTTP.
    "ws": "none",
    # The gateway reads X-Forwarded-For itself, from VKGATE_TRUSTED_PROXY_CIDRS only; the
    # server's own rewrite (which trusts 127.0.0.1) would also cost every request.
    "proxy_headers": False,
    # One header less on every answer, and no advertising of the server in front.
    "server_header": False,
}
"""How uvicorn serves the proxy's HTTP, in `vkgate proxy` and in the tests alike."""
GIL_SWITCH_INTERVAL_S = 0.0005
"""How long a thread may keep the GIL while another waits for it (Python's default is 5 ms).
The event loop serves every request; the helper threads (spool seals, gzip, log flushing) must
not hold it up for 5 ms at a time. With the spool shipping once a second, this cut
the c=1 p99 by 15-40 % and cost no throughput we could measure (bench/README.md)."""


def from_environment() -> Litestar:
    """The app, configured from `VKGATE_*` (each server worker calls this once)."""
    env = E.environment()
    settings = ProxySettings.from_env(env)
    return_large_blocks(env)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    # A worker process (VKGATE_PROXY_WORKERS above 1) has not inherited the logging set-up of
    # the process that ran `vkgate proxy`.
    configure_logging(settings.log_level, settings.log_format)
    return create_app(settings, freeze_heap=True)


def serve(settings: ProxySettings) -> None:
    """Run the proxy in the foreground on uvicorn (uvloop, and the proxy's own HTTP/1.1
    protocol over httptools), in one process or `VKGATE_PROXY_WORKERS` of them, until SIGTERM
    or SIGINT has drained it: the process then exits with 0."""
    options: dict[str, Any] = {
        "app": FACTORY,
        "factory": True,
        "loop": "uvloop",
        "log_config": None,
        "log_level": settings.log_level.lower(),
        "access_log": False,
        "lifespan": "on",
        **HTTP_OPTIONS,
        "timeout_graceful_shutdown": math.ceil(settings.shutdown_grace_s),
    }
    if settings.workers > 1:
        # Each worker on a socket of its own (proxy/workers.py), not uvicorn's one shared socket.
        try:
            workers = Workers(
                settings.workers,
                settings.host,
                settings.port,
                options,
                # A worker finishes its requests, then ships its spool, each for up to the grace.
                stop_grace_s=2 * settings.shutdown_grace_s,
            )
        except WorkersError as exc:
            sys.exit(f"vkgate proxy: {exc}")
        workers.run()
        if workers.failed:
            sys.exit(1)
        return
    import uvicorn

    server = returning_server(uvicorn.Config(host=settings.host, port=settings.port, **options))
    server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
