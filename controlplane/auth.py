"""Admin API authentication: bearer admin tokens with the `admin` or `finance` role, each
either unbound (every organization) or bound to one organization."""

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
from controlplane.rehash import rehash_token
from controlplane.state import AppState, app_state
from vkgate.errors import ErrorCode

ENV_TOKEN_ACTOR = "env"
READ_METHODS = frozenset({"GET", "HEAD"})
UNBOUND_ONLY = "unbound_only"
"""Handler opt: the route is for tokens bound to no organization (organizations, tokens)."""


class Role(StrEnum):
    ADMIN = "admin"
    FINANCE = "finance"


@dataclass(frozen=True, slots=True)
class Actor:
    id: str
    role: Role
    organization_id: str | None = None
    """Set, the token sees and changes only this organization's resources."""


async def require_admin_token(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """Guard: a valid token; `admin` for anything that changes state, `finance` reads.

    A handler may demand `admin` even for reads with `opt={"role": "admin"}`, and a token bound
    to no organization with `opt={UNBOUND_ONLY: True}`. An address that failed too often lately
    is answered 429 before its token is looked at (controlplane/throttle.py).
    """
    state = app_state(connection)
    address = state.auth_throttle.address(connection.scope)
    wait = state.auth_throttle.retry_after(address)
    if wait is not None:
        raise ApiError(
            ErrorCode.RATE_LIMITED,
            "too many failed admin authentications from this address; retry later",
            headers={"Retry-After": str(wait)},
        )
    actor, reason = await _authenticate(connection, state)
    if actor is None:
        state.metrics.admin_auth_failures.inc()
        state.auth_throttle.failed(address, reason)
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
    if actor.organization_id is not None and handler.opt.get(UNBOUND_ONLY):
        raise ApiError(
            ErrorCode.FORBIDDEN,
            "this needs an admin token bound to no organization; this one is bound to one",
        )
    connection.state.actor = actor


async def _authenticate(
    connection: ASGIConnection[Any, Any, Any, Any], state: AppState
) -> tuple[Actor | None, str]:
    """The token's actor, or None and why not (`missing`, `invalid` or `revoked`)."""
    header = connection.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None, "missing"
    return await actor_of_token(state, token)


async def actor_of_token(state: AppState, token: str) -> tuple[Actor | None, str]:
    """The actor a presented admin token stands for, or None and why not (`invalid` or
    `revoked`): the admin API's bearer tokens and the web console's sign-in both ask here."""
    configured = state.settings.admin_token
    if configured is not None and hmac.compare_digest(token.encode(), configured.encode()):
        return Actor(id=ENV_TOKEN_ACTOR, role=Role.ADMIN), ""
    # Looked up by its peppered hash: the presented text itself never reaches the database.
    # Under every pepper in force at once, while the pepper rotates (controlplane/rehash.py).
    hashes = state.hasher.candidates_of_secret(token)
    matches = (
        AdminToken.token_hash == hashes[0]
        if len(hashes) == 1
        else AdminToken.token_hash.in_(hashes)
    )
    async with state.read() as tx:
        row = await tx.session.scalar(select(AdminToken).where(matches))
    if row is None:
        return None, "invalid"
    if row.revoked_at is not None:
        return None, "revoked"
    if row.token_hash != hashes[0]:
        await rehash_token(
            state.db,
            token_id=row.id,
            old=row.token_hash,
            new=hashes[0],
            pepper_id=state.hasher.pepper_id,
        )
    return Actor(id=row.id, role=Role(row.role), organization_id=row.organization_id), ""
