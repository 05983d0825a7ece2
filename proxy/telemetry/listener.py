"""The metrics listener: Prometheus text on an address of its own (`VKGATE_METRICS_ADDR`).

Apart from the API's port so that a scrape never queues behind client traffic and the metrics
are never exposed where applications connect. It runs on the proxy's event loop with aiohttp's
server, which is there already for provider calls.
"""

from __future__ import annotations

import hmac
import logging

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from proxy.telemetry.metrics import ProxyMetrics
from vkgate.logs import event

log = logging.getLogger("vkgate.proxy")


class MetricsListenerError(Exception):
    """The metrics address could not be bound."""


async def start_listener(
    metrics: ProxyMetrics, host: str, port: int, token: str | None
) -> web.AppRunner:
    """Serve `GET /metrics` on host:port until the returned runner is cleaned up."""

    async def scrape(request: web.Request) -> web.Response:
        if token is not None:
            presented = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(presented.encode(), token.encode()):
                return web.json_response(
                    {"error": "metrics need Authorization: Bearer <VKGATE_METRICS_TOKEN>"},
                    status=401,
                )
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise MetricsListenerError(
            f"VKGATE_METRICS_ADDR: cannot listen on {host}:{port} ({exc.strerror}); choose another "
            "address, or `off`"
        ) from None
    event(log, "metrics_listening", address=f"{host}:{bound_port(runner)}")
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port the listener got (for port 0 in tests)."""
    for address in runner.addresses:
        return int(address[1])
    raise MetricsListenerError("the metrics listener is not bound")
