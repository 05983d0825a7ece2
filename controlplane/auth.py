"""Admin API authentication: bearer admin tokens with the `admin` or `finance` role."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from sqlalchemy import select

from controlplane.errors import ApiError
from controlplane.models import AdminToken
from controlplane.state import AppState, app_state
from vkgate.errors import ErrorCode

ENV_TOKEN_ACTOR = "env"
READ_METHODS = frozenset({"GET", "HEAD"})


class Role(StrEnum):
    ADMIN = "admin"
    FINANCE = "finance"


@dataclass(frozen=True, slots=True)
class Actor:
    id: str
    role: Role


async def require_admin_token(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """Guard: a valid token; `admin` for anything that changes state, `finance` reads.

    A handler may demand `admin` even for reads with `opt={"role": "admin"}`.
    """
    state = app_state(connection)
    actor = await _authenticate(connection, state)
    if actor is None:
        state.metrics.admin_auth_failures.inc()
        raise ApiError(
            ErrorCode.UNAUTHORIZED,
            "missing or invalid admin token (Authorization: Bearer <token>)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    method = cast(Request[Any, Any, Any], connection).method
    needs_admin = method not in READ_METHODS or handler.opt.get("role") == "admin"
    if needs_admin and actor.role is not Role.ADMIN:
        raise ApiError(
            ErrorCode.FORBIDDEN, f"this needs the admin role; the token has {actor.role}"
        )
    connection.state.actor = actor


async def _authenticate(
    connection: ASGIConnection[Any, Any, Any, Any], state: AppState
) -> Actor | None:
    header = connection.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    configured = state.settings.admin_token
    if configured is not None and hmac.compare_digest(token.encode(), configured.encode()):
        return Actor(id=ENV_TOKEN_ACTOR, role=Role.ADMIN)
    token_hash = state.hasher.of_secret(token)
    async with state.read() as tx:
        row = await tx.session.scalar(select(AdminToken).where(AdminToken.token_hash == token_hash))
    if row is None or row.revoked_at is not None:
        return None
    return Actor(id=row.id, role=Role(row.role))
