"""The console's router: its pages, its assets, its security headers and its error pages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from litestar import Request, Response, Router
from litestar.datastructures import ResponseHeader
from litestar.exceptions import HTTPException
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Redirect, Template
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from controlplane.console import _format
from controlplane.console._core import COOKIE, PREFIX, SignInRequired
from controlplane.console.views import (
    audit,
    budgets,
    keys,
    orgs,
    overview,
    policies,
    providers,
    signin,
    spend,
    tokens,
)
from controlplane.errors import ApiError
from vkgate.errors import ERRORS

HERE = Path(__file__).parent
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "object-src 'none'"
)
SECURITY_HEADERS = [
    ResponseHeader(name="Content-Security-Policy", value=CONTENT_SECURITY_POLICY),
    ResponseHeader(name="X-Frame-Options", value="DENY"),
    ResponseHeader(name="X-Content-Type-Options", value="nosniff"),
    ResponseHeader(name="Referrer-Policy", value="no-referrer"),
    ResponseHeader(name="Cross-Origin-Opener-Policy", value="same-origin"),
]


def console_templates() -> TemplateConfig[JinjaTemplateEngine]:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(_format.FILTERS)
    return TemplateConfig(engine=JinjaTemplateEngine.from_environment(environment))


def _sign_in(request: Request[Any, Any, Any], _: SignInRequired) -> Response[Any]:
    # A cookie with no live session behind it: the session ended (idle, signed out elsewhere,
    # its token revoked or changed), and the sign-in page says so.
    ended = bool(request.cookies.get(COOKIE))
    path = f"{PREFIX}/sign-in{'?ended=1' if ended else ''}"
    response: Response[Any]
    if request.headers.get("hx-request") == "true":
        # htmx would swap the sign-in page into a fragment: have it load the page instead.
        response = Response(b"", status_code=401, headers={"HX-Redirect": path})
    else:
        response = Redirect(path=path, status_code=303)
    if ended:
        response.delete_cookie(COOKIE, path=PREFIX)
    return response


def _error_page(status: int, message: str, headers: dict[str, str] | None = None) -> Template:
    return Template(
        template_name="error.html",
        context={"status": status, "message": message, "prefix": PREFIX},
        status_code=status,
        headers={"Cache-Control": "no-store", **(headers or {})},
    )


def _on_api_error(_: Request[Any, Any, Any], exc: ApiError) -> Template:
    return _error_page(ERRORS[exc.code].status, exc.message, exc.headers)


def _on_http(_: Request[Any, Any, Any], exc: HTTPException) -> Template:
    return _error_page(exc.status_code, str(exc.detail))


def console_router() -> Router:
    assets = create_static_files_router(
        path="/static",
        directories=[HERE / "static"],
        include_in_schema=False,
        cache_control=None,
        name="console_static",
    )
    return Router(
        path=PREFIX,
        route_handlers=[
            assets,
            *signin.HANDLERS,
            *overview.HANDLERS,
            *orgs.HANDLERS,
            *keys.HANDLERS,
            *providers.HANDLERS,
            *policies.HANDLERS,
            *budgets.HANDLERS,
            *spend.HANDLERS,
            *audit.HANDLERS,
            *tokens.HANDLERS,
        ],
        response_headers=SECURITY_HEADERS,
        exception_handlers={
            SignInRequired: _sign_in,
            ApiError: _on_api_error,
            HTTPException: _on_http,
        },
        include_in_schema=False,
    )
