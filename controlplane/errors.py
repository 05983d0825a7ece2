"""The control plane's one error tree, and its renderer into `{"error": {...}}`."""

from __future__ import annotations

import logging
import re
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError

from controlplane.ledger.client import LedgerError
from vkgate.errors import ERRORS, ErrorCode
from vkgate.logs import event
from vkgate.spend import SPEND_COMMANDS_PATH
from vkgate.wire import ErrorBody, ErrorDetail

log = logging.getLogger("vkgate.controlplane")


class ApiError(Exception):
    """An answer that is not a success; status and `type` come from the code's table row."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers or {}


def not_found(kind: str, ident: str, *, param: str | None = None) -> ApiError:
    return ApiError(ErrorCode.NOT_FOUND, f"{kind} {ident!r} not found", param=param)


def conflict(message: str, *, param: str | None = None) -> ApiError:
    return ApiError(ErrorCode.CONFLICT, message, param=param)


def invalid(message: str, *, param: str | None = None) -> ApiError:
    return ApiError(ErrorCode.VALIDATION_ERROR, message, param=param)


def render(error: ApiError) -> Response[bytes]:
    kind = ERRORS[error.code]
    body = ErrorBody(
        ErrorDetail(
            message=error.message, type=kind.openai_type, code=error.code, param=error.param
        )
    )
    return Response(
        msgspec.json.encode(body),
        status_code=kind.status,
        media_type="application/json",
        headers=error.headers,
    )


def _on_api_error(_: Request[Any, Any, Any], exc: ApiError) -> Response[bytes]:
    return render(exc)


_BACKTICKED = re.compile(r"`([^`]+)`")
_MISSING_PARAMETER = re.compile(r"Missing required (query|header|cookie) parameter '([^']+)'")


def _on_validation(_: Request[Any, Any, Any], exc: ValidationException) -> Response[bytes]:
    """Litestar's body and query validation, re-told with the offending field as `param`."""
    extra = exc.extra if isinstance(exc.extra, list) else []
    missing = _MISSING_PARAMETER.match(exc.detail)
    if not extra and missing:
        where, name = missing.groups()
        return render(
            ApiError(
                ErrorCode.VALIDATION_ERROR,
                f"the {where} parameter {name!r} is required",
                param=name,
            )
        )
    if not extra:
        return render(ApiError(ErrorCode.INVALID_REQUEST, f"malformed JSON body: {exc.detail}"))
    first = extra[0] if isinstance(extra[0], dict) else {}
    message = str(first.get("message", exc.detail))
    key = str(first.get("key", "")) or None
    if key == "data" and message == "'data'":
        # Litestar reports an empty body as a KeyError on `data`: no JSON at all, so a 400.
        return render(ApiError(ErrorCode.INVALID_REQUEST, "a JSON request body is required"))
    if key == "data":
        key = None
    named = _BACKTICKED.search(message)
    if ("unknown field" in message or "missing required field" in message) and named:
        key = f"{key}.{named.group(1)}" if key else named.group(1)
    where = f" (at {key})" if key else ""
    return render(ApiError(ErrorCode.VALIDATION_ERROR, f"{message}{where}", param=key))


_STATUS_CODES = {
    401: ErrorCode.UNAUTHORIZED,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
}


def _on_http(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    code = _STATUS_CODES.get(exc.status_code, ErrorCode.INVALID_REQUEST)
    if exc.status_code >= 500:
        code = ErrorCode.INTERNAL_ERROR
    message = exc.detail
    if exc.status_code == 400:
        message = f"malformed request: {exc.detail}"
    if code is ErrorCode.PAYLOAD_TOO_LARGE:
        message = "request body is larger than VKGATE_CONTROLPLANE_MAX_BODY_BYTES"
        if request.url.path.endswith(SPEND_COMMANDS_PATH):
            message = "spend segment is larger than the control plane takes (128 MiB)"
    return render(ApiError(code, message))


def _on_integrity(request: Request[Any, Any, Any], exc: IntegrityError) -> Response[bytes]:
    # Services check uniqueness first; this is the race where two writers pass that check.
    event(
        log,
        "integrity_conflict",
        route=_route(request),
        method=request.method,
        cause=type(exc.orig).__name__,
    )
    return render(conflict("the change conflicts with an existing resource"))


def _on_ledger(request: Request[Any, Any, Any], exc: LedgerError) -> Response[bytes]:
    # A ledger outage is not a bug of this request: said plainly, without a stack trace.
    state = request.app.state.get("vk")
    if state is not None:
        state.metrics.ledger_errors.inc()
    event(
        log,
        "ledger_unavailable",
        level=logging.ERROR,
        route=_route(request),
        method=request.method,
        cause=exc.cause,
    )
    return render(unavailable(f"the spend ledger is unavailable: {exc}"))


_TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "53", "57"})
"""PostgreSQL's connection exceptions, insufficient resources, operator intervention (a
shutdown or restart): gone when the server is back."""
_TRANSIENT_WORDS = ("connection", "server closed", "locked", "busy", "unable to open")


def transient(exc: DBAPIError) -> bool:
    """Whether the database failing this way will likely serve a retry (it restarts, fails
    over, or is busy); a missing table or a broken query will not."""
    if exc.connection_invalidated or isinstance(exc, InterfaceError):
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate:
        return str(sqlstate)[:2] in _TRANSIENT_SQLSTATE_CLASSES
    text = str(exc.orig).lower()
    return any(word in text for word in _TRANSIENT_WORDS)


def _on_database(request: Request[Any, Any, Any], exc: DBAPIError) -> Response[bytes]:
    if not transient(exc):
        return _on_unexpected(request, exc)
    # The database went away (a restart, a failover, a network cut): a retry will do, and the
    # connection pool checks its connections before handing them out again.
    event(
        log,
        "database_unavailable",
        level=logging.ERROR,
        route=_route(request),
        method=request.method,
        cause=type(exc.orig).__name__,
    )
    return render(unavailable("the database is unavailable; retry shortly"))


def unavailable(message: str) -> ApiError:
    return ApiError(ErrorCode.STORE_UNAVAILABLE, message, headers={"Retry-After": "1"})


def _route(request: Request[Any, Any, Any]) -> str:
    """The route's template (`/api/admin/teams/{team_id}`): a path may carry ids."""
    template: str = request.scope.get("path_template") or "unmatched"
    return template


def _on_unexpected(_: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    log.exception("unhandled error", exc_info=exc)
    return Response(
        msgspec.json.encode(
            ErrorBody(ErrorDetail("internal error", "api_error", ErrorCode.INTERNAL_ERROR))
        ),
        status_code=HTTP_500_INTERNAL_SERVER_ERROR,
        media_type="application/json",
    )


EXCEPTION_HANDLERS: dict[type[Exception] | int, Any] = {
    ApiError: _on_api_error,
    ValidationException: _on_validation,
    HTTPException: _on_http,
    IntegrityError: _on_integrity,
    LedgerError: _on_ledger,
    OperationalError: _on_database,
    InterfaceError: _on_database,
    Exception: _on_unexpected,
}
