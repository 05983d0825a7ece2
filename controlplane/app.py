"""The control plane's Litestar application: wiring only."""

from __future__ import annotations

import hmac
import logging
from typing import Any

from litestar import Litestar, MediaType, Request, Response, Router, get
from litestar.config.app import AppConfig
from litestar.datastructures import State
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme
from litestar.types import ControllerRouterHandler
from sqlalchemy import text

import vkgate
from controlplane.auth import require_admin_token
from controlplane.budgets.routes import BudgetController
from controlplane.db import Database, create_engine, is_sqlite
from controlplane.errors import EXCEPTION_HANDLERS, ApiError
from controlplane.feed.listener import PostgresFeedListener
from controlplane.feed.service import FeedNotifier
from controlplane.internal.routes import internal_router
from controlplane.keys.routes import VirtualKeyController
from controlplane.ledger.store import Ledger
from controlplane.metrics import Metrics
from controlplane.orgs.routes import OrganizationController, ProjectController, TeamController
from controlplane.policies.routes import RoutingPolicyController
from controlplane.providers.routes import ProviderController
from controlplane.schemas import DEPENDENCIES, Vk
from controlplane.security import Cipher, Hasher
from controlplane.settings import ControlPlaneSettings
from controlplane.spend.pricing import Pricer
from controlplane.spend.routes import SpendController
from controlplane.state import AppState
from controlplane.tokens.routes import AdminTokenController, audit_log
from vkgate.clock import Clock, SystemClock
from vkgate.errors import ErrorCode

log = logging.getLogger("vkgate.controlplane")

ADMIN_CONTROLLERS: list[ControllerRouterHandler] = [
    OrganizationController,
    TeamController,
    ProjectController,
    ProviderController,
    RoutingPolicyController,
    VirtualKeyController,
    BudgetController,
    AdminTokenController,
    SpendController,
    audit_log,
]


@get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz", include_in_schema=False)
async def readyz(vk: Vk) -> Response[dict[str, str]]:
    try:
        async with vk.read() as tx:
            await tx.session.execute(text("SELECT 1"))
    except Exception:  # any failure to reach the database means not ready
        log.warning("readiness check: database unreachable")
        return Response({"status": "database unreachable"}, status_code=503)
    return Response({"status": "ok"})


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
) -> Litestar:
    """The app; a `database` or `ledger` given is the caller's to close, the others its own."""
    db = database or Database(create_engine(settings.database_url))
    spend_ledger = ledger or Ledger(settings.ledger)
    notifier = FeedNotifier()
    state = AppState(
        settings=settings,
        db=db,
        clock=clock or SystemClock(),
        cipher=Cipher(settings.encryption_key),
        hasher=Hasher(settings.key_pepper),
        notifier=notifier,
        metrics=Metrics(waiting_polls=lambda: notifier.waiting),
        ledger=spend_ledger,
        pricer=Pricer(),
    )

    listener = (
        None
        if is_sqlite(settings.database_url)
        else PostgresFeedListener(settings.database_url, state.notifier)
    )

    async def start_listener() -> None:
        if listener is not None:
            await listener.start()

    async def close() -> None:
        if listener is not None:
            await listener.stop()
        if database is None:
            await db.close()
        if ledger is None:
            await spend_ledger.close()

    admin = Router(path="/", route_handlers=ADMIN_CONTROLLERS, guards=[require_admin_token])
    return Litestar(
        route_handlers=[admin, internal_router, healthz, readyz, metrics],
        dependencies=DEPENDENCIES,
        exception_handlers=EXCEPTION_HANDLERS,
        state=State({"vk": state}),
        on_startup=[start_listener],
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


def _quiet(config: AppConfig) -> AppConfig:
    # Litestar's own request logging would print request lines with query strings; ours does not.
    config.logging_config = None
    return config
