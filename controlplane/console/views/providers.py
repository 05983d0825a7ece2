"""Providers: create and edit; a credential goes in and is never shown, only whether one is set."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, get, post
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template
from sqlalchemy import select

from controlplane.console import _choices
from controlplane.console._core import Form, convert, open_form, open_page, redirect
from controlplane.errors import invalid
from controlplane.models import Provider
from controlplane.providers import service
from controlplane.providers.routes import provider_read
from controlplane.providers.schemas import ProviderCreate, ProviderKind, ProviderUpdate
from controlplane.schemas import filtered, page

KINDS = [k.value for k in ProviderKind]
PRICE_HINT = "one model a line: model input_per_mtok output_per_mtok (USD per million tokens)"


def _prices(form: Form) -> dict[str, dict[str, str]] | None:
    """`gpt-4o-mini 0.15 0.6` lines into the API's price overrides."""
    text = form.raw("price_overrides").strip()
    if not text:
        return None
    prices: dict[str, dict[str, str]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 3:
            raise invalid(
                f"price overrides, line {number}: expected `model input output`, got {line!r}",
                param="price_overrides",
            )
        model, given_in, given_out = parts
        prices[model] = {"input_per_mtok": given_in, "output_per_mtok": given_out}
    return prices or None


def _lines(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def price_lines(overrides: dict[str, Any]) -> str:
    lines = []
    for model, price in overrides.items():
        if price.input_per_mtok is not None:
            lines.append(f"{model} {price.input_per_mtok} {price.output_per_mtok}")
    return "\n".join(lines)


@get("/providers")
async def providers(
    request: Request[Any, Any, Any],
    organization_id: FromQuery[str | None] = None,
    cursor: FromQuery[str | None] = None,
) -> Template:
    view = await open_page(request)
    query = filtered(select(Provider), {Provider.organization_id: organization_id or None})
    async with view.vk.read() as tx:
        rows, next_cursor = await page(tx, query, Provider.id, limit=50, cursor=cursor)
        orgs = await _choices.organizations(tx)
    return view.render(
        "providers.html",
        "providers",
        heading="Providers",
        rows=[provider_read(r) for r in rows],
        next_cursor=next_cursor,
        organizations=orgs,
        org_names=_choices.names(orgs),
        kinds=KINDS,
        price_hint=PRICE_HINT,
        chosen_org=organization_id or "",
    )


@post("/providers")
async def create_provider(request: Request[Any, Any, Any]) -> Redirect:
    view, form = await open_form(request)
    data = convert(
        {
            "organization_id": form.text("organization_id"),
            "name": form.text("name"),
            "kind": form.text("kind"),
            "base_url": form.text("base_url"),
            "api_key": form.text("api_key"),
            "api_version": form.text("api_version"),
            "price_overrides": _prices(form),
        },
        ProviderCreate,
    )
    async with view.vk.write(view.actor.id) as tx:
        await service.create(tx, view.vk.cipher, data)
    return redirect("/providers")


@get("/providers/{provider_id:str}")
async def edit_provider(request: Request[Any, Any, Any], provider_id: FromPath[str]) -> Template:
    view = await open_page(request)
    async with view.vk.read() as tx:
        read = provider_read(await tx.get(Provider, provider_id, "provider"))
    return view.render(
        "provider.html",
        "providers",
        heading=f"Provider {read.name}",
        provider=read,
        prices=price_lines(read.price_overrides),
        price_hint=PRICE_HINT,
    )


@post("/providers/{provider_id:str}")
async def update_provider(request: Request[Any, Any, Any], provider_id: FromPath[str]) -> Redirect:
    view, form = await open_form(request)
    fields: dict[str, Any] = {
        "name": form.text("name"),
        "base_url": form.text("base_url"),
        "api_version": form.text("api_version"),
    }
    # Only token prices are edited here: overrides left as shown keep every other rate.
    if _lines(form.raw("price_overrides")) != _lines(form.raw("prices_shown")):
        fields["price_overrides"] = _prices(form)
    # A blank credential field keeps the stored one (the page never holds it); the box
    # below it clears it.
    if form.text("api_key"):
        fields["api_key"] = form.text("api_key")
    elif form.text("clear_api_key"):
        fields["api_key"] = None
    data = convert(fields, ProviderUpdate)
    if data.name is None:
        data = msgspec.structs.replace(data, name=msgspec.UNSET)
    async with view.vk.write(view.actor.id) as tx:
        await service.update(tx, view.vk.cipher, provider_id, data)
    return redirect(f"/providers/{provider_id}")


HANDLERS = [providers, create_provider, edit_provider, update_provider]
