"""The control plane's Litestar application: wiring only."""

from __future__ import annotations

import asyncio
import gc
import hmac
import ipaddress
from datetime import timedelta
from typing import Any

from litestar import Litestar, MediaType, Request, Response, Router, get
from litestar.config.app import AppConfig
from litestar.datastructures import State
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme
from litestar.status_codes import HTTP_200_OK, HTTP_503_SERVICE_UNAVAILABLE
from litestar.types import ControllerRouterHandler

import vkgate
from controlplane.auth import require_admin_token
from controlplane.budgets.routes import BudgetController
from controlplane.cache_rules.routes import CacheRuleController
from controlplane.console import console_router, console_templates
from controlplane.console.sessions import ConsoleSessions
from controlplane.db import Database, create_engine, is_sqlite
from controlplane.errors import EXCEPTION_HANDLERS, ApiError
from controlplane.feed.listener import PostgresFeedListener
from controlplane.feed.service import FeedNotifier
from controlplane.guardrails.routes import GuardrailController
from controlplane.internal.peers import ProxyVersions
from controlplane.internal.routes import internal_router
from controlplane.keys.routes import VirtualKeyController
from controlplane.ledger.store import Ledger
from controlplane.lifecycle import Lifecycle
from controlplane.metrics import Metrics, RequestMetrics
from controlplane.openapi import document_refusals
from controlplane.orgs.routes import OrganizationController, ProjectController, TeamController
from controlplane.policies.routes import RoutingPolicyController
from controlplane.providers.routes import ProviderController
from controlplane.readiness import ReadinessProbe
from controlplane.schemas import DEPENDENCIES, Vk
from controlplane.security import Cipher, Hasher
from controlplane.settings import ControlPlaneSettings
from controlplane.spend.pricing import Pricer
from controlplane.spend.readings import SpendReadings
from controlplane.spend.routes import SpendController
from controlplane.state import AppState
from controlplane.throttle import AdminAuthThrottle
from controlplane.tokens.routes import AdminTokenController, audit_log
from vkgate.clock import Clock, SystemClock
from vkgate.errors import ErrorCode

ADMIN_CONTROLLERS: list[ControllerRouterHandler] = [
    OrganizationController,
    TeamController,
    ProjectController,
    ProviderController,
    RoutingPolicyController,
    VirtualKeyController,
    BudgetController,
    GuardrailController,
    CacheRuleController,
    AdminTokenController,
    SpendController,
    audit_log,
]


@get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz", include_in_schema=False)
async def readyz(vk: Vk) -> Response[dict[str, str]]:
    """200 when the database answers (`degraded` when the spend ledger does not); 503 when
    the database does not, or once shutdown has begun (`draining`), so load balancers stop
    sending."""
    checked = await vk.readiness.check()
    return Response(
        {"status": checked.status, "database": checked.database, "ledger": checked.ledger},
        status_code=HTTP_200_OK if checked.ready else HTTP_503_SERVICE_UNAVAILABLE,
    )


@get("/metrics", include_in_schema=False, media_type=MediaType.TEXT)
async def metrics(vk: Vk, request: Request[Any, Any, Any]) -> bytes:
    wanted = vk.settings.metrics_token
    if wanted is not None:
        presented = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(presented.encode(), wanted.encode()):
            raise ApiError(
                ErrorCode.UNAUTHORIZED, "metrics need Authorization: Bearer <VKGATE_METRICS_TOKEN>"
            )
    return vk.metrics.render()


def create_app(
    settings: ControlPlaneSettings,
    *,
    clock: Clock | None = None,
    database: Database | None = None,
    ledger: Ledger | None = None,
    freeze_heap: bool = False,
) -> Litestar:
    """The app; a `database` or `ledger` given is the caller's to close, the others its own.

    `freeze_heap` (for the server's own process, never a test's) moves what start-up built out
    of the garbage collector's sight once the app has started (`gc.freeze`)."""
    db = database or Database(create_engine(settings.database_url))
    spend_ledger = ledger or Ledger(settings.ledger)
    notifier = FeedNotifier()
    app_clock = clock or SystemClock()
    lifecycle = Lifecycle(notifier=notifier, grace_s=settings.shutdown_grace_s)
    families = Metrics(
        waiting_polls=lambda: notifier.waiting, serving=lambda: not lifecycle.draining
    )
    state = AppState(
        settings=settings,
        db=db,
        clock=app_clock,
        cipher=Cipher(settings.encryption_key, previous=settings.encryption_keys_previous),
        hasher=Hasher(settings.key_pepper, previous=settings.key_peppers_previous),
        notifier=notifier,
        metrics=families,
        ledger=spend_ledger,
        pricer=Pricer(),
        lifecycle=lifecycle,
        readiness=ReadinessProbe(db=db, ledger=spend_ledger, draining=lambda: lifecycle.draining),
        auth_throttle=AdminAuthThrottle(
            settings.admin_auth_failures_per_minute,
            app_clock,
            trusted=[ipaddress.ip_network(cidr) for cidr in settings.trusted_proxy_cidrs],
        ),
        proxy_versions=ProxyVersions(vkgate.__version__, families.proxy_calls),
        readings=SpendReadings(db, app_clock.monotonic),
    )

    listener = (
        None
        if is_sqlite(settings.database_url)
        else PostgresFeedListener(settings.database_url, state.notifier)
    )

    async def start() -> None:
        lifecycle.hear_stop_signals()
        await asyncio.to_thread(Pricer.load)
        if listener is not None:
            await listener.start()
        if freeze_heap:
            # Start-up's objects (the ORM's, the web framework's, the price data's) live as
            # long as the process: frozen, a full collection no longer walks them. Spend
            # ingestion makes tens of thousands of objects a segment, and the collections they
            # set off were a sixth of the control plane's CPU under load.
            gc.collect()
            gc.freeze()

    async def close() -> None:
        # Reached without a stop signal too (the server stopping on its own, tests).
        lifecycle.drain("lifespan_shutdown")
        lifecycle.restore_signals()
        try:
            if listener is not None:
                await listener.stop()
            if database is None:
                await db.close()
            if ledger is None:
                await spend_ledger.close()
        finally:
            lifecycle.completed()

    admin = Router(path="/", route_handlers=ADMIN_CONTROLLERS, guards=[require_admin_token])
    sessions = ConsoleSessions(
        db,
        app_clock,
        idle=timedelta(minutes=settings.console_session_idle_minutes),
        env_token_hashes=(
            ()
            if settings.admin_token is None
            else state.hasher.candidates_of_secret(settings.admin_token)
        ),
    )
    app = Litestar(
        route_handlers=[admin, internal_router, console_router(), healthz, readyz, metrics],
        dependencies=DEPENDENCIES,
        exception_handlers=EXCEPTION_HANDLERS,
        template_config=console_templates(),
        state=State({"vk": state, "console_sessions": sessions}),
        on_startup=[start],
        on_shutdown=[close],
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="vkgate control plane",
            version=vkgate.__version__,
            path="/schema",
            components=Components(
                security_schemes={
                    "AdminToken": SecurityScheme(
                        type="http", scheme="bearer", description="An admin or finance token"
                    )
                }
            ),
            security=[{"AdminToken": []}],
            render_plugins=[SwaggerRenderPlugin()],
        ),
        on_app_init=[_quiet],
    )
    # Around the router rather than in each route's middleware stack: requests no route
    # matched are counted too.
    app.asgi_handler = RequestMetrics(app.asgi_handler, state.metrics)
    document_refusals(app)
    return app


def _quiet(config: AppConfig) -> AppConfig:
    # Litestar's own request logging would print request lines with query strings; ours does not.
    config.logging_config = None
    return config
