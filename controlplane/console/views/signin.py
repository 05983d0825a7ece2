"""Signing in with an admin token, and out again."""

from __future__ import annotations

import hmac
from typing import Any

from litestar import Request, get, post
from litestar.response import Redirect, Template

from controlplane.auth import actor_of_token
from controlplane.console._core import (
    COOKIE,
    CSRF_FIELD,
    PREFIX,
    SIGNIN_COOKIE,
    is_tls,
    open_form,
    session_cookie,
    sessions,
    signin_cookie,
)
from controlplane.errors import ApiError
from controlplane.state import app_state
from vkgate.errors import ErrorCode

REFUSED = "Sign-in failed."
"""Said of every refused token alike: which tokens exist is not for a stranger to learn."""


ENDED = "Your session ended: it sat idle too long, was signed out, or its token was revoked or changed. Sign in again."


def _form(request: Request[Any, Any, Any], status: int = 200, error: str | None = None) -> Template:
    value, cookie = signin_cookie(is_tls(request))
    notice = ENDED if error is None and request.query_params.get("ended") == "1" else None
    return Template(
        template_name="signin.html",
        context={"prefix": PREFIX, "signin_token": value, "error": error, "notice": notice},
        status_code=status,
        cookies=[cookie],
        headers={"Cache-Control": "no-store"},
    )


@get("/sign-in", name="console_sign_in")
async def sign_in_form(request: Request[Any, Any, Any]) -> Template:
    return _form(request)


@post("/sign-in", status_code=303)
async def sign_in(request: Request[Any, Any, Any]) -> Template | Redirect:
    state = app_state(request)
    throttle = state.auth_throttle
    address = throttle.address(request.scope)
    wait = throttle.retry_after(address)
    if wait is not None:
        raise ApiError(
            ErrorCode.RATE_LIMITED,
            "too many failed sign-ins from this address; try again later",
            headers={"Retry-After": str(wait)},
        )
    data = await request.form()
    presented = data.get(CSRF_FIELD)
    expected = request.cookies.get(SIGNIN_COOKIE)
    if (
        not isinstance(presented, str)
        or not expected
        or not hmac.compare_digest(presented.encode(), expected.encode())
    ):
        return _form(request, 403, "The sign-in form expired; please try again.")
    token = data.get("token")
    actor, reason = (None, "missing")
    if isinstance(token, str) and token.strip():
        actor, reason = await actor_of_token(state, token.strip())
    if actor is None:
        state.metrics.admin_auth_failures.inc()
        throttle.failed(address, reason)
        return _form(request, 401, REFUSED)
    # A session this browser already had ends here: one sign-in, one session.
    await sessions(request).close(request.cookies.get(COOKIE))
    session_id = await sessions(request).open(actor)
    response = Redirect(path=f"{PREFIX}/", status_code=303)
    response.set_cookie(session_cookie(session_id, is_tls(request)))
    response.delete_cookie(SIGNIN_COOKIE, path=PREFIX)
    return response


@post("/sign-out", status_code=303)
async def sign_out(request: Request[Any, Any, Any]) -> Redirect:
    await open_form(request, admin=False)
    await sessions(request).close(request.cookies.get(COOKIE))
    response = Redirect(path=f"{PREFIX}/sign-in", status_code=303)
    response.delete_cookie(COOKIE, path=PREFIX)
    return response


HANDLERS = [sign_in_form, sign_in, sign_out]
