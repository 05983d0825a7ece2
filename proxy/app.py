"""The proxy's app: `/v1` served by the raw ASGI gateway, health routes, and start-up wiring."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from aiohttp.web import AppRunner
from litestar import Litestar, Request, Response, get
from litestar.exceptions import HTTPException

import vkgate
from proxy.auth import AuthCache
from proxy.breaker import BreakerState
from proxy.cache.service import ResponseCache
from proxy.cache.stores import CacheStore, MemoryStore, RedisStore
from proxy.control import ControlPlaneClient
from proxy.errors import ProxyError
from proxy.feed import ChangeFeedPoller
from proxy.gateway import Gateway
from proxy.limits.counters import LocalCounters
from proxy.limits.store import Counters
from proxy.pace import pace_of
from proxy.providers import HttpClient, Timeouts, registry
from proxy.settings import ProxySettings
from proxy.spend.drainer import SpoolDrainer
from proxy.spend.estimate import tokenizer_name
from proxy.spend.spool import SpendSpool, SpoolError
from proxy.telemetry.listener import MetricsListenerError, start_listener
from proxy.telemetry.metrics import ProxyMetrics
from proxy.telemetry.tracing import Tracing
from vkgate import versions
from vkgate.clock import Clock, SystemClock
from vkgate.errors import ErrorCode
from vkgate.logs import event
from vkgate.probe import Failure
from vkgate.stopping import StopSignals
from vkgate.wire import HealthResponse

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from proxy.limits.fallback import FallbackCounters
    from proxy.limits.leases import LeasedCounters

log = logging.getLogger("vkgate.proxy")

HEALTH_REUSE_S = 1.0
"""A `/health` answer serves every caller for this long."""


@dataclass
class Running:
    """What start-up built; the routes reach it through the app's state."""

    settings: ProxySettings
    clock: Clock
    control_transport: httpx.AsyncBaseTransport | None = None
    freeze_heap: bool = False
    """Freeze the start-up heap (`gc.freeze`): for a server process, never a test's."""
    gateway: Gateway | None = None
    cache: AuthCache | None = None
    control: ControlPlaneClient | None = None
    poller: ChangeFeedPoller | None = None
    spool: SpendSpool | None = None
    drainer: SpoolDrainer | None = None
    counters: Counters | None = None
    metrics: ProxyMetrics = field(default_factory=ProxyMetrics)
    started: bool = False
    draining: bool = False
    """A stop signal arrived: requests in progress finish, `/readyz` says 503."""
    _health: asyncio.Future[HealthResponse | Failure] | None = None
    _health_at: float = 0.0

    async def health_probe(self) -> HealthResponse | Failure:
        """The control plane's health, asked at most once a second however often `/health` is
        called: an anonymous caller cannot turn it into load on the control plane."""
        now = self.clock.monotonic()
        probe = self._health
        if probe is None or (probe.done() and now - self._health_at >= HEALTH_REUSE_S):
            assert self.control is not None
            probe = self._health = asyncio.ensure_future(self._check_health(self.control))
            self._health_at = now
        return await asyncio.shield(probe)

    @staticmethod
    async def _check_health(control: ControlPlaneClient) -> HealthResponse | Failure:
        answer = await control.check_health()
        if isinstance(answer, Failure):
            event(
                log,
                "health_check_failed",
                logging.WARNING,
                cause=answer.cause,
                reason=answer.detail,
            )
        return answer

    def stop_signalled(self, reason: str) -> None:
        if self.draining:
            return
        self.draining = True
        event(
            log,
            "shutdown_started",
            reason=reason,
            grace_s=self.settings.shutdown_grace_s,
            in_flight=self.gateway.in_flight if self.gateway is not None else 0,
        )

    def watch(self) -> None:
        """Point the metrics at what start-up built."""
        sources = self.metrics.sources
        gateway, cache, poller, spool = self.gateway, self.cache, self.poller, self.spool
        assert gateway is not None and cache is not None and poller is not None
        assert spool is not None
        sources.in_flight = lambda: gateway.in_flight
        sources.max_in_flight = self.settings.max_in_flight
        names = self.metrics.provider_names

        def breakers() -> Iterator[tuple[str, str, BreakerState]]:
            for provider_id, state in gateway.breakers.states().items():
                yield provider_id, names.get(provider_id, ""), state

        sources.breakers = breakers
        sources.auth_cache = cache.lookups
        monotonic = self.clock.monotonic

        def feed() -> tuple[bool, int | None, float | None]:
            answered = poller.answered_at
            return (
                poller.connected,
                poller.revision,
                None if answered is None else monotonic() - answered,
            )

        sources.feed = feed
        sources.spool = spool.stats
        counters = _fallback(self.counters)
        if counters is not None:
            sources.limits_fallback = lambda: (counters.degraded, counters.local_calls)
        leased = _leased(self.counters)
        if leased is not None:
            sources.limits_leases = lambda: leased.stats


def _provider_client(settings: ProxySettings) -> HttpClient:
    """The process's one pooled client for every provider call (proxy/providers/_client.py)."""
    return HttpClient(
        Timeouts(
            connect_s=settings.connect_timeout_s,
            read_s=settings.first_byte_timeout_s,
            total_s=settings.total_timeout_s,
        ),
        user_agent=f"vkgate/{vkgate.__version__}",
        tls=settings.egress.provider_tls(),
        egress=settings.egress,
    )


def _control_transport(settings: ProxySettings) -> httpx.AsyncBaseTransport:
    """The road to the control plane, by the same egress rules as provider calls: httpx's own
    reading of the proxy variables (a client given no transport) would apply other rules, and
    would send a control plane on loopback to a proxy elsewhere."""
    return httpx.AsyncHTTPTransport(proxy=settings.egress.httpx_proxy(settings.controlplane_url))


def _open_spool(settings: ProxySettings, clock: Clock) -> SpendSpool:
    try:
        return SpendSpool.open(
            settings.spool_dir,
            clock,
            replica_id=settings.replica_id,
            max_bytes=settings.spend_spool_max_bytes,
            policy=settings.spend_spool_full_policy,
        )
    except SpoolError as exc:
        raise SpoolError(f"VKGATE_SPOOL_DIR: {exc}") from exc


async def _metrics_listener(settings: ProxySettings, metrics: ProxyMetrics) -> AppRunner | None:
    if settings.metrics_port is None:
        return None
    return await start_listener(
        metrics, settings.metrics_host, settings.metrics_port, settings.metrics_token
    )


def _redis_client(settings: ProxySettings) -> Any:
    """The process's Redis client (a cluster's with `VKGATE_REDIS_CLUSTER`), or None without
    `VKGATE_REDIS_URL`: shared by the limits' counters and the response cache."""
    if settings.redis_url is None:
        return None
    # Imported only here: the Redis client is 8 MiB of the memory of a proxy that has no use
    # for it (measured on top of the rest of the proxy's imports).
    import redis.asyncio
    import redis.asyncio.cluster
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    options: dict[str, Any] = {
        "socket_timeout": settings.redis_timeout_s,
        "socket_connect_timeout": settings.redis_timeout_s,
        # No retries: a Redis that does not answer in time is served around (in-process
        # counters, a cache miss) at once, not after ten backed-off attempts.
        "retry": Retry(NoBackoff(), 0),
    }
    if settings.redis_cluster:
        return redis.asyncio.cluster.RedisCluster.from_url(settings.redis_url, **options)
    return redis.asyncio.Redis.from_url(settings.redis_url, **options)


def _counters(settings: ProxySettings, clock: Clock, client: Any) -> Counters:
    """Rate-limit and budget counters: in-process, or shared through leases on Redis when
    configured (falling back to in-process while Redis cannot be reached)."""
    if client is None:
        return LocalCounters()
    from proxy.limits.fallback import FallbackCounters
    from proxy.limits.lease_store import RedisLeaseStore
    from proxy.limits.leases import LeasedCounters

    leased = LeasedCounters(RedisLeaseStore(client), clock, ttl_s=settings.limits_lease_s)
    fallback = FallbackCounters(leased, LocalCounters(), clock, check=leased.check)
    leased.on_failure = fallback.failed
    return fallback


def _response_cache(
    settings: ProxySettings, clock: Clock, client: Any, metrics: ProxyMetrics
) -> ResponseCache:
    """The response cache: in Redis when configured (shared by every replica), else in this
    process, bounded by `VKGATE_CACHE_MAX_BYTES`."""
    store: CacheStore
    if client is None:
        store = MemoryStore(settings.cache_max_bytes, clock.monotonic)
    else:
        import redis.exceptions

        from proxy.limits.fallback import UNREACHABLE

        # Any trouble of Redis's is a miss (or an answer not kept), never the request's error.
        store = RedisStore(client, (*UNREACHABLE, redis.exceptions.RedisError))
    metrics.sources.response_cache = store.stats
    return ResponseCache(
        store,
        max_entry_bytes=settings.cache_max_entry_bytes,
        wall=clock.time,
        lookups=metrics.cache_lookups,
        stores=metrics.cache_stores,
    )


async def _start(
    running: Running, stack: contextlib.AsyncExitStack, span_exporter: SpanExporter | None
) -> None:
    """Build the proxy, registering on `stack` how each part is stopped: the server has
    drained its requests by then, so the spool is sealed and shipped (within the grace) while
    the control-plane client is still open, and the spool closes last."""
    settings, clock = running.settings, running.clock
    # The tokenizer that estimates usage a provider did not report takes about 0.3 s to load:
    # in a thread while the rest starts, not on the event loop at the first such answer.
    tokenizer = asyncio.ensure_future(asyncio.to_thread(tokenizer_name))
    # First of all: a proxy that cannot record spend must not serve. Recovery reads back what
    # a previous process left, off the event loop.
    spool = running.spool = await asyncio.to_thread(_open_spool, settings, clock)
    stack.callback(spool.close)
    stack.callback(
        lambda: event(log, "shutdown_completed", backlog_segments=len(spool.pending_segments()))
    )
    tracing = None
    if settings.otel_endpoint is not None or span_exporter is not None:
        tracing = Tracing(settings, span_exporter)
        # Exports what is buffered: blocking, bounded by its flush timeout.
        stack.push_async_callback(asyncio.to_thread, tracing.shutdown)
    providers = _provider_client(settings)
    stack.push_async_callback(providers.close)
    control = running.control = ControlPlaneClient(
        settings.controlplane_url,
        settings.internal_secret,
        clock,
        previous_secret=settings.internal_secret_previous,
        timeout_s=settings.controlplane_timeout_s,
        transport=running.control_transport or _control_transport(settings),
    )
    stack.push_async_callback(control.close)
    cache = running.cache = AuthCache(
        control,
        registry(providers, clock),
        clock,
        maxsize=settings.auth_cache_size,
        soft_bump_s=settings.auth_cache_soft_bump_s,
        hard_grace_s=settings.auth_cache_hard_grace_s,
        config_ttl_s=settings.auth_cache_config_ttl_s,
        invalid_key_cache_s=settings.invalid_key_cache_s,
    )
    stack.push_async_callback(cache.close)
    redis_client = _redis_client(settings)
    counters = running.counters = _counters(settings, clock, redis_client)
    stack.push_async_callback(counters.close)
    response_cache = _response_cache(settings, clock, redis_client, running.metrics)
    stack.push_async_callback(response_cache.close)
    leased = _leased(counters)
    if leased is not None:
        leased.start()
    poller = running.poller = ChangeFeedPoller(
        control, cache, timeout_s=settings.changes_timeout_s, monotonic=clock.monotonic
    )
    gateway = running.gateway = Gateway(
        settings,
        cache,
        spool,
        clock=clock,
        counters=counters,
        spend_source=control,
        metrics=running.metrics,
        tracing=tracing,
        pace=pace_of(asyncio.get_running_loop()),
        response_cache=response_cache,
    )
    spool.on_ledgered = gateway.budgets.ledgered_through
    cache.on_compiled = lambda runtime: gateway.budgets.learn(runtime.budget_rules)
    running.watch()
    try:
        listener = await _metrics_listener(settings, running.metrics)
    except MetricsListenerError as exc:
        event(log, "metrics_listener_failed", logging.ERROR, reason=str(exc))
        raise
    if listener is not None:
        stack.push_async_callback(listener.cleanup)
    drainer = running.drainer = SpoolDrainer(
        spool, control.ship_spend, clock, interval_s=settings.spend_flush_interval_s
    )
    drainer.start()
    stack.push_async_callback(drainer.stop, settings.shutdown_grace_s)
    feed = asyncio.create_task(poller.run(), name="change-feed")
    stack.push_async_callback(_cancel, feed)
    loop = asyncio.get_running_loop()

    def on_stop(name: str) -> None:
        # A signal handler runs between two bytecodes, maybe inside the loop's own code: it
        # only asks the loop to mark the drain (a loop already closed hears nothing).
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(running.stop_signalled, name)

    signals = StopSignals(on_stop)
    signals.install()
    stack.callback(signals.uninstall)
    # Stopped without a signal (the server ending on its own, tests): said all the same.
    stack.callback(running.stop_signalled, "lifespan_shutdown")
    stack.callback(setattr, running, "started", False)
    await tokenizer
    running.started = True
    if running.freeze_heap:
        # What start-up built lives as long as the process: out of the collector's sight, a
        # full collection no longer walks it (measured at c=16: 2-3 full collections in 8 s,
        # up to 0.7 s each on a busy machine, before; at most 4 ms after).
        gc.collect()
        gc.freeze()
    if settings.egress.configured:
        log.info("provider calls: %s", settings.egress.describe())
    log.info(
        "proxy pid %d ready; control plane %s; spend spool %s (replica %s)",
        os.getpid(),
        settings.controlplane_url,
        spool.directory,
        spool.replica_id,
    )


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def create_app(
    settings: ProxySettings,
    *,
    clock: Clock | None = None,
    control_transport: httpx.AsyncBaseTransport | None = None,
    span_exporter: SpanExporter | None = None,
    freeze_heap: bool = False,
) -> Litestar:
    """The proxy app; `span_exporter` replaces the OTLP exporter (and turns tracing on), and
    `freeze_heap` (for the server's own process) moves what start-up built out of the garbage
    collector's way."""
    running = Running(settings, clock or SystemClock(), control_transport, freeze_heap)

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        # Everything is closed in the reverse of its making, also when start-up fails half way.
        async with contextlib.AsyncExitStack() as stack:
            await _start(running, stack, span_exporter)
            yield

    return ProxyApp(
        running,
        route_handlers=[healthz, readyz, startupz, health],
        lifespan=[lifespan],
        state=_state(running),
        exception_handlers={HTTPException: _http_error},
        after_request=_with_request_id,
        openapi_config=None,
        # vkgate.logs configures logging for the process; Litestar's own set-up would replace it.
        logging_config=None,
    )


_SLASHES = re.compile("/{2,}")


class ProxyApp(Litestar):
    """Litestar for the health routes and start-up; `/v1` goes straight to the gateway.

    Measured, Litestar's router, host check and exception middleware in front of the gateway
    cost 4-6 % of a request's instructions, for nothing the gateway uses: it routes its own
    paths and answers its own errors (bench/README.md).
    """

    def __init__(self, running: Running, **config: Any) -> None:
        super().__init__(**config)
        self._running = running
        self.client_limits = running.settings.client_limits
        """What the server's protocol (`proxy.http1`) lets one request cost before it is whole."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if "//" in path:  # as a router would: `//v1//chat/completions` is that route
                path = _SLASHES.sub("/", path)
            if path.startswith("/v1") and (len(path) == 3 or path[3] == "/"):
                gateway = self._running.gateway
                if gateway is not None:  # the server sends requests only after start-up
                    # The gateway sees its own paths, as a mount under `/v1` would.
                    scope["path"] = path[3:]
                    await gateway(scope, receive, send)
                    return
            elif path.startswith("/v1beta") and (len(path) == 7 or path[7] == "/"):
                gateway = self._running.gateway
                if gateway is not None:
                    scope["path"] = path[7:]
                    await gateway.gemini(scope, receive, send)
                    return
        await super().__call__(scope, receive, send)


def _state(running: Running) -> Any:
    from litestar.datastructures import State

    return State({"running": running})


def _running(request: Request[Any, Any, Any]) -> Running:
    running: Running = request.app.state["running"]
    return running


async def _with_request_id(response: Response[Any]) -> Response[Any]:
    response.headers.setdefault("X-Request-ID", os.urandom(16).hex())
    return response


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}.get(
        exc.status_code, ErrorCode.INVALID_REQUEST
    )
    return Response(
        ProxyError(code, exc.detail).openai_body(),
        media_type="application/json",
        status_code=exc.status_code,
        headers={**(exc.headers or {}), "X-Request-ID": os.urandom(16).hex()},
    )


@get("/healthz", sync_to_thread=False)
def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@get("/startupz", sync_to_thread=False)
def startupz(request: Request[Any, Any, Any]) -> Response[dict[str, str]]:
    started = _running(request).started
    return Response(
        {"status": "ok" if started else "starting"}, status_code=200 if started else 503
    )


@get("/readyz", sync_to_thread=False)
def readyz(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """Can serve: the control plane answers the change feed, or keys are cached to serve from;
    and spend can be recorded (the spool writes and, under the refuse policy, is not full)."""
    running = _running(request)
    connected = running.poller is not None and running.poller.connected
    cached = len(running.cache) if running.cache is not None else 0
    spool = running.spool
    writable = spool is not None and spool.writable
    full = spool is None or spool.full
    ready = running.started and (connected or cached > 0) and writable and not full
    ready = ready and not running.draining
    status = "draining" if running.draining else "ok" if ready else "unavailable"
    return Response(
        {
            "status": status,
            "controlplane": connected,
            "cached_keys": cached,
            "spend_spool": {"writable": writable, "full": full},
            "limits": _limits_mode(running.counters),
        },
        status_code=200 if ready else 503,
    )


def _limits_mode(counters: Counters | None) -> str:
    fallback = _fallback(counters)
    if fallback is not None:
        return "in-process (redis unreachable)" if fallback.degraded else "redis"
    return "in-process"


def _fallback(counters: Counters | None) -> FallbackCounters | None:
    """`counters` when they are Redis's with the in-process fallback. Their module is loaded
    only by `_counters` building them, so where it is not loaded, they cannot be."""
    module = sys.modules.get("proxy.limits.fallback")
    if module is not None and isinstance(counters, module.FallbackCounters):
        found: FallbackCounters = counters
        return found
    return None


def _leased(counters: Counters | None) -> LeasedCounters | None:
    """The leases behind `counters`, when they are shared through Redis."""
    fallback = _fallback(counters)
    module = sys.modules.get("proxy.limits.leases")
    if fallback is not None and module is not None:
        shared = fallback.shared
        if isinstance(shared, module.LeasedCounters):
            found: LeasedCounters = shared
            return found
    return None


@get("/health")
async def health(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """A signed round trip to the control plane; when it fails, which step failed and how to
    fix it. The answer names no host or address (the route is as public as `/v1`): the
    `health_check_failed` log line has the detail."""
    running = _running(request)
    if running.control is None:
        return Response({"status": "starting"}, status_code=503)
    answer = await running.health_probe()
    if isinstance(answer, Failure):
        return Response(
            {"status": "unavailable", "controlplane": {"cause": answer.cause, "fix": answer.fix}},
            status_code=503,
        )
    controlplane: dict[str, Any] = {"revision": answer.revision, "version": answer.version}
    skew = versions.mismatch(vkgate.__version__, answer.version)
    if skew is not None:
        # The round trip worked, and requests may still be served; but this pair is outside
        # what is tested to work together.
        controlplane |= {"cause": "version", "detail": skew, "fix": versions.FIX}
        return Response(
            {
                "status": "version_mismatch",
                "version": vkgate.__version__,
                "controlplane": controlplane,
            },
            status_code=503,
        )
    return Response({"status": "ok", "version": vkgate.__version__, "controlplane": controlplane})
