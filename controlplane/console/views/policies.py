"""Routing policies: each alias an ordered fallback chain of provider:model, editable."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from litestar import Request, get, post
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template
from sqlalchemy import select

from controlplane.console import _choices
from controlplane.console._core import Form, convert, open_form, open_page, redirect
from controlplane.errors import invalid
from controlplane.models import Provider, RoutingPolicy
from controlplane.policies import service
from controlplane.policies.routes import policy_read
from controlplane.policies.schemas import PolicyCreate, PolicyUpdate, Target
from controlplane.schemas import filtered, page

ALIAS_HINT = (
    "one alias a line: alias = provider:model, provider:model … (the provider by name or id; "
    "tried in order)"
)


def _aliases(form: Form, providers: Sequence[Provider]) -> dict[str, list[dict[str, str]]]:
    """`fast = openai:gpt-4o-mini, backup:gpt-4o-mini` lines into the API's aliases."""
    by_name = {p.name: p.id for p in providers} | {p.id: p.id for p in providers}
    aliases: dict[str, list[dict[str, str]]] = {}
    for number, line in enumerate(form.raw("aliases").splitlines(), start=1):
        if not line.strip():
            continue
        alias, equals, chain = line.partition("=")
        if not equals or not alias.strip():
            raise invalid(
                f"aliases, line {number}: expected `alias = provider:model, …`, got {line!r}",
                param="aliases",
            )
        targets = []
        for step in chain.split(","):
            provider, colon, model = step.strip().partition(":")
            if not colon or not provider or not model:
                raise invalid(
                    f"aliases, line {number}: {step.strip()!r} is not provider:model",
                    param="aliases",
                )
            if provider not in by_name:
                raise invalid(
                    f"aliases, line {number}: no provider {provider!r} in this organization",
                    param="aliases",
                )
            targets.append({"provider_id": by_name[provider], "model": model})
        aliases[alias.strip()] = targets
    return aliases


def alias_lines(aliases: dict[str, list[Target]], names: dict[str, str]) -> str:
    return "\n".join(
        f"{alias} = "
        + ", ".join(f"{names.get(t.provider_id, t.provider_id)}:{t.model}" for t in chain)
        for alias, chain in aliases.items()
    )


async def _providers_of(view: Any, organization_id: str | None) -> Sequence[Provider]:
    async with view.vk.read() as tx:
        query = tx.scoped(select(Provider)).where(Provider.organization_id == organization_id)
        return list(await tx.session.scalars(query.order_by(Provider.name)))


@get("/policies")
async def policies(
    request: Request[Any, Any, Any],
    organization_id: FromQuery[str | None] = None,
    cursor: FromQuery[str | None] = None,
) -> Template:
    view = await open_page(request)
    query = filtered(
        select(RoutingPolicy), {RoutingPolicy.organization_id: organization_id or None}
    )
    async with view.vk.read() as tx:
        rows, next_cursor = await page(tx, query, RoutingPolicy.id, limit=50, cursor=cursor)
        reads = [await policy_read(tx, r) for r in rows]
        orgs = await _choices.organizations(tx)
        provider_rows = await _choices.providers(tx)
    names = _choices.names(provider_rows)
    return view.render(
        "policies.html",
        "policies",
        heading="Routing policies",
        rows=reads,
        next_cursor=next_cursor,
        organizations=orgs,
        org_names=_choices.names(orgs),
        provider_names=names,
        alias_hint=ALIAS_HINT,
        chosen_org=organization_id or "",
    )


@post("/policies")
async def create_policy(request: Request[Any, Any, Any]) -> Redirect:
    view, form = await open_form(request)
    organization_id = form.text("organization_id")
    providers = await _providers_of(view, organization_id)
    data = convert(
        {
            "organization_id": organization_id,
            "name": form.text("name"),
            "aliases": _aliases(form, providers),
        },
        PolicyCreate,
    )
    async with view.vk.write(view.actor.id) as tx:
        await service.create(tx, data)
    return redirect("/policies")


@get("/policies/{policy_id:str}")
async def edit_policy(request: Request[Any, Any, Any], policy_id: FromPath[str]) -> Template:
    view = await open_page(request)
    async with view.vk.read() as tx:
        read = await policy_read(tx, await tx.get(RoutingPolicy, policy_id, "routing policy"))
    providers = await _providers_of(view, read.organization_id)
    return view.render(
        "policy.html",
        "policies",
        heading=f"Routing policy {read.name}",
        policy=read,
        lines=alias_lines(read.aliases, _choices.names(providers)),
        providers=providers,
        alias_hint=ALIAS_HINT,
    )


@post("/policies/{policy_id:str}")
async def update_policy(request: Request[Any, Any, Any], policy_id: FromPath[str]) -> Redirect:
    view, form = await open_form(request)
    async with view.vk.read() as tx:
        row = await tx.get(RoutingPolicy, policy_id, "routing policy")
    providers = await _providers_of(view, row.organization_id)
    data = convert({"name": form.text("name"), "aliases": _aliases(form, providers)}, PolicyUpdate)
    async with view.vk.write(view.actor.id) as tx:
        await service.update_policy(tx, policy_id, data)
    return redirect(f"/policies/{policy_id}")


HANDLERS = [policies, create_policy, edit_policy, update_policy]
