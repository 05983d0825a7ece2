"""Admin and finance tokens (an admin token bound to no organization only): create, revoke."""

from __future__ import annotations

from typing import Any

from litestar import Request, get, post
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template
from sqlalchemy import select

from controlplane.auth import Role
from controlplane.console import _choices
from controlplane.console._core import Page, convert, open_form, open_page, redirect
from controlplane.errors import ApiError
from controlplane.models import AdminToken
from controlplane.schemas import page
from controlplane.tokens import service
from controlplane.tokens.routes import TokenCreate, token_read
from vkgate.errors import ErrorCode


def _require_tokens(view: Page) -> None:
    view.require_admin()
    if not view.sees_tokens:
        raise ApiError(
            ErrorCode.FORBIDDEN,
            "this needs an admin token bound to no organization; this one is bound to one",
        )


@get("/tokens")
async def tokens(request: Request[Any, Any, Any], cursor: FromQuery[str | None] = None) -> Template:
    view = await open_page(request)
    _require_tokens(view)
    async with view.vk.read() as tx:
        rows, next_cursor = await page(
            tx, select(AdminToken), AdminToken.id, limit=50, cursor=cursor
        )
        orgs = await _choices.organizations(tx)
    return view.render(
        "tokens.html",
        "tokens",
        heading="Tokens",
        rows=[token_read(r) for r in rows],
        next_cursor=next_cursor,
        organizations=orgs,
        org_names=_choices.names(orgs),
        roles=[r.value for r in Role],
        created=None,
    )


@post("/tokens", status_code=200)
async def create_token(request: Request[Any, Any, Any]) -> Template:
    view, form = await open_form(request)
    _require_tokens(view)
    data = convert(
        {
            "name": form.text("name"),
            "role": form.text("role"),
            "organization_id": form.text("organization_id"),
        },
        TokenCreate,
    )
    async with view.vk.write(view.actor.id) as tx:
        row, token = await service.create(tx, view.vk.hasher, data)
    return view.render(
        "token_secret.html", "tokens", heading="Token created", token=token, row=token_read(row)
    )


@post("/tokens/{token_id:str}/revoke")
async def revoke_token(request: Request[Any, Any, Any], token_id: FromPath[str]) -> Redirect:
    view, _ = await open_form(request)
    _require_tokens(view)
    async with view.vk.write(view.actor.id) as tx:
        await service.revoke(tx, token_id)
    return redirect("/tokens")


HANDLERS = [tokens, create_token, revoke_token]
