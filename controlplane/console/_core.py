"""What every console page shares: its session, its CSRF check, its forms, its navigation."""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from litestar import Request
from litestar.datastructures import Cookie
from litestar.response import Redirect, Template

from controlplane.auth import Actor, Role
from controlplane.console.sessions import ConsoleSessions, Session
from controlplane.errors import ApiError, invalid
from controlplane.state import AppState, app_state
from vkgate.errors import ErrorCode

PREFIX = "/console"
COOKIE = "vkgate_console"
SIGNIN_COOKIE = "vkgate_console_signin"
"""Pairs the sign-in form with the browser that loaded it: a page elsewhere cannot sign a
visitor in under its own token."""
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
PAGE_SIZE = 50
CHOICES = 1000
"""At most this many organizations, teams or projects are offered in a form's list."""

T = TypeVar("T")

NAV: tuple[tuple[str, str, str], ...] = (
    # (key, label, path)
    ("overview", "Overview", ""),
    ("organizations", "Organizations", "/organizations"),
    ("teams", "Teams", "/teams"),
    ("projects", "Projects", "/projects"),
    ("keys", "Virtual keys", "/keys"),
    ("providers", "Providers", "/providers"),
    ("policies", "Routing policies", "/policies"),
    ("budgets", "Budgets", "/budgets"),
    ("spend", "Spend", "/spend"),
    ("audit", "Audit log", "/audit"),
    ("tokens", "Tokens", "/tokens"),
)


class SignInRequired(Exception):
    """No live session: the browser is sent to the sign-in page."""


def sessions(request: Request[Any, Any, Any]) -> ConsoleSessions:
    found: ConsoleSessions = request.app.state["console_sessions"]
    return found


@dataclass(frozen=True, slots=True)
class Page:
    """One request of a signed-in console: the state as its token may see it."""

    request: Request[Any, Any, Any]
    vk: AppState
    session: Session

    @property
    def actor(self) -> Actor:
        return self.session.actor

    @property
    def can_change(self) -> bool:
        return self.actor.role is Role.ADMIN

    @property
    def sees_tokens(self) -> bool:
        """Tokens are managed by an admin token bound to no organization, as in the API."""
        return self.can_change and self.actor.organization_id is None

    @property
    def partial(self) -> bool:
        """An htmx request for one part of the page (a filtered table), not the whole page."""
        headers = self.request.headers
        return headers.get("hx-request") == "true" and bool(headers.get("hx-target"))

    def render(
        self, template: str, active: str, status_code: int = 200, **context: Any
    ) -> Template:
        nav = [item for item in NAV if item[0] != "tokens" or self.sees_tokens]
        return Template(
            template_name=template,
            context={
                "nav": nav,
                "active": active,
                "prefix": PREFIX,
                "actor": self.actor,
                "can_change": self.can_change,
                "csrf_value": self.session.csrf_token,
                "error": None,
                **context,
            },
            status_code=status_code,
            headers={"Cache-Control": "no-store"},
        )

    def require_admin(self) -> None:
        if not self.can_change:
            raise ApiError(
                ErrorCode.FORBIDDEN, f"this needs the admin role; the token has {self.actor.role}"
            )


async def open_page(request: Request[Any, Any, Any]) -> Page:
    """The signed-in page of this request, or SignInRequired."""
    session = await sessions(request).find(request.cookies.get(COOKIE))
    if session is None:
        raise SignInRequired
    vk = app_state(request).scoped_to(session.actor.organization_id)
    return Page(request=request, vk=vk, session=session)


async def open_form(request: Request[Any, Any, Any], *, admin: bool = True) -> tuple[Page, Form]:
    """A POST's page and form, once its CSRF token matched (and, for a change, the role)."""
    page = await open_page(request)
    data = await request.form()
    presented = data.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
    if not page.session.csrf_matches(presented if isinstance(presented, str) else None):
        raise ApiError(
            ErrorCode.FORBIDDEN, "the form's CSRF token is missing or wrong; reload the page"
        )
    if admin:
        page.require_admin()
    return page, Form({k: v for k, v in data.multi_items() if isinstance(v, str)})


class Form:
    """A submitted form's text fields; blank fields count as left out."""

    def __init__(self, single: dict[str, str]) -> None:
        self._single = single

    def text(self, name: str) -> str | None:
        value = self._single.get(name, "").strip()
        return value or None

    def raw(self, name: str) -> str:
        return self._single.get(name, "")

    def integer(self, name: str, label: str) -> int | None:
        value = self.text(name)
        if value is None:
            return None
        if not value.isascii() or not value.isdigit():
            raise invalid(f"{label} must be a whole number, got {value!r}", param=name)
        return int(value)


def convert(data: dict[str, Any], kind: type[T]) -> T:
    """`data` as the admin API's own request type, checked by the same rules: a value the API
    would refuse is refused here with the field it concerns."""
    try:
        return msgspec.convert(data, kind, strict=False)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).partition(" - at `$.")
        field = where.rstrip("`") or None
        raise invalid(f"{field}: {message}" if field else message, param=field) from None


def redirect(path: str) -> Redirect:
    return Redirect(path=f"{PREFIX}{path}", status_code=303)


def signin_cookie(secure: bool) -> tuple[str, Cookie]:
    value = secrets.token_urlsafe(24)
    return value, Cookie(
        key=SIGNIN_COOKIE,
        value=value,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=secure,
        max_age=3600,
    )


def session_cookie(value: str, secure: bool) -> Cookie:
    # No max-age: the browser forgets it when closed; the server ends it after idling.
    return Cookie(
        key=COOKIE, value=value, path=PREFIX, httponly=True, samesite="strict", secure=secure
    )


def is_tls(request: Request[Any, Any, Any]) -> bool:
    """Whether the browser reached the console over TLS: directly, or through a trusted proxy
    (VKGATE_TRUSTED_PROXY_CIDRS) that says so in `X-Forwarded-Proto`."""
    if request.url.scheme == "https":
        return True
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    client = request.scope.get("client")
    if forwarded != "https" or not client:
        return False
    try:
        peer = ipaddress.ip_address(client[0])
    except ValueError:
        return False
    trusted = app_state(request).settings.trusted_proxy_cidrs
    return any(peer in ipaddress.ip_network(cidr) for cidr in trusted)
