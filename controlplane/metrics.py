"""Prometheus metrics of the control plane, on a registry of its own (one per app instance).

Every label value is a code constant, a route template or an HTTP status: never a key, a token,
an id, a raw path or a query string, so the number of series stays bounded whatever clients send.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

import vkgate

UNMATCHED = "unmatched"
"""The route of a request no route matched (404, 405): its path could carry anything."""
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Up to 30 s: the change feed's long-polls (at most 25 s) land in the last buckets."""
LEDGER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The families of one app's registry; handlers count through these attributes."""

    def __init__(self, *, waiting_polls: Callable[[], int], serving: Callable[[], bool]) -> None:
        self.registry = registry = CollectorRegistry()
        Gauge(
            "vkgate_controlplane_up",
            "1 while the control plane serves, 0 once it drains for shutdown",
            registry=registry,
        ).set_function(lambda: 1.0 if serving() else 0.0)
        Gauge(
            "vkgate_controlplane_build_info",
            "Always 1; the version of vkgate this process runs",
            ["version"],
            registry=registry,
        ).labels(vkgate.__version__).set(1)
        self.stale_spend_bundles = Counter(
            "vkgate_controlplane_stale_spend_bundles",
            "Key bundles sent with their budgets' last saved spend (and its age) because the "
            "ledger could not be read",
            registry=registry,
        )
        self.proxy_calls = Counter(
            "vkgate_controlplane_proxy_calls",
            "Signed internal API calls by the calling proxy's release (`unknown`: one that names "
            "none, older than the X-Vkgate-Version header)",
            ["version"],
            registry=registry,
        )
        self.http_requests = Counter(
            "vkgate_controlplane_http_requests",
            "HTTP requests answered, by route template, method and status",
            ["route", "method", "status"],
            registry=registry,
        )
        self.http_duration = Histogram(
            "vkgate_controlplane_http_request_duration_seconds",
            "Time from a request's arrival to its response's last byte, by route template "
            "(change-feed long-polls included: they last up to their timeout)",
            ["route"],
            buckets=HTTP_BUCKETS,
            registry=registry,
        )
        self.resolve_key = Counter(
            "vkgate_controlplane_resolve_key",
            "resolve-key calls by result: ok, unknown, revoked, disabled, expired, invalid, error",
            ["result"],
            registry=registry,
        )
        self.config = Counter(
            "vkgate_controlplane_config",
            "Config bundle fetches by result: full, not_modified, refused (unknown or unusable "
            "key), error",
            ["result"],
            registry=registry,
        )
        self.spend_segments = Counter(
            "vkgate_controlplane_spend_segments",
            "Spend segments shipped by proxies, by result: accepted (new records written), "
            "duplicate (all already in the ledger), rejected (malformed: 4xx)",
            ["result"],
            registry=registry,
        )
        self.spend_records = Counter(
            "vkgate_controlplane_spend_records",
            "Spend records (admits and outcomes) newly written to the ledger",
            registry=registry,
        )
        self.ledger_write = Histogram(
            "vkgate_controlplane_ledger_write_duration_seconds",
            "Time to write one segment's records to the spend ledger (failed writes included)",
            buckets=LEDGER_BUCKETS,
            registry=registry,
        )
        self.ledger_errors = Counter(
            "vkgate_controlplane_ledger_errors",
            "Requests that failed because the spend ledger failed (writes and reads)",
            registry=registry,
        )
        self.feed_revision = Gauge(
            "vkgate_controlplane_feed_revision",
            "The change feed's revision, as this process last read it",
            registry=registry,
        )
        Gauge(
            "vkgate_controlplane_feed_waiting_polls",
            "Change-feed long-polls waiting for an event",
            registry=registry,
        ).set_function(waiting_polls)
        self.admin_mutations = Counter(
            "vkgate_controlplane_admin_mutations",
            "Committed admin mutations (audit log entries), by resource kind and action",
            ["resource_kind", "action"],
            registry=registry,
        )
        self.internal_auth_failures = Counter(
            "vkgate_controlplane_internal_auth_failures",
            "Internal API requests refused for their signature, by reason",
            ["reason"],
            registry=registry,
        )
        self.admin_auth_failures = Counter(
            "vkgate_controlplane_admin_auth_failures",
            "Admin API requests refused for their token",
            registry=registry,
        )
        # Children by label values: `labels()` takes a lock and builds a tuple on every call,
        # which the per-request path does not need to pay twice.
        self._requests: dict[tuple[str, str, str], Counter] = {}
        self._durations: dict[str, Histogram] = {}

    def observe_request(self, route: str, method: str, status: str, seconds: float) -> None:
        key = (route, method, status)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._requests[key] = self.http_requests.labels(*key)
        counter.inc()
        histogram = self._durations.get(route)
        if histogram is None:
            histogram = self._durations[route] = self.http_duration.labels(route)
        histogram.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestMetrics:
    """ASGI middleware: counts and times every HTTP request by route template, method, status.

    Placed around Litestar's router rather than in a route's middleware stack, so that requests
    no route matched are counted too (as `unmatched`).
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self._app = app
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self._app(scope, receive, send)
            return
        started = perf_counter()
        # "none": the client went away, or the server gave up, before any answer was sent.
        status = "none"

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self._app(scope, receive, sending)
        finally:
            method = scope["method"]
            self._metrics.observe_request(
                scope.get("path_template") or UNMATCHED,
                method if method in METHODS else "other",
                status,
                perf_counter() - started,
            )
