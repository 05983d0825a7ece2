"""Guard: every internal API request is HMAC-signed and fresh, or it gets 401 and is counted."""

from __future__ import annotations

import logging
from typing import Any, cast

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from controlplane.errors import ApiError
from controlplane.state import app_state
from vkgate import signing
from vkgate.errors import ErrorCode
from vkgate.logs import event
from vkgate.wire import VERSION_HEADER

log = logging.getLogger("vkgate.controlplane.internal")


def path_and_query(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    scope = connection.scope
    raw = scope.get("raw_path")
    # Some servers leave the query on raw_path; the ASGI spec says it has none.
    path = raw.decode("latin-1").partition("?")[0] if raw else scope["path"]
    query = scope.get("query_string", b"")
    return f"{path}?{query.decode('latin-1')}" if query else path


async def require_signature(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    state = app_state(connection)
    request = cast(Request[Any, Any, Any], connection)

    def verify(body: bytes) -> signing.SignatureProblem | None:
        return signing.verify(
            state.settings.internal_secret,
            request.method,
            path_and_query(connection),
            body,
            connection.headers.get(signing.TIMESTAMP_HEADER),
            connection.headers.get(signing.SIGNATURE_HEADER),
            state.clock.time(),
            previous=state.settings.internal_secrets[1:],
        )

    # Missing, malformed and stale headers are refused before the body is read: a spend segment
    # may be 128 MiB, which an unsigned or replayed-too-late request must not make us buffer.
    # Whatever that first look says of the signature, it is checked against the real body.
    problem = verify(b"")
    if problem is None or problem is signing.SignatureProblem.MISMATCH:
        problem = verify(await request.body())
    if problem is None:
        state.proxy_versions.heard(connection.headers.get(VERSION_HEADER))
        return
    state.metrics.internal_auth_failures.labels(problem.value).inc()
    event(
        log,
        "internal_auth_refused",
        level=logging.WARNING,
        reason=problem.value,
        method=request.method,
        # The template, not the path: a config path carries a key's id.
        route=connection.scope.get("path_template") or connection.scope["path"],
    )
    raise ApiError(ErrorCode.BAD_SIGNATURE, f"internal API signature refused: {problem.value}")
